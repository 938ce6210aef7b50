//! `treegrpo.Engine`: the library's engine (its own thread, batched decode over the
//! forking KV cache) with blocking and asyncio calls, and `treegrpo.Generation`.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use pyo3::prelude::*;
use pyo3::types::{PyDict, PyList};
use tokio::task::JoinSet;
use treegrpo::engine::{Engine, EngineConfig, GenParams, Generation, OwnedSeq};
use treegrpo::model::{LoadedModel, Model, TokenId};

use crate::awaitable::spawn_awaitable;
use crate::convert;
use crate::errors::{engine_error, model_error, value_error};
use crate::runtime::wait;
use crate::sampling::{
    alternatives, finish_reason, stop_reason_name, verl_stop_reason, Extensions, SamplingArgs,
};
use crate::session::Session;
use crate::state_dict;
use crate::tokenizer::Tokenizer;

/// What errors about a state dict's tensors name as their source (there is no file).
const STATE_DICT: &str = "<state dict>";

/// The inference engine: a model, its paged KV cache and the scheduler batching every
/// sequence's next token into one forward.
#[pyclass(module = "treegrpo._treegrpo", name = "Engine", frozen)]
pub struct PyEngine {
    pub(crate) engine: Engine,
    /// Where the model came from (the default model's cached file when none was named).
    pub(crate) model_path: PathBuf,
    /// The seed of calls that name none.
    pub(crate) seed: u64,
}

impl PyEngine {
    pub(crate) fn model(&self) -> &Arc<LoadedModel> {
        self.engine.model()
    }

    pub(crate) fn eos(&self) -> Vec<TokenId> {
        self.model().tokenizer.eos_ids().to_vec()
    }
}

#[pymethods]
impl PyEngine {
    #[new]
    #[pyo3(signature = (model=None, kv_mib=1024, max_batch_seqs=64, seed=0))]
    fn new(
        py: Python<'_>,
        model: Option<PathBuf>,
        kv_mib: usize,
        max_batch_seqs: usize,
        seed: u64,
    ) -> PyResult<Self> {
        if kv_mib == 0 {
            return Err(value_error("kv_mib must be at least 1"));
        }
        if max_batch_seqs == 0 {
            return Err(value_error("max_batch_seqs must be at least 1"));
        }
        let (model_path, loaded) = py
            .detach(|| {
                let path =
                    treegrpo::model::fetch::model_path_or_default(model.as_deref(), &mut |m| {
                        eprintln!("{m}")
                    })?;
                let loaded = LoadedModel::load(&path)?;
                Ok((path, loaded))
            })
            .map_err(model_error)?;
        let config = EngineConfig {
            kv_budget_bytes: kv_mib << 20,
            max_batch_seqs,
            ..EngineConfig::default()
        };
        let engine = Engine::start(Arc::new(loaded), config).map_err(engine_error)?;
        Ok(PyEngine {
            engine,
            model_path,
            seed,
        })
    }

    /// The model file or folder the engine loaded.
    #[getter]
    fn model_path(&self) -> PathBuf {
        self.model_path.clone()
    }

    /// The engine's tokenizer and chat template.
    #[getter]
    fn tokenizer(&self) -> Tokenizer {
        Tokenizer::new(self.model().clone())
    }

    /// Generates a completion of each prompt (texts or token-id lists), all batched
    /// together; returns one `Generation` per prompt, in order.
    /// vLLM's extensions: `min_p`, `repetition_penalty`, `presence_penalty`,
    /// `frequency_penalty`, `logprobs=N` for each token's N most likely
    /// alternatives (`Generation.top_logprobs`), and `min_tokens` (fewest tokens
    /// before a stop token or string may end a generation).
    #[pyo3(signature = (prompts, max_tokens=256, temperature=0.0, top_p=None, top_k=None, stop=None, seed=None, *, min_p=None, repetition_penalty=1.0, presence_penalty=0.0, frequency_penalty=0.0, logprobs=0, min_tokens=0))]
    #[allow(clippy::too_many_arguments)]
    fn generate(
        &self,
        py: Python<'_>,
        prompts: &Bound<'_, PyAny>,
        max_tokens: usize,
        temperature: f64,
        top_p: Option<f64>,
        top_k: Option<i64>,
        stop: Option<&Bound<'_, PyAny>>,
        seed: Option<u64>,
        min_p: Option<f64>,
        repetition_penalty: f64,
        presence_penalty: f64,
        frequency_penalty: f64,
        logprobs: usize,
        min_tokens: usize,
    ) -> PyResult<Vec<PyGeneration>> {
        let prompts = convert::prompts(self.model(), prompts)?;
        if prompts.is_empty() {
            return Ok(Vec::new());
        }
        let args = SamplingArgs::from_args(max_tokens, temperature, top_p, top_k, stop, seed)?
            .with_extensions(Extensions {
                min_p,
                repetition_penalty,
                presence_penalty,
                frequency_penalty,
                logprobs,
                min_tokens,
            });
        let eos = self.eos();
        let jobs: Vec<(Vec<TokenId>, GenParams)> = prompts
            .into_iter()
            .enumerate()
            .map(|(i, p)| Ok((p, args.params(self.seed, i as u64, &eos)?)))
            .collect::<PyResult<_>>()?;
        let engine = self.engine.clone();
        let generations = wait(py, async move { generate_all(&engine, jobs).await })?;
        generations
            .into_iter()
            .map(|g| PyGeneration::new(self.model(), g))
            .collect()
    }

    /// verl's rollout-server call (verl 0.9.1's vLLM and SGLang servers'
    /// `generate`): `await engine.agenerate(prompt_ids, sampling_params, request_id)`,
    /// or all by keyword as verl's `LLMServerClient` calls it, → a
    /// `treegrpo.adapters.TokenOutput` (`token_ids`, `log_probs`, `routed_experts`,
    /// `stop_reason`, `num_preempted`, `extra_fields`). Calls made at once from many
    /// asyncio tasks share the engine's batches. `image_data` and `video_data` must be
    /// None: the engine is text-only.
    #[pyo3(signature = (prompt_ids, sampling_params=None, request_id=None, *, image_data=None, video_data=None))]
    fn agenerate<'py>(
        &self,
        py: Python<'py>,
        prompt_ids: &Bound<'py, PyAny>,
        sampling_params: Option<&Bound<'py, PyDict>>,
        request_id: Option<String>,
        image_data: Option<&Bound<'py, PyAny>>,
        video_data: Option<&Bound<'py, PyAny>>,
    ) -> PyResult<Bound<'py, PyAny>> {
        for (name, data) in [("image_data", image_data), ("video_data", video_data)] {
            if data.is_some_and(|d| !d.is_none()) {
                return Err(value_error(format!(
                    "{name}: this engine serves a text-only model; pass None \
                     (multi-modal prompts are not supported)"
                )));
            }
        }
        let ids = convert::token_ids(prompt_ids)?;
        let args = SamplingArgs::from_dict(sampling_params, 256)?;
        // The request id seeds the request's RNG stream, so a retried request
        // samples what it sampled before.
        let index = request_id.as_deref().map_or(0, stable_hash);
        let params = args.params(self.seed, index, &self.eos())?;
        let engine = self.engine.clone();
        spawn_awaitable(
            py,
            async move {
                let mut done = generate_all(&engine, vec![(ids, params)]).await?;
                Ok(done.remove(0))
            },
            token_output,
        )
    }

    /// A fork session over `prompt_ids`: generate, append, fork into sessions that
    /// share its cached prefix.
    fn session(&self, py: Python<'_>, prompt_ids: &Bound<'_, PyAny>) -> PyResult<Session> {
        let ids = convert::prompt_ids(self.model(), prompt_ids)?;
        let engine = self.engine.clone();
        let owned = wait(py, async move {
            OwnedSeq::add(&engine, ids).await.map_err(engine_error)
        })?;
        Ok(Session::new(self.engine.clone(), self.seed, owned))
    }

    /// Serves the weights of a checkpoint (an HF folder or a GGUF file) from now on;
    /// returns the new weight version: `version` when given (it must be above the
    /// served one: a pool of replicas names one policy by one number), else the next.
    /// Generations in flight finish on the old weights first; nothing cached under the
    /// old weights is reused.
    #[pyo3(signature = (path, version=None))]
    fn load_weights(&self, py: Python<'_>, path: PathBuf, version: Option<u64>) -> PyResult<u64> {
        let engine = self.engine.clone();
        wait(py, async move {
            engine
                .load_weights_from_as(&path, version)
                .await
                .map_err(engine_error)
        })
    }

    /// Serves the weights of a state dict from now on, as [`Self::load_weights`] serves
    /// a checkpoint's: `state` maps HF parameter names (`model.layers.0.mlp.up_proj.weight`,
    /// what a transformers model's `state_dict()` holds) to torch tensors or numpy arrays
    /// of any float dtype, read from memory (no file). An unknown or missing name, a
    /// wrong shape or a tied `lm_head.weight` that is not the embedding is a
    /// `ValueError` naming the tensor, and the engine serves on as before.
    #[pyo3(signature = (state, version=None))]
    fn load_state_dict(
        &self,
        py: Python<'_>,
        state: &Bound<'_, PyAny>,
        version: Option<u64>,
    ) -> PyResult<u64> {
        let served = &self.model().model;
        let config = served.config().clone();
        let precision = served.precision();
        let tensors = state_dict::tensors(state, config.tie_word_embeddings)?;
        let model = py
            .detach(|| {
                let model = Model::from_hf_state_dict(config, tensors, Path::new(STATE_DICT))?;
                // Served at the engine's precision, as `load_weights` serves a file.
                if model.serves_at(precision) {
                    Ok(model)
                } else {
                    model.at_precision(precision)
                }
            })
            .map_err(model_error)?;
        let (engine, weights) = (self.engine.clone(), Arc::new(model));
        wait(py, async move {
            match version {
                Some(v) => engine.load_weights_as(weights, v).await,
                None => engine.load_weights(weights).await,
            }
            .map_err(engine_error)
        })
    }

    /// The version of the weights served now (0: those the engine started with).
    #[getter]
    fn weight_version(&self, py: Python<'_>) -> PyResult<u64> {
        let engine = self.engine.clone();
        wait(py, async move {
            Ok(engine.stats().await.map_err(engine_error)?.weight_version)
        })
    }

    /// Forgets every cached prefix (live sequences keep theirs).
    fn reset_prefix_cache(&self, py: Python<'_>) -> PyResult<()> {
        let engine = self.engine.clone();
        wait(py, async move {
            engine.clear_prefix_cache().await.map_err(engine_error)
        })
    }

    /// The engine's counters (tokens prefilled, decoded, reused), KV pool, live
    /// sequences, weight version and step latencies, as a dict.
    fn stats<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        let engine = self.engine.clone();
        let stats = wait(
            py,
            async move { engine.stats().await.map_err(engine_error) },
        )?;
        let out = convert::to_python(py, &stats)?;
        out.set_item("computed", stats.counters.computed())?;
        out.set_item("reused", stats.counters.reused())?;
        Ok(out)
    }

    fn __repr__(&self) -> String {
        format!("Engine(model={:?})", self.model_path.display().to_string())
    }
}

/// Generates every job concurrently (one engine batch), results in job order. Each
/// job's sequence is freed at its end, or released if the work is dropped.
pub(crate) async fn generate_all(
    engine: &Engine,
    jobs: Vec<(Vec<TokenId>, GenParams)>,
) -> PyResult<Vec<Generation>> {
    let mut set = JoinSet::new();
    let n = jobs.len();
    for (i, (prompt, params)) in jobs.into_iter().enumerate() {
        let engine = engine.clone();
        set.spawn(async move {
            let seq = OwnedSeq::add(&engine, prompt).await?;
            let generation = engine.generate(seq.id(), params).await;
            seq.free().await?;
            Ok::<_, treegrpo::engine::EngineError>((i, generation?))
        });
    }
    let mut out: Vec<Option<Generation>> = (0..n).map(|_| None).collect();
    while let Some(joined) = set.join_next().await {
        let (i, g) = joined
            .map_err(|e| pyo3::exceptions::PyRuntimeError::new_err(e.to_string()))?
            .map_err(engine_error)?;
        out[i] = Some(g);
    }
    Ok(out.into_iter().flatten().collect())
}

/// A finished generation as verl's `TokenOutput` (the Python dataclass
/// `treegrpo.adapters.TokenOutput`, so it pickles across Ray and its
/// `extra_fields` is a dict verl's agent loop can add to). `stop_reason` is
/// `"completed"` for every way our generation ends, as verl's vLLM server maps
/// vLLM's `stop` and `length` (`"aborted"` is a request cut by a weight sync; ours
/// finish on the old weights instead). `num_preempted`: the times the request's
/// sequence was preempted (its KV dropped and recomputed) while it generated.
/// `extra_fields` carries the
/// weight version and the finish reason in vLLM's words (`stop`, `length`).
fn token_output(py: Python<'_>, g: Generation) -> PyResult<Bound<'_, PyAny>> {
    let extra = PyDict::new(py);
    extra.set_item("weight_version", g.weight_version)?;
    extra.set_item("finish_reason", finish_reason(g.stop))?;
    let fields = PyDict::new(py);
    fields.set_item("token_ids", PyList::new(py, &g.tokens)?)?;
    fields.set_item("log_probs", PyList::new(py, &g.logprobs)?)?;
    fields.set_item("routed_experts", py.None())?;
    fields.set_item("stop_reason", verl_stop_reason(g.stop))?;
    fields.set_item("num_preempted", g.preemptions)?;
    fields.set_item("extra_fields", extra)?;
    py.import("treegrpo.adapters")?
        .getattr("TokenOutput")?
        .call((), Some(&fields))
}

/// FNV-1a of a request id: a seed word that is the same in every process.
fn stable_hash(s: &str) -> u64 {
    s.bytes().fold(0xcbf2_9ce4_8422_2325, |h, b| {
        (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3)
    })
}

/// One finished generation.
#[pyclass(module = "treegrpo._treegrpo", name = "Generation", frozen, get_all)]
pub struct PyGeneration {
    /// The generated token ids (a stop token that ended it is not included).
    token_ids: Vec<TokenId>,
    /// Natural-log probability of each token under the sampling distribution.
    logprobs: Vec<f32>,
    /// `"stop"` (a stop token or string) or `"length"` (max_tokens or the context).
    finish_reason: &'static str,
    /// The engine's reason: stop_token, stop_string, max_tokens or context_full.
    stop_reason: &'static str,
    /// The weights every token was sampled under.
    weight_version: u64,
    /// The token ids decoded.
    text: String,
    /// With `logprobs=N`: each token's N most likely alternatives, `(token_id,
    /// logprob)` pairs under the same distribution as `logprobs` (else empty).
    top_logprobs: Vec<Vec<(TokenId, f32)>>,
}

impl PyGeneration {
    pub(crate) fn new(model: &LoadedModel, g: Generation) -> PyResult<Self> {
        Ok(PyGeneration {
            text: model.tokenizer.decode(&g.tokens).map_err(model_error)?,
            token_ids: g.tokens,
            logprobs: g.logprobs,
            finish_reason: finish_reason(g.stop),
            stop_reason: stop_reason_name(g.stop),
            weight_version: g.weight_version,
            top_logprobs: alternatives(&g.top_logprobs),
        })
    }
}

#[pymethods]
impl PyGeneration {
    /// The fields as a dict.
    fn to_dict<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let d = PyDict::new(py);
        d.set_item("token_ids", &self.token_ids)?;
        d.set_item("logprobs", &self.logprobs)?;
        d.set_item("finish_reason", self.finish_reason)?;
        d.set_item("stop_reason", self.stop_reason)?;
        d.set_item("weight_version", self.weight_version)?;
        d.set_item("text", &self.text)?;
        d.set_item("top_logprobs", &self.top_logprobs)?;
        Ok(d)
    }

    fn __len__(&self) -> usize {
        self.token_ids.len()
    }

    fn __repr__(&self) -> String {
        format!(
            "Generation({} tokens, finish_reason={:?}, weight_version={}, text={:?})",
            self.token_ids.len(),
            self.finish_reason,
            self.weight_version,
            self.text
        )
    }
}

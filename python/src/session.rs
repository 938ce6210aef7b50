//! `treegrpo.Session`: one sequence kept in the engine between calls — generate,
//! append tokens (an observation), fork into sessions that share its cached prefix.
//! A session is freed by `close()`, at the end of a `with` block, or when Python
//! collects it.

use std::sync::Mutex;

use pyo3::exceptions::PyRuntimeError;
use pyo3::prelude::*;
use treegrpo::engine::{Engine, OwnedSeq};
use treegrpo::kv::SeqId;
use treegrpo::model::TokenId;

use crate::convert;
use crate::engine::PyGeneration;
use crate::errors::{engine_error, value_error};
use crate::runtime::wait;
use crate::sampling::{Extensions, SamplingArgs};

#[pyclass(module = "treegrpo._treegrpo", name = "Session", frozen)]
pub struct Session {
    engine: Engine,
    seed: u64,
    /// The session's sequence; `None` once closed.
    seq: Mutex<Option<OwnedSeq>>,
}

impl Session {
    pub fn new(engine: Engine, seed: u64, seq: OwnedSeq) -> Self {
        Session {
            engine,
            seed,
            seq: Mutex::new(Some(seq)),
        }
    }

    fn id(&self) -> PyResult<SeqId> {
        let guard = self
            .seq
            .lock()
            .map_err(|_| PyRuntimeError::new_err("session lock poisoned"))?;
        guard
            .as_ref()
            .map(OwnedSeq::id)
            .ok_or_else(|| value_error("the session is closed"))
    }
}

#[pymethods]
impl Session {
    /// Generates from the session's tokens; the generated tokens become part of it.
    /// vLLM's extensions as in `Engine.generate` (the repetition penalty looks at the
    /// whole session so far).
    #[pyo3(signature = (max_tokens=256, temperature=0.0, top_p=None, top_k=None, stop=None, seed=None, *, min_p=None, repetition_penalty=1.0, presence_penalty=0.0, frequency_penalty=0.0, logprobs=0, min_tokens=0))]
    #[allow(clippy::too_many_arguments)]
    fn generate(
        &self,
        py: Python<'_>,
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
    ) -> PyResult<PyGeneration> {
        let seq = self.id()?;
        let args = SamplingArgs::from_args(max_tokens, temperature, top_p, top_k, stop, seed)?
            .with_extensions(Extensions {
                min_p,
                repetition_penalty,
                presence_penalty,
                frequency_penalty,
                logprobs,
                min_tokens,
            });
        let model = self.engine.model().clone();
        // Each session samples on its own stream (a fork's differs from its parent's).
        let params = args.params(
            self.seed,
            seq.slot().raw() as u64,
            model.tokenizer.eos_ids(),
        )?;
        let engine = self.engine.clone();
        let generation = wait(py, async move {
            engine.generate(seq, params).await.map_err(engine_error)
        })?;
        PyGeneration::new(&model, generation)
    }

    /// Appends tokens (an observation, a user turn) to the session.
    fn append(&self, py: Python<'_>, token_ids: &Bound<'_, PyAny>) -> PyResult<()> {
        let seq = self.id()?;
        let ids = convert::token_ids(token_ids)?;
        if ids.is_empty() {
            return Ok(());
        }
        let engine = self.engine.clone();
        wait(py, async move {
            engine.append(seq, ids).await.map_err(engine_error)
        })
    }

    /// `n` new sessions continuing from this one's tokens: they share its cached KV
    /// (nothing is recomputed), and each goes on independently.
    #[pyo3(signature = (n=1))]
    fn fork(&self, py: Python<'_>, n: usize) -> PyResult<Vec<Session>> {
        if n == 0 {
            return Err(value_error("fork(n): n must be at least 1"));
        }
        let seq = self.id()?;
        let engine = self.engine.clone();
        let forks = wait(py, async move {
            // The parent's last sampled token is not in the KV cache yet: computing it
            // once here lets every branch inherit it (else each would compute it, as
            // the server's fork avoids the same way).
            engine.prefill(seq).await.map_err(engine_error)?;
            // All or nothing: forks made before a failure are released on drop.
            let mut forks = Vec::with_capacity(n);
            for _ in 0..n {
                forks.push(OwnedSeq::fork(&engine, seq).await.map_err(engine_error)?);
            }
            Ok(forks)
        })?;
        Ok(forks
            .into_iter()
            .map(|f| Session::new(self.engine.clone(), self.seed, f))
            .collect())
    }

    /// Every token of the session (prompt, generated and appended).
    #[getter]
    fn tokens(&self, py: Python<'_>) -> PyResult<Vec<TokenId>> {
        let seq = self.id()?;
        let engine = self.engine.clone();
        wait(py, async move {
            engine.sequence_tokens(seq).await.map_err(engine_error)
        })
    }

    /// Whether `close()` was called (or the `with` block ended).
    #[getter]
    fn closed(&self) -> PyResult<bool> {
        Ok(self
            .seq
            .lock()
            .map_err(|_| PyRuntimeError::new_err("session lock poisoned"))?
            .is_none())
    }

    /// Frees the session's sequence; closing twice does nothing.
    fn close(&self, py: Python<'_>) -> PyResult<()> {
        let owned = self
            .seq
            .lock()
            .map_err(|_| PyRuntimeError::new_err("session lock poisoned"))?
            .take();
        if let Some(owned) = owned {
            wait(py, async move { owned.free().await.map_err(engine_error) })?;
        }
        Ok(())
    }

    fn __enter__(slf: Py<Self>) -> Py<Self> {
        slf
    }

    #[pyo3(signature = (*_exc))]
    fn __exit__(&self, py: Python<'_>, _exc: &Bound<'_, pyo3::types::PyTuple>) -> PyResult<bool> {
        self.close(py)?;
        Ok(false)
    }

    fn __repr__(&self) -> String {
        match self.id() {
            Ok(seq) => format!("Session(seq={})", seq.slot()),
            Err(_) => "Session(closed)".to_string(),
        }
    }
}

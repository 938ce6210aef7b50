//! The mistral.rs client every peer workload shares: loading a GGUF file into a
//! mistral.rs engine on the CPU, our sampling settings in its terms, and one raw-token
//! completion request (the prompt is our exact token ids; mistral.rs applies no
//! template of its own).

use std::num::NonZeroUsize;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use mistralrs::core::{
    AutoDeviceMapParams, GGUFLoaderBuilder, GGUFSpecificConfig, MistralRsBuilder,
};
use mistralrs::{
    Constraint, CustomLogitsProcessor, DefaultSchedulerMethod, Device, DeviceMapSetting, MistralRs,
    ModelDType, NormalRequest, Request, RequestMessage, Response, SamplingParams, SchedulerConfig,
    StopTokens, TokenSource,
};
use tokio::sync::mpsc::{channel, Sender};

use super::PeerError;
use crate::engine::Sampling;
use crate::model::TokenId;

/// Activation (and KV cache) dtype mistral.rs computes in. GGUF weights stay quantised.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
pub enum PeerDType {
    /// mistral.rs's own choice: on CPU the first of BF16, F16 that matmuls (BF16).
    Auto,
    /// f32, as our engine computes.
    F32,
    /// bf16 activations (what `Auto` picks on CPU).
    Bf16,
}

/// How the peer engine is set up.
#[derive(Debug, Clone, Copy, serde::Serialize)]
pub struct PeerModelConfig {
    /// Most sequences mistral.rs's scheduler runs at once.
    pub max_num_seqs: usize,
    /// mistral.rs's sequence-level prefix cache (on CPU it keeps every finished
    /// sequence's KV cache: it evicts only caches on an accelerator).
    pub prefix_cache: bool,
    /// What mistral.rs computes activations and the KV cache in.
    pub dtype: PeerDType,
    /// Generation ignores EOS tokens (engine-wide in mistral.rs; for speed runs).
    pub disable_eos_stop: bool,
}

/// Loads a GGUF file into a mistral.rs engine on the CPU, from its local path only
/// (no hub access); its tokenizer comes from the GGUF metadata.
///
/// This goes through mistral.rs's loader and engine builder rather than its
/// `GgufModelBuilder`, which fixes the dtype to `Auto` (BF16 activations on CPU) and
/// offers no engine-wide EOS switch. Loading runs on a task of its own, so a panic
/// inside mistral.rs comes back as [`PeerError::LoadFailed`]. Needs a multi-threaded tokio
/// runtime (mistral.rs sends a warm-up request with `block_in_place` after loading).
pub async fn load_peer_model(
    model_path: &Path,
    cfg: PeerModelConfig,
) -> Result<Arc<MistralRs>, PeerError> {
    let load_err = |msg: String| PeerError::Load {
        path: model_path.to_path_buf(),
        msg,
    };
    if !model_path.is_file() {
        return Err(load_err("not a file (the peer takes a .gguf file)".into()));
    }
    let file = model_path
        .file_name()
        .and_then(|f| f.to_str())
        .ok_or_else(|| load_err("the file name is not UTF-8".into()))?
        .to_string();
    let dir = match model_path.parent() {
        Some(p) if !p.as_os_str().is_empty() => p.to_path_buf(),
        _ => PathBuf::from("."),
    };
    let dir = dir
        .to_str()
        .ok_or_else(|| load_err("the directory name is not UTF-8".into()))?
        .to_string();
    let max_num_seqs = NonZeroUsize::new(cfg.max_num_seqs)
        .ok_or_else(|| PeerError::Invalid("max_num_seqs must be at least 1".into()))?;
    let handle = tokio::spawn(async move {
        let loader = GGUFLoaderBuilder::new(
            None,
            None,
            dir,
            vec![file],
            GGUFSpecificConfig { topology: None },
            false,
            None,
        )
        .build();
        let dtype = match cfg.dtype {
            PeerDType::Auto => ModelDType::Auto,
            PeerDType::F32 => ModelDType::F32,
            PeerDType::Bf16 => ModelDType::BF16,
        };
        let pipeline = loader
            .load_model_from_hf(
                None,
                TokenSource::None,
                &dtype,
                &Device::Cpu,
                true,
                DeviceMapSetting::Auto(AutoDeviceMapParams::default_text()),
                None,
                None,
            )
            .map_err(Box::<dyn std::error::Error + Send + Sync>::from)?;
        let mut builder = MistralRsBuilder::new(
            pipeline,
            SchedulerConfig::DefaultScheduler {
                method: DefaultSchedulerMethod::Fixed(max_num_seqs),
            },
            false,
            None,
        )
        .with_no_prefix_cache(!cfg.prefix_cache)
        .with_disable_eos_stop(cfg.disable_eos_stop);
        if cfg.prefix_cache {
            builder = builder.with_prefix_cache_n(16);
        }
        Ok::<_, Box<dyn std::error::Error + Send + Sync>>(builder.build().await)
    });
    let failed = |source: Box<dyn std::error::Error + Send + Sync>| PeerError::LoadFailed {
        path: model_path.to_path_buf(),
        source,
    };
    match handle.await {
        Ok(Ok(engine)) => Ok(engine),
        Ok(Err(e)) => Err(failed(e)),
        Err(panicked) => Err(failed(Box::new(panicked))),
    }
}

/// The request channel of a loaded engine.
pub fn sender(engine: &MistralRs) -> Result<Sender<Request>, PeerError> {
    engine.get_sender(None).map_err(|e| PeerError::Rejected {
        what: "no engine",
        source: Box::new(e),
    })
}

/// Our sampling settings as mistral.rs's. Greedy is temperature 0 (mistral.rs treats a
/// missing temperature as 1.0). No penalties, no min-p.
pub fn sampling_params(
    sampling: &Sampling,
    max_len: usize,
    stop_strings: &[String],
) -> SamplingParams {
    let mut p = SamplingParams::neutral();
    match *sampling {
        Sampling::Greedy => p.temperature = Some(0.0),
        Sampling::Random {
            temperature,
            top_k,
            top_p,
            min_p,
        } => {
            p.temperature = Some(f64::from(temperature));
            p.top_k = top_k;
            p.top_p = top_p.map(f64::from);
            p.min_p = min_p.map(f64::from);
        }
    }
    p.max_len = Some(max_len);
    if !stop_strings.is_empty() {
        p.stop_toks = Some(StopTokens::Seqs(stop_strings.to_vec()));
    }
    p
}

/// One finished completion and what mistral.rs said about it.
pub struct Completion {
    /// The choice's text: leading whitespace trimmed by mistral.rs, and cut *before* a
    /// stop string that ended it.
    pub text: String,
    /// `stop` (EOS, stop token or stop string), `length`, ...
    pub finish_reason: String,
    /// Each generated token decoded on its own (present when logprobs were asked for).
    pub token_texts: Vec<String>,
    /// mistral.rs's own count of prompt tokens it was sent.
    pub prompt_tokens: usize,
    /// mistral.rs's own count of generated tokens (it decodes one token past a stop
    /// string before it notices it).
    pub completion_tokens: usize,
}

/// Sends one raw-token completion request and waits for its answer.
pub async fn complete(
    tx: &Sender<Request>,
    prompt: &[TokenId],
    params: SamplingParams,
    return_logprobs: bool,
    logits_processors: Option<Vec<Arc<dyn CustomLogitsProcessor>>>,
) -> Result<Completion, PeerError> {
    if prompt.is_empty() {
        return Err(PeerError::Invalid("empty prompt".into()));
    }
    let (resp_tx, mut resp_rx) = channel(1);
    let request = Request::Normal(Box::new(NormalRequest {
        messages: RequestMessage::CompletionTokens(prompt.to_vec()),
        sampling_params: params,
        response: resp_tx,
        return_logprobs,
        is_streaming: false,
        id: 0,
        constraint: Constraint::None,
        suffix: None,
        tools: None,
        tool_choice: None,
        logits_processors,
        return_raw_logits: false,
        web_search_options: None,
        model_id: None,
        truncate_sequence: false,
    }));
    tx.send(request)
        .await
        .map_err(|_| PeerError::Request("the engine stopped (request channel closed)".into()))?;
    let response = resp_rx
        .recv()
        .await
        .ok_or_else(|| PeerError::Request("the engine dropped the request".into()))?;
    let done = match response {
        Response::CompletionDone(r) => r,
        Response::CompletionModelError(msg, _) => {
            return Err(PeerError::Rejected {
                what: "model error",
                source: msg.into(),
            })
        }
        Response::ValidationError(e) => {
            return Err(PeerError::Rejected {
                what: "validation",
                source: Box::<dyn std::error::Error + Send + Sync>::from(e),
            })
        }
        Response::InternalError(e) => {
            return Err(PeerError::Rejected {
                what: "internal",
                source: Box::<dyn std::error::Error + Send + Sync>::from(e),
            })
        }
        _ => {
            return Err(PeerError::Request(
                "unexpected response kind to a completion request".into(),
            ))
        }
    };
    let choice = done
        .choices
        .into_iter()
        .next()
        .ok_or_else(|| PeerError::Request("a completion without choices".into()))?;
    let token_texts = choice
        .logprobs
        .and_then(|l| l.content)
        .map(|c| c.into_iter().map(|t| t.token).collect())
        .unwrap_or_default();
    Ok(Completion {
        text: choice.text,
        finish_reason: choice.finish_reason,
        token_texts,
        prompt_tokens: done.usage.prompt_tokens,
        completion_tokens: done.usage.completion_tokens,
    })
}

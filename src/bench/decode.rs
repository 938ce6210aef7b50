//! Aggregate decode speed of our engine (and, with the `mistralrs` or `llamacpp`
//! feature, of a peer on the same prompt ids): `batch` sequences generating together.
//!
//! Each sequence gets the same short chat prompt (its prefill is done and awaited
//! before the clock starts), then all generate exactly `new_tokens` tokens greedily
//! with no stop token, concurrently. A generation's first token is sampled from the
//! prefill's logits (no forward), so `new_tokens - 1` batched one-token forwards are
//! timed; the figure is `batch × (new_tokens - 1) / seconds`, sampling and scheduling
//! included — the same quantity the mistral.rs peer measures (`peer::mistralrs_speed`).

use std::sync::Arc;
use std::time::Instant;

use serde::Serialize;

use crate::engine::{Engine, EngineConfig, EngineError, GenParams};
use crate::model::{ChatMessage, LoadedModel, ModelError, TokenId};

/// A measured decode speed.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct DecodeSpeed {
    /// Which engine was measured: `treegrpo`, `mistral.rs` or `llama.cpp`.
    pub engine: &'static str,
    /// Sequences decoding together.
    pub batch: usize,
    /// Prompt tokens each sequence starts decoding after (the context its attention
    /// reads grows from there).
    pub context: usize,
    /// Tokens each sequence generated (the first comes from the prefill, so
    /// `new_tokens - 1` forwards are timed).
    pub new_tokens: usize,
    /// Aggregate decode tokens per second over the whole batch.
    pub tokens_per_second: f64,
    /// treegrpo's figure at the same batch and context divided by this one (peer rows
    /// only; filled by the report).
    pub treegrpo_ratio: Option<f64>,
}

/// The prompt every decode measurement uses (ours and the peer's).
pub const DECODE_PROMPT: &str = "Write a long story about a lighthouse keeper and a storm.";

/// [`DECODE_PROMPT`] as a user turn in the model's chat template: the token ids both
/// engines decode from.
pub fn decode_prompt(model: &LoadedModel) -> Result<Vec<TokenId>, ModelError> {
    model.chat_prompt(&[ChatMessage::new("user", DECODE_PROMPT)])
}

/// Decode tokens/s of our engine at `batch` sequences of `prompt` ([`decode_prompt`],
/// or a long one for the long-context figures), each generating `new_tokens`. The
/// sequences after the first find the prompt in the prefix cache and share its blocks.
pub async fn engine_decode_tokens_per_second(
    model: &Arc<LoadedModel>,
    prompt: &[TokenId],
    batch: usize,
    new_tokens: usize,
) -> Result<DecodeSpeed, EngineError> {
    let engine = Engine::start(model.clone(), EngineConfig::default())?;
    let mut seqs = Vec::with_capacity(batch);
    for _ in 0..batch.max(1) {
        let seq = engine.add_sequence(prompt.to_vec()).await?;
        engine.prefill(seq).await?;
        seqs.push(seq);
    }
    let t0 = Instant::now();
    let mut jobs = tokio::task::JoinSet::new();
    for &seq in &seqs {
        let engine = engine.clone();
        jobs.spawn(async move { engine.generate(seq, GenParams::greedy(new_tokens)).await });
    }
    let mut tokens = 0;
    while let Some(joined) = jobs.join_next().await {
        let gen = joined.map_err(|source| EngineError::Task {
            task: "decode",
            source,
        })??;
        // The first token came from the prefill: count decode forwards only.
        tokens += gen.tokens.len().saturating_sub(1);
    }
    let seconds = t0.elapsed().as_secs_f64();
    Ok(DecodeSpeed {
        engine: "treegrpo",
        batch: seqs.len(),
        context: prompt.len(),
        new_tokens,
        tokens_per_second: tokens as f64 / seconds.max(1e-9),
        treegrpo_ratio: None,
    })
}

/// Decode tokens/s of mistral.rs at `batch` sequences on the same file and the same
/// prompt ids as [`engine_decode_tokens_per_second`] (its own timing method, which
/// also excludes the first token: see `peer::mistralrs_speed`).
#[cfg(feature = "mistralrs")]
pub async fn peer_decode_tokens_per_second(
    model_path: &std::path::Path,
    model: &LoadedModel,
    batch: usize,
    new_tokens: usize,
) -> Result<DecodeSpeed, crate::peer::PeerError> {
    let prompt = decode_prompt(model)?;
    let tokens_per_second =
        crate::peer::mistralrs_decode_tokens_per_second(model_path, &prompt, batch, new_tokens)
            .await?;
    Ok(DecodeSpeed {
        engine: "mistral.rs",
        batch,
        context: prompt.len(),
        new_tokens,
        tokens_per_second,
        treegrpo_ratio: None,
    })
}

/// Decode tokens/s of llama.cpp at `batch` sequences of the same prompt ids as
/// [`engine_decode_tokens_per_second`] (the same quantity: see `peer::llamacpp_speed`).
#[cfg(feature = "llamacpp")]
pub fn llamacpp_decode_tokens_per_second(
    peer: &crate::peer::LlamaCppPeer,
    prompt: &[TokenId],
    batch: usize,
    new_tokens: usize,
) -> Result<DecodeSpeed, crate::peer::PeerError> {
    Ok(DecodeSpeed {
        engine: "llama.cpp",
        batch,
        context: prompt.len(),
        new_tokens,
        tokens_per_second: peer.decode_tokens_per_second(prompt, batch, new_tokens)?,
        treegrpo_ratio: None,
    })
}

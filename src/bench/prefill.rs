//! Prefill speed of our engine (and, with the `llamacpp` feature, of llama.cpp on the
//! same prompt ids): one prompt of exactly `tokens` tokens computed into an empty
//! cache.
//!
//! Each run starts a fresh engine (so no run finds the prompt in the prefix cache),
//! adds the prompt and times `Engine::prefill` alone: the forward over every prompt
//! token, without sampling a token. One untimed warm-up run comes first; the figure
//! is `tokens / seconds` of the median of `runs` timed runs.

use std::sync::Arc;
use std::time::Instant;

use serde::Serialize;

use crate::engine::{Engine, EngineConfig, EngineError};
use crate::model::{LoadedModel, ModelError, TokenId};

/// A measured prefill speed.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct PrefillSpeed {
    /// Which engine was measured: `treegrpo` or `llama.cpp`.
    pub engine: &'static str,
    /// Prompt tokens computed in one prefill.
    pub tokens: usize,
    /// `tokens` over the median timed prefill's seconds.
    pub tokens_per_second: f64,
    /// treegrpo's figure divided by this one (peer rows only; filled by the report).
    pub treegrpo_ratio: Option<f64>,
}

/// Text the prefill prompt is cut from: plain English prose, tokenised like any
/// document an agent reads.
const PREFILL_TEXT: &str = "The lighthouse stood on a spit of black rock at the edge \
of the bay, and for forty years the same keeper had climbed its hundred and twelve steps \
every evening to light the lamp. He knew the moods of the sea the way a farmer knows the \
sky: the long grey swell that came before a gale, the flat glitter of a calm that would not \
last, the fog that crept in from the south and swallowed the harbour bell. ";

/// Exactly `tokens` token ids of a fixed paragraph of English prose, repeated: the
/// prompt both engines prefill. An error if the tokenizer fails or encodes the text
/// to nothing.
pub fn prefill_prompt(model: &LoadedModel, tokens: usize) -> Result<Vec<TokenId>, ModelError> {
    let once = model.tokenizer.encode_prompt(PREFILL_TEXT)?;
    if once.is_empty() {
        return Err(ModelError::EmptyEncoding);
    }
    Ok(once.iter().copied().cycle().take(tokens).collect())
}

/// Prefill tokens/s of our engine on `prompt` (see the module docs).
pub async fn engine_prefill_tokens_per_second(
    model: &Arc<LoadedModel>,
    prompt: &[TokenId],
    runs: usize,
) -> Result<PrefillSpeed, EngineError> {
    let runs = runs.max(1);
    let mut seconds = Vec::with_capacity(runs);
    for run in 0..=runs {
        let engine = Engine::start(model.clone(), EngineConfig::default())?;
        let seq = engine.add_sequence(prompt.to_vec()).await?;
        let t0 = Instant::now();
        engine.prefill(seq).await?;
        if run > 0 {
            seconds.push(t0.elapsed().as_secs_f64());
        }
    }
    seconds.sort_by(f64::total_cmp);
    Ok(PrefillSpeed {
        engine: "treegrpo",
        tokens: prompt.len(),
        tokens_per_second: prompt.len() as f64 / seconds[seconds.len() / 2].max(1e-9),
        treegrpo_ratio: None,
    })
}

/// Prefill tokens/s of llama.cpp on the same prompt ids (the same quantity: see
/// `peer::llamacpp_speed`).
#[cfg(feature = "llamacpp")]
pub fn llamacpp_prefill_tokens_per_second(
    peer: &crate::peer::LlamaCppPeer,
    prompt: &[TokenId],
    runs: usize,
) -> Result<PrefillSpeed, crate::peer::PeerError> {
    Ok(PrefillSpeed {
        engine: "llama.cpp",
        tokens: prompt.len(),
        tokens_per_second: peer.prefill_tokens_per_second(prompt, runs)?,
        treegrpo_ratio: None,
    })
}

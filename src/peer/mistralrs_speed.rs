//! mistral.rs's aggregate decode speed: `batch` concurrent requests of one prompt
//! (token ids, so the bench gives both engines exactly the same ones), each generating
//! exactly `new_tokens` tokens, greedy.
//!
//! What is timed: two runs of the same batch after a warm-up run, one generating a
//! single token per request (prefill plus the first token) and one generating
//! `new_tokens`; the figure is the tokens the second run decoded beyond the first
//! token of each request, divided by the difference of the two wall-clock times. So it
//! is the decode phase alone (`new_tokens - 1` batched forwards of one token per
//! sequence, sampling and mistral.rs's scheduling included), without prefill and
//! without model loading. mistral.rs's prefix cache is off, so both runs prefill the
//! same way. All requests have the same prompt, so they stay the same length and
//! mistral.rs's scheduler (which batches only sequences of equal length) runs them
//! as one batch: this is its best case.
//!
//! "Exactly": the engine is built with mistral.rs's engine-wide `disable_eos_stop`
//! (there is no per-request "ignore EOS"; the request's `logits_bias` field is never
//! applied in 0.8.1), so only the token limit ends a request. Should a request still
//! stop early, the figure counts the tokens mistral.rs reports it generated.

use std::path::Path;
use std::time::Instant;

use tokio::sync::mpsc::Sender;
use tokio::task::JoinSet;

use super::{
    complete, load_peer_model, sampling_params, sender, PeerDType, PeerError, PeerModelConfig,
};
use crate::engine::Sampling;
use crate::model::TokenId;

/// Aggregate decode tokens per second of mistral.rs at `batch` concurrent sequences,
/// computing in f32 like our engine (see the module docs for what is timed). Needs a
/// multi-threaded tokio runtime.
pub async fn mistralrs_decode_tokens_per_second(
    model_path: &Path,
    prompt: &[TokenId],
    batch: usize,
    new_tokens: usize,
) -> Result<f64, PeerError> {
    mistralrs_decode_tokens_per_second_with(model_path, prompt, batch, new_tokens, PeerDType::F32)
        .await
}

/// [`mistralrs_decode_tokens_per_second`] with mistral.rs computing in `dtype`.
pub async fn mistralrs_decode_tokens_per_second_with(
    model_path: &Path,
    prompt: &[TokenId],
    batch: usize,
    new_tokens: usize,
    dtype: PeerDType,
) -> Result<f64, PeerError> {
    if batch == 0 {
        return Err(PeerError::Invalid("batch must be at least 1".into()));
    }
    if new_tokens < 2 {
        return Err(PeerError::Invalid(
            "new_tokens must be at least 2 (the first token is not decode)".into(),
        ));
    }
    if prompt.is_empty() {
        return Err(PeerError::Invalid("the prompt is empty".into()));
    }
    let engine = load_peer_model(
        model_path,
        PeerModelConfig {
            max_num_seqs: batch,
            prefix_cache: false,
            dtype,
            disable_eos_stop: true,
        },
    )
    .await?;
    let tx = sender(&engine)?;

    run_batch(&tx, prompt, batch, 2).await?;
    let t = Instant::now();
    run_batch(&tx, prompt, batch, 1).await?;
    let first_only = t.elapsed().as_secs_f64();
    let t = Instant::now();
    let generated = run_batch(&tx, prompt, batch, new_tokens).await?;
    let full = t.elapsed().as_secs_f64();
    drop(engine);

    let decoded = generated.saturating_sub(batch as u64);
    let seconds = full - first_only;
    if decoded == 0 || seconds.is_nan() || seconds <= 0.0 {
        return Err(PeerError::Request(format!(
            "no decode phase to time: {decoded} tokens decoded in {seconds:.4} s \
             ({full:.4} s with decode, {first_only:.4} s without)"
        )));
    }
    Ok(decoded as f64 / seconds)
}

/// `batch` concurrent greedy requests of `max_len` tokens; returns the tokens generated.
async fn run_batch(
    tx: &Sender<mistralrs::Request>,
    prompt: &[TokenId],
    batch: usize,
    max_len: usize,
) -> Result<u64, PeerError> {
    let mut jobs = JoinSet::new();
    for _ in 0..batch {
        let tx = tx.clone();
        let prompt = prompt.to_vec();
        let params = sampling_params(&Sampling::Greedy, max_len, &[]);
        jobs.spawn(async move { complete(&tx, &prompt, params, false, None).await });
    }
    let mut generated = 0u64;
    while let Some(joined) = jobs.join_next().await {
        let c = joined.map_err(PeerError::Task)??;
        generated += c.completion_tokens as u64;
    }
    Ok(generated)
}

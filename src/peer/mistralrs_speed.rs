//! mistral.rs's aggregate decode speed: `batch` concurrent requests of one fixed short
//! prompt, each generating exactly `new_tokens` tokens, greedy.
//!
//! What is timed: two runs of the same batch after a warm-up run, one generating a
//! single token per request (prefill plus the first token) and one generating
//! `new_tokens`; the figure is the tokens the second run decoded beyond the first
//! token of each request, divided by the difference of the two wall-clock times. So it
//! is the decode phase alone (`new_tokens - 1` batched forwards of one token per
//! sequence, sampling and mistral.rs's scheduling included), without prefill,
//! and without model loading. mistral.rs's prefix cache is off, so both runs prefill
//! the same way.
//!
//! "Exactly": mistral.rs 0.8.1 has no per-request "ignore EOS" (its `logits_bias`
//! field is never applied), so a logits processor masks the model's EOS tokens (read
//! from the GGUF by our tokenizer) to -inf, and the token limit ends each request. The
//! figure counts the tokens mistral.rs reports it generated, should one stop early.

use std::path::Path;
use std::sync::Arc;
use std::time::Instant;

use mistralrs::{CustomLogitsProcessor, Tensor};
use tokio::sync::mpsc::Sender;
use tokio::task::JoinSet;

use super::{complete, load_peer_model, sampling_params, sender, PeerError, PeerModelConfig};
use crate::engine::Sampling;
use crate::model::gguf_file::{read_content, Metadata};
use crate::model::tokenizer::gguf_tokenizer;
use crate::model::TokenId;

/// The fixed prompt: plain prose the model continues for a long time.
pub const SPEED_PROMPT: &str =
    "The history of the city begins with a small fishing village on the river, where";

/// Aggregate decode tokens per second of mistral.rs at `batch` concurrent sequences
/// (see the module docs for what is timed). Needs a multi-threaded tokio runtime.
pub async fn mistralrs_decode_tokens_per_second(
    model_path: &Path,
    batch: usize,
    new_tokens: usize,
) -> Result<f64, PeerError> {
    if batch == 0 {
        return Err(PeerError::Invalid("batch must be at least 1".into()));
    }
    if new_tokens < 2 {
        return Err(PeerError::Invalid(
            "new_tokens must be at least 2 (the first token is not decode)".into(),
        ));
    }
    let (prompt, eos) = prompt_and_eos(model_path)?;
    let model = load_peer_model(
        model_path,
        PeerModelConfig {
            max_num_seqs: batch,
            prefix_cache: false,
        },
    )
    .await?;
    let tx = sender(&model)?;
    let mask: Arc<dyn CustomLogitsProcessor> = Arc::new(move |logits: &Tensor, _: &[u32]| {
        let mut v = logits.to_vec1::<f32>()?;
        for &id in &eos {
            if let Some(x) = v.get_mut(id as usize) {
                *x = f32::NEG_INFINITY;
            }
        }
        let n = v.len();
        Tensor::from_vec(v, n, logits.device())
    });

    run_batch(&tx, &prompt, batch, 2, &mask).await?;
    let t = Instant::now();
    run_batch(&tx, &prompt, batch, 1, &mask).await?;
    let first_only = t.elapsed().as_secs_f64();
    let t = Instant::now();
    let generated = run_batch(&tx, &prompt, batch, new_tokens, &mask).await?;
    let full = t.elapsed().as_secs_f64();
    drop(model);

    let decoded = generated.saturating_sub(batch as u64);
    let seconds = full - first_only;
    if decoded == 0 || !(seconds > 0.0) {
        return Err(PeerError::Request(format!(
            "no decode phase to time: {decoded} tokens decoded in {seconds:.4} s \
             ({full:.4} s with decode, {first_only:.4} s without)"
        )));
    }
    Ok(decoded as f64 / seconds)
}

/// The prompt's ids and the EOS ids, from the GGUF's own tokenizer metadata.
fn prompt_and_eos(model_path: &Path) -> Result<(Vec<TokenId>, Vec<TokenId>), PeerError> {
    let (_file, content) = read_content(model_path)?;
    let md = Metadata {
        content: &content,
        path: model_path,
    };
    let tok = gguf_tokenizer(&md)?;
    let prompt = tok.encode_prompt(SPEED_PROMPT)?;
    Ok((prompt, tok.eos_ids().to_vec()))
}

/// `batch` concurrent greedy requests of `max_len` tokens; returns the tokens generated.
async fn run_batch(
    tx: &Sender<mistralrs::Request>,
    prompt: &[TokenId],
    batch: usize,
    max_len: usize,
    mask: &Arc<dyn CustomLogitsProcessor>,
) -> Result<u64, PeerError> {
    let mut jobs = JoinSet::new();
    for _ in 0..batch {
        let tx = tx.clone();
        let prompt = prompt.to_vec();
        let params = sampling_params(&Sampling::Greedy, max_len, &[]);
        let mask = mask.clone();
        jobs.spawn(async move { complete(&tx, &prompt, params, false, Some(vec![mask])).await });
    }
    let mut generated = 0u64;
    while let Some(joined) = jobs.join_next().await {
        let c = joined.map_err(|e| PeerError::Task(e.to_string()))??;
        generated += c.completion_tokens as u64;
    }
    Ok(generated)
}

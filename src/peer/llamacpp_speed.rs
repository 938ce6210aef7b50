//! llama.cpp's decode and prefill speed on the same GGUF file and the same prompt
//! token ids as ours (crate `llama-cpp-2`, feature `llamacpp`), through its C API:
//! token ids in, logits out, greedy sampling done here.
//!
//! What is timed is the same quantity our figures time (`bench::decode`,
//! `bench::prefill`):
//!
//! - **Decode at batch `b`:** `b` sequences of one prompt, prefilled together (not
//!   timed); each sequence's first token is the argmax of its prefill logits (no
//!   forward); then `new_tokens - 1` steps, each one `llama_decode` of `b` tokens (one
//!   per sequence) and an argmax over each sequence's logits, are timed. The figure is
//!   `b × (new_tokens - 1) / seconds`. No stop token: every sequence generates exactly
//!   `new_tokens`. The KV cache is not unified (`kv_unified = false`, llama.cpp's
//!   default): each sequence attends over its own stream, which is llama.cpp's faster
//!   layout for independent sequences. A prompt past 512 tokens (the long-context
//!   figures) is prefilled once into a unified cache and shared by every sequence
//!   (`llama_memory_seq_cp`), as our prefix cache shares it: prefilling 64 copies of a
//!   4,096-token prompt would take longer than the measurement.
//! - **Prefill:** one `llama_decode` of the whole prompt (logits of its last token
//!   only) into an empty cache, after one untimed warm-up run (the first touches the
//!   memory-mapped weights); the median of `runs` timed runs.
//!
//! Threads: `threads` for both decode and batch work, as llama-bench's `-t`.
//! Activations are whatever llama.cpp's CPU backend uses for the file's quantisation
//! (8-bit activations against Q4 weights): faster arithmetic, not our exact path.

use std::num::NonZeroU32;
use std::path::Path;
use std::sync::{Mutex, OnceLock};
use std::time::Instant;

use llama_cpp_2::context::params::LlamaContextParams;
use llama_cpp_2::context::LlamaContext;
use llama_cpp_2::llama_backend::LlamaBackend;
use llama_cpp_2::llama_batch::LlamaBatch;
use llama_cpp_2::model::params::LlamaModelParams;
use llama_cpp_2::model::LlamaModel;
use llama_cpp_2::token::LlamaToken;
use llama_cpp_2::LlamaCppError;

use super::PeerError;
use crate::model::TokenId;

/// Decode prompts longer than this are prefilled once and shared by the batch's
/// sequences (as our engine's prefix cache shares them), not prefilled per sequence.
const SHARED_PROMPT_FROM: usize = 512;

/// llama.cpp's process-wide backend: `llama_backend_init` may run once per process.
static BACKEND: OnceLock<LlamaBackend> = OnceLock::new();
static BACKEND_INIT: Mutex<()> = Mutex::new(());

fn backend() -> Result<&'static LlamaBackend, PeerError> {
    let _guard = BACKEND_INIT.lock().unwrap_or_else(|e| e.into_inner());
    if let Some(b) = BACKEND.get() {
        return Ok(b);
    }
    let mut b = LlamaBackend::init()?;
    // Its per-tensor load log would drown the bench's own progress lines.
    b.void_logs();
    Ok(BACKEND.get_or_init(|| b))
}

/// A GGUF file loaded into llama.cpp on the CPU, ready to be measured.
pub struct LlamaCppPeer {
    model: LlamaModel,
    threads: i32,
}

impl LlamaCppPeer {
    /// Loads `model_path` (memory-mapped, CPU only) to run on `threads` threads.
    pub fn load(model_path: &Path, threads: usize) -> Result<Self, PeerError> {
        if !model_path.is_file() {
            return Err(PeerError::Invalid(format!(
                "{} is not a file (llama.cpp takes a .gguf file)",
                model_path.display()
            )));
        }
        let threads = i32::try_from(threads.max(1))
            .map_err(|_| PeerError::Invalid(format!("{threads} threads")))?;
        let backend = backend()?;
        let params = LlamaModelParams::default().with_n_gpu_layers(0);
        let model = LlamaModel::load_from_file(backend, model_path, &params)
            .map_err(LlamaCppError::from)?;
        Ok(LlamaCppPeer { model, threads })
    }

    /// The vocabulary size: every prompt id must be below it.
    pub fn vocab_size(&self) -> usize {
        usize::try_from(self.model.n_vocab()).unwrap_or(0)
    }

    /// Aggregate decode tokens/s at `batch` sequences generating `new_tokens` each
    /// (see the module docs for what is timed).
    pub fn decode_tokens_per_second(
        &self,
        prompt: &[TokenId],
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
        let prompt = self.checked_tokens(prompt)?;
        let mut next: Vec<LlamaToken>;
        let mut ctx;
        if prompt.len() <= SHARED_PROMPT_FROM {
            let per_seq = prompt.len() + new_tokens;
            ctx = self.context(batch, per_seq * batch, prompt.len() * batch, false)?;
            // Prefill every sequence in one batch; keep the index of each one's last token.
            let mut b = LlamaBatch::new(prompt.len() * batch, i32_of(batch)?);
            let mut last = Vec::with_capacity(batch);
            for s in 0..batch {
                let seq = i32_of(s)?;
                for (p, &t) in prompt.iter().enumerate() {
                    let is_last = p + 1 == prompt.len();
                    b.add(t, i32_of(p)?, &[seq], is_last)
                        .map_err(LlamaCppError::from)?;
                }
                last.push(b.n_tokens() - 1);
            }
            ctx.decode(&mut b).map_err(LlamaCppError::from)?;
            next = last.iter().map(|&i| argmax(&ctx, i)).collect();
        } else {
            // A long prompt is prefilled once and shared: one unified cache whose
            // prompt cells belong to every sequence (`llama_memory_seq_cp`).
            let cells = prompt.len() + batch * new_tokens;
            ctx = self.context(batch, cells, prompt.len(), true)?;
            let mut b = LlamaBatch::new(prompt.len(), 1);
            for (p, &t) in prompt.iter().enumerate() {
                b.add(t, i32_of(p)?, &[0], p + 1 == prompt.len())
                    .map_err(LlamaCppError::from)?;
            }
            ctx.decode(&mut b).map_err(LlamaCppError::from)?;
            let first = argmax(&ctx, b.n_tokens() - 1);
            for s in 1..batch {
                ctx.copy_kv_cache_seq(0, i32_of(s)?, None, None)
                    .map_err(|e| PeerError::LlamaCppCache {
                        what: "cache copy",
                        source: Box::new(e),
                    })?;
            }
            next = vec![first; batch];
        }

        let mut step = LlamaBatch::new(batch, i32_of(batch)?);
        let t0 = Instant::now();
        for t in 0..new_tokens - 1 {
            step.clear();
            let pos = i32_of(prompt.len() + t)?;
            for (s, &tok) in next.iter().enumerate() {
                step.add(tok, pos, &[i32_of(s)?], true)
                    .map_err(LlamaCppError::from)?;
            }
            ctx.decode(&mut step).map_err(LlamaCppError::from)?;
            for (s, tok) in next.iter_mut().enumerate() {
                *tok = argmax(&ctx, i32_of(s)?);
            }
        }
        let seconds = t0.elapsed().as_secs_f64();
        Ok((batch * (new_tokens - 1)) as f64 / seconds.max(1e-9))
    }

    /// Prefill tokens/s of `prompt` into an empty cache: the median of `runs` timed
    /// runs after one warm-up (see the module docs).
    pub fn prefill_tokens_per_second(
        &self,
        prompt: &[TokenId],
        runs: usize,
    ) -> Result<f64, PeerError> {
        let prompt = self.checked_tokens(prompt)?;
        let runs = runs.max(1);
        let mut ctx = self.context(1, prompt.len() + 1, prompt.len(), false)?;
        let mut b = LlamaBatch::new(prompt.len(), 1);
        let mut seconds = Vec::with_capacity(runs);
        for run in 0..=runs {
            ctx.clear_kv_cache();
            b.clear();
            for (p, &t) in prompt.iter().enumerate() {
                b.add(t, i32_of(p)?, &[0], p + 1 == prompt.len())
                    .map_err(LlamaCppError::from)?;
            }
            let t0 = Instant::now();
            ctx.decode(&mut b).map_err(LlamaCppError::from)?;
            // The logits are read, as a generation's first token would need them.
            let _ = argmax(&ctx, b.n_tokens() - 1);
            if run > 0 {
                seconds.push(t0.elapsed().as_secs_f64());
            }
        }
        seconds.sort_by(f64::total_cmp);
        Ok(prompt.len() as f64 / seconds[seconds.len() / 2].max(1e-9))
    }

    /// Greedy continuation of `prompt` by `new_tokens` tokens (no stop token): what
    /// the decode measurement generates, for checking that it generates text at all.
    pub fn greedy_tokens(
        &self,
        prompt: &[TokenId],
        new_tokens: usize,
    ) -> Result<Vec<TokenId>, PeerError> {
        let prompt = self.checked_tokens(prompt)?;
        let mut ctx = self.context(1, prompt.len() + new_tokens + 1, prompt.len(), false)?;
        let mut b = LlamaBatch::new(prompt.len(), 1);
        for (p, &t) in prompt.iter().enumerate() {
            b.add(t, i32_of(p)?, &[0], p + 1 == prompt.len())
                .map_err(LlamaCppError::from)?;
        }
        ctx.decode(&mut b).map_err(LlamaCppError::from)?;
        let mut out = Vec::with_capacity(new_tokens);
        let mut tok = argmax(&ctx, b.n_tokens() - 1);
        let mut step = LlamaBatch::new(1, 1);
        for t in 0..new_tokens {
            out.push(tok.0 as TokenId);
            if t + 1 == new_tokens {
                break;
            }
            step.clear();
            step.add(tok, i32_of(prompt.len() + t)?, &[0], true)
                .map_err(LlamaCppError::from)?;
            ctx.decode(&mut step).map_err(LlamaCppError::from)?;
            tok = argmax(&ctx, 0);
        }
        Ok(out)
    }

    /// A context for `seqs` sequences holding `cells` KV cells in all, taking batches
    /// of up to `max_batch` tokens in one `llama_decode`; `unified`: one cache the
    /// sequences share cells of, else a stream of its own per sequence.
    fn context(
        &self,
        seqs: usize,
        cells: usize,
        max_batch: usize,
        unified: bool,
    ) -> Result<LlamaContext<'_>, PeerError> {
        let backend = backend()?;
        let n_batch = u32_of(max_batch.max(seqs).max(1))?;
        let params = LlamaContextParams::default()
            .with_n_ctx(NonZeroU32::new(u32_of(cells.max(1))?))
            .with_n_batch(n_batch)
            .with_n_ubatch(n_batch.min(512))
            .with_n_seq_max(u32_of(seqs)?)
            .with_kv_unified(unified)
            .with_n_threads(self.threads)
            .with_n_threads_batch(self.threads);
        Ok(self
            .model
            .new_context(backend, params)
            .map_err(LlamaCppError::from)?)
    }

    /// `prompt` as llama.cpp tokens, refusing an empty prompt or an id outside the
    /// vocabulary (llama.cpp would abort the process on one).
    fn checked_tokens(&self, prompt: &[TokenId]) -> Result<Vec<LlamaToken>, PeerError> {
        if prompt.is_empty() {
            return Err(PeerError::Invalid("the prompt is empty".into()));
        }
        let vocab = self.vocab_size();
        prompt
            .iter()
            .map(|&t| match i32::try_from(t) {
                Ok(id) if (t as usize) < vocab => Ok(LlamaToken(id)),
                _ => Err(PeerError::Invalid(format!(
                    "token id {t} is outside llama.cpp's vocabulary of {vocab}"
                ))),
            })
            .collect()
    }
}

/// The most likely token at batch index `i` (lowest id on ties, like our greedy).
fn argmax(ctx: &LlamaContext<'_>, i: i32) -> LlamaToken {
    let logits = ctx.get_logits_ith(i);
    let mut best = 0;
    for (j, &l) in logits.iter().enumerate() {
        if l > logits[best] {
            best = j;
        }
    }
    LlamaToken(best as i32)
}

fn i32_of(n: usize) -> Result<i32, PeerError> {
    i32::try_from(n).map_err(|_| PeerError::Invalid(format!("{n} does not fit llama.cpp's i32")))
}

fn u32_of(n: usize) -> Result<u32, PeerError> {
    u32::try_from(n).map_err(|_| PeerError::Invalid(format!("{n} does not fit llama.cpp's u32")))
}

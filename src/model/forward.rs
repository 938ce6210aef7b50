//! The decoder forward pass (Llama / Qwen2 family) over a ragged batch.
//!
//! A batch is any mix of sequences, each contributing some new tokens at its own
//! starting position: a prefill chunk, a single decode token, or observation tokens
//! appended to a branch. All new tokens are flattened into `[rows, hidden]` so every
//! weight matrix is applied once per step; attention then reads each sequence's own
//! KV state through the [`KvStore`] the caller owns. Weights are immutable: one
//! `Model` is shared (`Arc`) by every sequence and thread.

use super::attention::{attend, AttentionShape, KvStore, SeqSpan};
use super::config::ModelConfig;
use super::error::ModelError;
use super::linear::Linear;
use super::ops::{rms_norm, swiglu, Rope};
use super::TokenId;

/// Which positions of a sequence's new tokens need logits.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LogitsWanted {
    /// None (a prefill chunk that is not the last).
    None,
    /// Only the last new token's (the usual decode step).
    Last,
    /// Every new token's (scoring, oracles, training).
    All,
}

/// One sequence's share of a ragged batch.
#[derive(Debug, Clone)]
pub struct BatchSeq {
    /// The sequence's slot in the [`KvStore`].
    pub slot: usize,
    /// Position of the first new token (= tokens already in the cache).
    pub start: usize,
    pub tokens: Vec<TokenId>,
    pub logits: LogitsWanted,
}

/// Sequences whose new tokens are computed together in one forward.
#[derive(Debug, Clone, Default)]
pub struct ForwardBatch {
    pub seqs: Vec<BatchSeq>,
}

/// The logits a sequence asked for, one `vocab`-wide row per wanted position.
#[derive(Debug, Clone)]
pub struct SeqLogits {
    pub slot: usize,
    pub rows: Vec<Vec<f32>>,
}

/// One transformer block's weights.
#[derive(Debug)]
pub struct Layer {
    pub attn_norm: Vec<f32>,
    pub q: Linear,
    pub k: Linear,
    pub v: Linear,
    pub o: Linear,
    pub ffn_norm: Vec<f32>,
    pub gate: Linear,
    pub up: Linear,
    pub down: Linear,
}

/// A loaded decoder: immutable weights plus the config that describes them.
#[derive(Debug)]
pub struct Model {
    pub(crate) config: ModelConfig,
    /// `[vocab, hidden]`, dequantised once: a lookup must not run a matmul.
    pub(crate) embedding: Vec<f32>,
    pub(crate) layers: Vec<Layer>,
    pub(crate) final_norm: Vec<f32>,
    pub(crate) lm_head: Linear,
    pub(crate) rope: Rope,
}

impl Model {
    pub fn config(&self) -> &ModelConfig {
        &self.config
    }

    /// Runs one forward step over `batch`, writing new keys/values into `kv`.
    pub fn forward(
        &self,
        batch: &ForwardBatch,
        kv: &mut dyn KvStore,
    ) -> Result<Vec<SeqLogits>, ModelError> {
        let cfg = &self.config;
        let hidden = cfg.hidden_size;
        let (q_dim, kv_dim) = (cfg.q_dim(), cfg.kv_dim());

        // Validate before touching the store, so a bad request leaves no partial state.
        let mut spans = Vec::with_capacity(batch.seqs.len());
        let mut positions = Vec::new();
        let mut x = Vec::new();
        for seq in &batch.seqs {
            let end = seq.start + seq.tokens.len();
            if end > cfg.max_position_embeddings {
                return Err(ModelError::ContextOverflow {
                    tokens: end,
                    max: cfg.max_position_embeddings,
                });
            }
            spans.push(SeqSpan {
                slot: seq.slot,
                start: seq.start,
                row: positions.len(),
                len: seq.tokens.len(),
            });
            for (i, &t) in seq.tokens.iter().enumerate() {
                let t = t as usize;
                if t >= cfg.vocab_size {
                    return Err(ModelError::Tokenizer(format!(
                        "token id {t} is outside the vocabulary of {}",
                        cfg.vocab_size
                    )));
                }
                x.extend_from_slice(&self.embedding[t * hidden..][..hidden]);
                positions.push(seq.start + i);
            }
        }
        let rows = positions.len();
        if rows == 0 {
            return Ok(Vec::new());
        }
        let shape = AttentionShape {
            num_heads: cfg.num_heads,
            num_kv_heads: cfg.num_kv_heads,
            head_dim: cfg.head_dim,
        };

        for (l, layer) in self.layers.iter().enumerate() {
            let mut h = x.clone();
            rms_norm(&mut h, &layer.attn_norm, cfg.rms_norm_eps);
            let mut q = layer.q.forward(&h, rows)?;
            let mut k = layer.k.forward(&h, rows)?;
            let v = layer.v.forward(&h, rows)?;
            for (r, &pos) in positions.iter().enumerate() {
                self.rope.apply(&mut q[r * q_dim..][..q_dim], pos);
                self.rope.apply(&mut k[r * kv_dim..][..kv_dim], pos);
            }
            for span in &spans {
                for i in 0..span.len {
                    let r = span.row + i;
                    kv.store(
                        l,
                        span.slot,
                        span.start + i,
                        &k[r * kv_dim..][..kv_dim],
                        &v[r * kv_dim..][..kv_dim],
                    )?;
                }
            }
            let attn = attend(&*kv, l, &spans, &q, shape);
            let o = layer.o.forward(&attn, rows)?;
            add_into(&mut x, &o);

            let mut h = x.clone();
            rms_norm(&mut h, &layer.ffn_norm, cfg.rms_norm_eps);
            let mut g = layer.gate.forward(&h, rows)?;
            let u = layer.up.forward(&h, rows)?;
            swiglu(&mut g, &u);
            let d = layer.down.forward(&g, rows)?;
            add_into(&mut x, &d);
        }

        // Only the rows that asked for logits pay for the vocabulary projection.
        let mut wanted = Vec::new();
        let mut owners = Vec::new();
        for (s, (seq, span)) in batch.seqs.iter().zip(&spans).enumerate() {
            let range = match seq.logits {
                LogitsWanted::None => 0..0,
                LogitsWanted::Last => span.len.saturating_sub(1)..span.len,
                LogitsWanted::All => 0..span.len,
            };
            for i in range {
                wanted.extend_from_slice(&x[(span.row + i) * hidden..][..hidden]);
                owners.push(s);
            }
        }
        let mut out: Vec<SeqLogits> = batch
            .seqs
            .iter()
            .map(|s| SeqLogits {
                slot: s.slot,
                rows: Vec::new(),
            })
            .collect();
        if owners.is_empty() {
            return Ok(out);
        }
        rms_norm(&mut wanted, &self.final_norm, cfg.rms_norm_eps);
        let logits = self.lm_head.forward(&wanted, owners.len())?;
        let vocab = self.lm_head.out_features();
        for (row, s) in logits.chunks_exact(vocab).zip(owners) {
            out[s].rows.push(row.to_vec());
        }
        Ok(out)
    }
}

fn add_into(x: &mut [f32], y: &[f32]) {
    for (a, b) in x.iter_mut().zip(y) {
        *a += b;
    }
}

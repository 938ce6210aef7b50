//! The decoder forward pass (Llama / Qwen2 family) over a ragged batch.
//!
//! A batch is any mix of sequences, each contributing some new tokens at its own
//! starting position: a prefill chunk, a single decode token, or observation tokens
//! appended to a branch. All new tokens are flattened into `[rows, hidden]` so every
//! weight matrix is applied once per step; attention then reads each sequence's own
//! KV state through the [`KvStore`] the caller owns. Weights are immutable: one
//! `Model` is shared (`Arc`) by every sequence and thread.
//!
//! Threads: each layer is two runs of the process's [`team`] (norm → Q/K/V → RoPE;
//! then attention → O + residual → norm → gate/up → SwiGLU → down + residual), the
//! members splitting rows, (token, head) pairs or weight panels and meeting at spin
//! barriers; the KV writes happen on the calling thread between the runs. Every
//! split leaves each output's arithmetic unchanged, so results do not depend on the
//! thread count.

use super::attention::SeqSpan;
use super::config::ModelConfig;
use super::error::ModelError;
use super::kernels::Epilogue;
use super::kv_store::{KvSlot, KvStore};
use super::layer_forward::{Block, Failure, Layer, LayerBuffers, LayerRecord};
use super::linear::Linear;
use super::ops::{rms_norm, Rope};
use super::step_logits::StepLogits;
use super::team::{self, SharedBuf};
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
    pub slot: KvSlot,
    /// Position of the first new token (= tokens already in the cache).
    pub start: usize,
    /// The tokens this forward computes for the sequence, in order: a prefill chunk
    /// or one decode token.
    pub tokens: Vec<TokenId>,
    /// Which of those tokens' positions need logits (usually only the last).
    pub logits: LogitsWanted,
}

/// Sequences whose new tokens are computed together in one forward.
#[derive(Debug, Clone, Default)]
pub struct ForwardBatch {
    /// The sequences of the batch; their new tokens are flattened in this order.
    pub seqs: Vec<BatchSeq>,
}

/// The logits a sequence asked for, one `vocab`-wide row per wanted position.
#[derive(Debug, Clone)]
pub struct SeqLogits {
    /// The sequence these logits are for (its [`BatchSeq::slot`]).
    pub slot: KvSlot,
    /// One row of raw (unscaled) logits per wanted position, in position order.
    pub rows: Vec<Vec<f32>>,
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
    /// What keys and values are rounded to before they are stored.
    pub(crate) kv_format: super::KvFormat,
}

impl Model {
    /// Layer `l` over the rows of `x` (`[rows, hidden]`, the residual stream, updated
    /// in place), its keys and values written to `kv` for `spans`. `angles[r]` are row
    /// `r`'s RoPE angles. With `record`, also keeps what a backward needs. The code is
    /// [`Block::run`]'s, shared by the engine's forward and the trainer's.
    #[allow(clippy::too_many_arguments)]
    pub fn run_layer(
        &self,
        l: usize,
        x: &mut [f32],
        bufs: &mut LayerBuffers,
        spans: &[SeqSpan],
        angles: &[Vec<(f32, f32)>],
        kv: &mut dyn KvStore,
        record: Option<&mut LayerRecord>,
    ) -> Result<(), ModelError> {
        let block = Block {
            config: &self.config,
            layer: &self.layers[l],
            index: l,
            rope: &self.rope,
            kv_format: self.kv_format,
        };
        block.run(x, bufs, spans, angles, kv, record)
    }

    /// The architecture these weights implement (dimensions, RoPE, norms, vocabulary).
    pub fn config(&self) -> &ModelConfig {
        &self.config
    }

    /// Runs one forward step over `batch`, writing new keys/values into `kv`; each
    /// sequence's logits in vectors of their own.
    pub fn forward(
        &self,
        batch: &ForwardBatch,
        kv: &mut dyn KvStore,
    ) -> Result<Vec<SeqLogits>, ModelError> {
        let mut logits = StepLogits::new();
        self.forward_into(batch, kv, &mut logits)?;
        Ok(batch
            .seqs
            .iter()
            .zip(logits.to_vecs())
            .map(|(seq, rows)| SeqLogits {
                slot: seq.slot,
                rows,
            })
            .collect())
    }

    /// [`Self::forward`], writing the logits into `logits` (reused from step to
    /// step: see [`StepLogits`]). On an error `logits` holds no sequence's rows.
    pub fn forward_into(
        &self,
        batch: &ForwardBatch,
        kv: &mut dyn KvStore,
        logits: &mut StepLogits,
    ) -> Result<(), ModelError> {
        logits.prepare(0, &[]);
        // Validate before touching the store, so a bad request leaves no partial state.
        let Embedded {
            spans,
            positions,
            mut x,
        } = self.embed(batch)?;
        if positions.is_empty() {
            // Nothing to compute: no sequence's rows (as `forward`'s empty result).
            return Ok(());
        }
        self.run_layers(&mut x, &spans, &positions, kv)?;
        let (wanted, rows_per_seq) = wanted_rows(batch, &spans, &x, self.config.hidden_size);
        self.project_logits(wanted, &rows_per_seq, logits)
    }

    /// Checks every sequence's positions and tokens and flattens the batch's new
    /// tokens into rows of their embeddings.
    fn embed(&self, batch: &ForwardBatch) -> Result<Embedded, ModelError> {
        let cfg = &self.config;
        let hidden = cfg.hidden_size;
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
                    return Err(ModelError::TokenOutOfVocab {
                        token: t,
                        vocab: cfg.vocab_size,
                    });
                }
                x.extend_from_slice(&self.embedding[t * hidden..][..hidden]);
                positions.push(seq.start + i);
            }
        }
        Ok(Embedded {
            spans,
            positions,
            x,
        })
    }

    /// Every transformer block over the rows `x`, in place, writing each block's new
    /// keys and values into `kv`.
    fn run_layers(
        &self,
        x: &mut [f32],
        spans: &[SeqSpan],
        positions: &[usize],
        kv: &mut dyn KvStore,
    ) -> Result<(), ModelError> {
        // RoPE's sines and cosines depend on the position only: once per token.
        let angles: Vec<Vec<(f32, f32)>> = positions.iter().map(|&p| self.rope.angles(p)).collect();
        let mut bufs = LayerBuffers::new(&self.config, positions.len());
        for l in 0..self.layers.len() {
            self.run_layer(l, x, &mut bufs, spans, &angles, kv, None)?;
        }
        Ok(())
    }

    /// The final norm and the vocabulary projection of the `wanted` rows, into
    /// `logits` (`rows_per_seq` of them for each sequence, in order). On an error
    /// `logits` holds no sequence's rows.
    fn project_logits(
        &self,
        mut wanted: Vec<f32>,
        rows_per_seq: &[usize],
        logits: &mut StepLogits,
    ) -> Result<(), ModelError> {
        let hidden = self.config.hidden_size;
        let eps = self.config.rms_norm_eps;
        let n = wanted.len() / hidden;
        let failure = Failure::default();
        let block = logits.prepare(self.lm_head.out_features(), rows_per_seq);
        if n == 0 {
            return Ok(());
        }
        {
            let (ws, ls) = (SharedBuf::new(&mut wanted), SharedBuf::new(block));
            team::global().run(|m| {
                let mine = m.share(n);
                // SAFETY: own rows, then own columns; all rows read after the barrier.
                unsafe {
                    let span = mine.start * hidden..mine.end * hidden;
                    rms_norm(ws.get_mut(span), &self.final_norm, eps);
                }
                m.barrier();
                let w_all = unsafe { ws.all() };
                // `Store` writes every element of the block: nothing stale is left.
                failure.note(
                    self.lm_head
                        .forward_share(m, w_all, n, &ls, Epilogue::Store),
                );
            });
        }
        if let Err(e) = failure.take() {
            logits.prepare(0, &[]);
            return Err(e);
        }
        Ok(())
    }
}

/// A batch's new tokens flattened: each sequence's span of rows, each row's position,
/// and the rows' embeddings (`[rows, hidden]`).
struct Embedded {
    spans: Vec<SeqSpan>,
    positions: Vec<usize>,
    x: Vec<f32>,
}

/// The rows that asked for logits, copied out of `x` in batch order, and how many each
/// sequence asked for: only they pay for the vocabulary projection.
fn wanted_rows(
    batch: &ForwardBatch,
    spans: &[SeqSpan],
    x: &[f32],
    hidden: usize,
) -> (Vec<f32>, Vec<usize>) {
    let mut wanted = Vec::new();
    let mut rows_per_seq = Vec::with_capacity(batch.seqs.len());
    for (seq, span) in batch.seqs.iter().zip(spans) {
        let range = match seq.logits {
            LogitsWanted::None => 0..0,
            LogitsWanted::Last => span.len.saturating_sub(1)..span.len,
            LogitsWanted::All => 0..span.len,
        };
        rows_per_seq.push(range.len());
        for i in range {
            wanted.extend_from_slice(&x[(span.row + i) * hidden..][..hidden]);
        }
    }
    (wanted, rows_per_seq)
}

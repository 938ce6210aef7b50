//! Packing sequences for the trainer's forward: a trie of token prefixes (packed) or
//! one chain per sequence (unpacked), with the unique scored tokens the loss reads.
//!
//! Two trajectories that share a prefix share its KV and its logits exactly, however
//! they were sampled: the logits at a position depend only on the tokens before it.
//! So a trie over the sequences' token ids is the exact packing — a tree's shared
//! prefix (the prompt, the steps before a branch) becomes one run of rows, forwarded
//! once — and it needs no forest file: trajectories from any engine in the same
//! schema pack the same way (AReaL packs tries likewise).
//!
//! A unique scored token is a trie row with a parent: its target is the row's token,
//! scored from the parent row's output. Each sequence position `p ≥ 1` maps to the
//! unique entry of the row holding its prefix `..=p`; the loss reads it there, so a
//! shared token's gradient is the sum over the sequences that read it.

use std::collections::HashMap;
use std::sync::Arc;

use super::error::TrainError;
use super::layout::TreeLayout;
use crate::model::{ModelConfig, TokenId};

/// Token rows laid out as a forest, and what to score.
#[derive(Debug, Clone)]
pub struct PackedBatch {
    /// One token per row of `layout` (`tokens.len() == layout.len()`).
    pub tokens: Vec<TokenId>,
    /// Which rows each row attends to, and each row's RoPE position (its depth).
    pub layout: Arc<TreeLayout>,
    /// Rows whose output is scored…
    pub score_rows: Vec<u32>,
    /// …against these next tokens (same length as `score_rows`).
    pub targets: Vec<TokenId>,
}

/// Refuses a batch the decoder cannot compute: mismatched lengths, a token outside
/// the vocabulary, a path past the context, a non-positive temperature. Every
/// [`Decoder`](super::decoder::Decoder) checks with it.
pub(crate) fn check_batch(
    c: &ModelConfig,
    batch: &PackedBatch,
    temperature: f64,
) -> Result<(), TrainError> {
    let rows = batch.tokens.len();
    if rows != batch.layout.len() || batch.score_rows.len() != batch.targets.len() {
        return Err(TrainError::BadBatch(format!(
            "{rows} tokens, a layout of {} rows, {} scored rows and {} targets",
            batch.layout.len(),
            batch.score_rows.len(),
            batch.targets.len()
        )));
    }
    if let Some(&t) = batch
        .tokens
        .iter()
        .chain(&batch.targets)
        .find(|&&t| t as usize >= c.vocab_size)
    {
        return Err(TrainError::BadBatch(format!(
            "token id {t} is outside the vocabulary of {}",
            c.vocab_size
        )));
    }
    if let Some(&p) = batch.layout.positions().iter().max() {
        if p as usize >= c.max_position_embeddings {
            return Err(TrainError::BadBatch(format!(
                "a path of {} tokens exceeds the context of {}",
                p + 1,
                c.max_position_embeddings
            )));
        }
    }
    if !(temperature.is_finite() && temperature > 0.0) {
        return Err(TrainError::BadBatch(format!(
            "temperature {temperature} must be positive"
        )));
    }
    Ok(())
}

/// One micro-batch: the rows to forward, and where each sequence's tokens are scored.
#[derive(Debug, Clone)]
pub struct Packed {
    /// The rows to forward: a trie of the sequences' prefixes (packed) or one chain
    /// per sequence, with its unique scored entries as `score_rows`/`targets`.
    pub batch: PackedBatch,
    /// The sequences packed here (indices into the caller's list).
    pub seqs: Vec<usize>,
    /// `scored[k][p]`: the unique scored entry of position `p` of sequence `seqs[k]`
    /// (`None` for the first position, which nothing scores, and for positions the
    /// caller did not ask to score).
    pub scored: Vec<Vec<Option<u32>>>,
}

/// Builds micro-batches.
#[derive(Debug)]
struct Builder {
    share: bool,
    tokens: Vec<TokenId>,
    parents: Vec<Option<u32>>,
    /// (parent row + 1 or 0 for a root, token) → row; only when sharing.
    children: HashMap<(u32, TokenId), u32>,
    /// Row → its unique scored entry, once some sequence asks to score it.
    entry_of_row: HashMap<u32, u32>,
    score_rows: Vec<u32>,
    targets: Vec<TokenId>,
    seqs: Vec<usize>,
    scored: Vec<Vec<Option<u32>>>,
}

impl Builder {
    fn new(share: bool) -> Self {
        Builder {
            share,
            tokens: Vec::new(),
            parents: Vec::new(),
            children: HashMap::new(),
            entry_of_row: HashMap::new(),
            score_rows: Vec::new(),
            targets: Vec::new(),
            seqs: Vec::new(),
            scored: Vec::new(),
        }
    }

    /// Rows this sequence would add.
    fn new_rows(&self, tokens: &[TokenId]) -> usize {
        if !self.share {
            return tokens.len();
        }
        let mut at = 0u32;
        for (i, &t) in tokens.iter().enumerate() {
            match self.children.get(&(at, t)) {
                Some(&row) => at = row + 1,
                None => return tokens.len() - i,
            }
        }
        0
    }

    fn add(&mut self, index: usize, tokens: &[TokenId], wanted: &[bool]) {
        let mut at = 0u32; // parent row + 1, 0 at the root
        let mut scored = vec![None; tokens.len()];
        for (p, &t) in tokens.iter().enumerate() {
            let existing = if self.share {
                self.children.get(&(at, t)).copied()
            } else {
                None
            };
            let row = match existing {
                Some(row) => row,
                None => {
                    let row = self.tokens.len() as u32;
                    self.tokens.push(t);
                    self.parents.push(at.checked_sub(1));
                    if self.share {
                        self.children.insert((at, t), row);
                    }
                    row
                }
            };
            if p > 0 && wanted.get(p).copied().unwrap_or(false) {
                let entry = *self.entry_of_row.entry(row).or_insert_with(|| {
                    self.score_rows.push(at - 1);
                    self.targets.push(t);
                    self.score_rows.len() as u32 - 1
                });
                scored[p] = Some(entry);
            }
            at = row + 1;
        }
        self.seqs.push(index);
        self.scored.push(scored);
    }

    fn finish(self) -> Packed {
        let layout = TreeLayout::new(self.parents).expect("parents are created first");
        Packed {
            batch: PackedBatch {
                tokens: self.tokens,
                layout: Arc::new(layout),
                score_rows: self.score_rows,
                targets: self.targets,
            },
            seqs: self.seqs,
            scored: self.scored,
        }
    }
}

/// Packs `seqs` (full token sequences, with the positions whose token is to be scored)
/// into micro-batches of at most `max_rows` rows (a sequence longer than that gets a
/// batch of its own). With `share`, sequences in one micro-batch share their common
/// prefixes (a trie); without, each is its own chain. Sequences keep their order.
pub fn pack(seqs: &[(&[TokenId], &[bool])], share: bool, max_rows: usize) -> Vec<Packed> {
    let mut out = Vec::new();
    let mut b = Builder::new(share);
    for (i, (tokens, wanted)) in seqs.iter().enumerate() {
        if !b.seqs.is_empty() && b.tokens.len() + b.new_rows(tokens) > max_rows {
            out.push(std::mem::replace(&mut b, Builder::new(share)).finish());
        }
        b.add(i, tokens, wanted);
    }
    if !b.seqs.is_empty() {
        out.push(b.finish());
    }
    out
}

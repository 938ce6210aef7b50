//! The logits one forward computed, as one `[rows, vocab]` block a caller keeps from
//! step to step.
//!
//! Why a reused block: at 49,152 logits a row, a decode step of 64 sequences writes
//! 12.6 MB of them. Allocated fresh each step (zeroed, then each row copied out into
//! its own `Vec`), that memory cost the engine thread about 4% of a batch-64 step in
//! `memset`, page faults and copies while the forward's other thread waited. The
//! engine now keeps one [`StepLogits`]: the vocabulary projection writes every element
//! of the rows it needs in place, so nothing is zeroed or copied after the first
//! steps, and the engine samples straight from the block.

use std::ops::Range;

/// A forward's logits: for each sequence of its batch, the rows it asked for
/// (see [`LogitsWanted`](super::LogitsWanted)), each `vocab` wide.
#[derive(Debug, Default)]
pub struct StepLogits {
    /// At least `rows * vocab` floats; grown, never shrunk, so a reused block is
    /// written in place (the elements past the block are stale and never read).
    data: Vec<f32>,
    vocab: usize,
    /// The block rows of each of the batch's sequences, in batch order.
    seq_rows: Vec<Range<usize>>,
}

impl StepLogits {
    /// An empty block (no memory until a forward fills it).
    pub fn new() -> Self {
        Self::default()
    }

    /// Makes the block `vocab` wide with `rows_per_seq[i]` rows for sequence `i`, and
    /// returns its `[rows, vocab]` floats for the caller to overwrite entirely. What
    /// they hold on return is unspecified (a previous step's logits).
    pub(super) fn prepare(&mut self, vocab: usize, rows_per_seq: &[usize]) -> &mut [f32] {
        self.vocab = vocab;
        self.seq_rows.clear();
        let mut rows = 0;
        for &n in rows_per_seq {
            self.seq_rows.push(rows..rows + n);
            rows += n;
        }
        let len = rows * vocab;
        if self.data.len() < len {
            self.data.resize(len, 0.0);
        }
        &mut self.data[..len]
    }

    /// The vocabulary size (the width of every row).
    pub fn vocab(&self) -> usize {
        self.vocab
    }

    /// Sequences in the batch the block was computed for.
    pub fn seq_count(&self) -> usize {
        self.seq_rows.len()
    }

    /// The rows sequence `seq` (its index in the batch) asked for, in position order.
    pub fn rows(&self, seq: usize) -> impl ExactSizeIterator<Item = &[f32]> + '_ {
        let range = self.seq_rows.get(seq).cloned().unwrap_or(0..0);
        range.map(move |r| &self.data[r * self.vocab..(r + 1) * self.vocab])
    }

    /// The last row sequence `seq` asked for, if any.
    pub fn last_row(&self, seq: usize) -> Option<&[f32]> {
        self.rows(seq).last()
    }

    /// Each sequence's rows copied into vectors of their own, in batch order.
    pub fn to_vecs(&self) -> Vec<Vec<Vec<f32>>> {
        (0..self.seq_count())
            .map(|s| self.rows(s).map(<[f32]>::to_vec).collect())
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_reused_block_hands_out_each_sequences_rows_of_the_latest_step_only() {
        let mut logits = StepLogits::new();
        let block = logits.prepare(3, &[2, 0, 1]);
        for (i, x) in block.iter_mut().enumerate() {
            *x = i as f32;
        }
        assert_eq!(logits.seq_count(), 3);
        assert_eq!(
            logits.to_vecs(),
            vec![
                vec![vec![0.0, 1.0, 2.0], vec![3.0, 4.0, 5.0]],
                vec![],
                vec![vec![6.0, 7.0, 8.0]],
            ]
        );
        assert_eq!(logits.last_row(1), None);

        // A smaller step reuses the memory; what lies past its rows is never handed out.
        let block = logits.prepare(2, &[1]);
        block.copy_from_slice(&[-1.0, -2.0]);
        assert_eq!(logits.seq_count(), 1);
        assert_eq!(logits.vocab(), 2);
        assert_eq!(logits.last_row(0), Some(&[-1.0, -2.0][..]));
        assert_eq!(logits.rows(5).len(), 0);
    }
}

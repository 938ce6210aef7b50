//! Forward-level batch invariance: a sequence's logits alone and beside others.

use treegrpo::model::{BatchSeq, DenseKvStore, ForwardBatch, KvSlot, LoadedModel, LogitsWanted};

/// One sequence's logits, one row per position.
pub type Logits = Vec<Vec<f32>>;

/// Logits of every new token of each sequence, all computed in one forward per step:
/// each `steps[i]` lists (sequence, tokens) pairs fed together.
pub fn run_steps(
    m: &LoadedModel,
    seqs: usize,
    steps: &[Vec<(usize, Vec<u32>)>],
) -> Vec<Vec<Vec<f32>>> {
    let cfg = m.model.config();
    let mut kv = DenseKvStore::new(cfg.num_layers, cfg.kv_dim());
    let slots: Vec<KvSlot> = (0..seqs).map(|_| kv.add_sequence()).collect();
    let mut out = vec![Vec::new(); seqs];
    for step in steps {
        let batch = ForwardBatch {
            seqs: step
                .iter()
                .map(|(s, tokens)| BatchSeq {
                    slot: slots[*s],
                    start: kv.len(slots[*s]),
                    tokens: tokens.clone(),
                    logits: LogitsWanted::All,
                })
                .collect(),
        };
        let logits = m.model.forward(&batch, &mut kv).unwrap();
        for ((s, _), l) in step.iter().zip(logits) {
            out[*s].extend(l.rows);
        }
    }
    out
}

/// Sequence 0 alone, then beside two others (a longer prefill and a decode), must give
/// bit-identical logits at every position.
pub fn assert_batch_invariant(m: &LoadedModel, a: &[u32], what: &str) -> Vec<Vec<f32>> {
    let (head, tail) = a.split_at(a.len() - 2);
    let alone = run_steps(
        m,
        1,
        &[
            vec![(0, head.to_vec())],
            vec![(0, tail[..1].to_vec())],
            vec![(0, tail[1..].to_vec())],
        ],
    );
    let other: Vec<u32> = a.iter().rev().copied().chain(a.iter().copied()).collect();
    let batched = run_steps(
        m,
        3,
        &[
            vec![(1, other.clone()), (0, head.to_vec()), (2, vec![a[0]])],
            vec![
                (2, vec![a[1], a[2]]),
                (0, tail[..1].to_vec()),
                (1, vec![a[3]]),
            ],
            vec![(0, tail[1..].to_vec()), (1, other[..5].to_vec())],
        ],
    );
    assert_eq!(alone[0].len(), a.len());
    for (pos, (x, y)) in alone[0].iter().zip(&batched[0]).enumerate() {
        assert!(
            x == y,
            "{what}: position {pos} differs alone and in a batch"
        );
    }
    alone.into_iter().next().unwrap()
}

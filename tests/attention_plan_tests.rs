//! How an attention plan splits a batch's work over the forward's team: every item
//! once, in contiguous ranges of about equal cost (sequences differ in context length
//! several-fold), and each query head's own item for a single token only.

use treegrpo::model::attention::{AttentionPlan, AttentionShape, SeqSpan};
use treegrpo::model::{DenseKvStore, KvStore};

const SHAPE: AttentionShape = AttentionShape {
    num_heads: 9,
    num_kv_heads: 3,
    head_dim: 64,
};

/// A one-layer store holding sequences of `lens` positions, and one new token each
/// (decode) at the end of each, or `prefill` tokens for the first.
fn store_and_spans(lens: &[usize], prefill: usize) -> (DenseKvStore, Vec<SeqSpan>) {
    let kv_dim = SHAPE.num_kv_heads * SHAPE.head_dim;
    let mut store = DenseKvStore::new(1, kv_dim);
    let mut spans = Vec::new();
    let mut row = 0;
    for (s, &len) in lens.iter().enumerate() {
        let slot = store.add_sequence();
        let new = if s == 0 { prefill.max(1) } else { 1 };
        for p in 0..len + new {
            let v: Vec<f32> = (0..kv_dim)
                .map(|i| ((p * 31 + i) % 17) as f32 * 0.1)
                .collect();
            store.store(0, slot, p, &v, &v).unwrap();
        }
        spans.push(SeqSpan {
            slot,
            start: len,
            row,
            len: new,
        });
        row += new;
    }
    (store, spans)
}

#[test]
fn members_take_every_item_once_in_ranges_of_about_equal_cost() {
    for (lens, prefill) in [
        (vec![1500, 100, 700, 40, 1200, 900, 300], 1),
        (vec![2000, 30], 1),
        (vec![500, 600, 50], 64),
        (vec![10], 1),
    ] {
        let (store, spans) = store_and_spans(&lens, prefill);
        let plan = AttentionPlan::new(&store, 0, &spans, SHAPE);
        let costs: Vec<u64> = (0..plan.items()).map(|i| plan.item_cost(i)).collect();
        let total: u64 = costs.iter().sum();
        let largest = costs.iter().copied().max().unwrap_or(0);
        for size in 1..=4 {
            let shares: Vec<_> = (0..size).map(|m| plan.share(m, size)).collect();
            // Contiguous, in order, covering 0..items.
            assert_eq!(shares[0].start, 0);
            assert_eq!(shares[size - 1].end, plan.items());
            for w in shares.windows(2) {
                assert_eq!(w[0].end, w[1].start, "{lens:?} size {size}");
            }
            // Each within one item of an equal share.
            for share in &shares {
                let cost: u64 = costs[share.clone()].iter().sum();
                let ideal = total / size as u64;
                assert!(
                    cost.abs_diff(ideal) <= largest + 1,
                    "{lens:?} size {size}: {cost} against {ideal} (largest item {largest})"
                );
            }
        }
    }
}

#[test]
fn a_single_token_splits_by_query_head_and_two_tokens_by_kv_group() {
    let (store, spans) = store_and_spans(&[300], 1);
    let plan = AttentionPlan::new(&store, 0, &spans, SHAPE);
    assert_eq!(plan.items(), 9, "one item per query head");
    let (store, spans) = store_and_spans(&[300, 200], 1);
    let plan = AttentionPlan::new(&store, 0, &spans, SHAPE);
    assert_eq!(plan.items(), 6, "one item per (token, KV head)");
    assert_eq!(plan.item_output(0).len(), 3 * SHAPE.head_dim);
}

//! The paged KV cache under the real forward pass (a tiny seeded model with f32
//! weights): chunked prefill, forked branches decoding together in one batch, and a
//! prompt started from cached prefix blocks.
//!
//! Where the batches have the same shapes, paged and dense must agree bit for bit
//! (attention reads the same values in the same order, only split into blocks). Across
//! different batch shapes the f32 (candle) matmuls may round differently, so those
//! comparisons allow a small tolerance.

mod common;

use candle_core::DType;
use common::max_abs_diff;
use common::tiny::{logits_all, Flavour, TinyModel};
use treegrpo::kv::{KvCache, KvConfig, SeqId};
use treegrpo::model::{
    BatchSeq, DenseKvStore, ForwardBatch, KvSlot, KvStore, LoadedModel, LogitsWanted, Model,
};

const TOL: f32 = 1e-4;

fn tiny() -> (tempfile::TempDir, LoadedModel) {
    let tmp = tempfile::tempdir().unwrap();
    TinyModel::new(Flavour::Llama, 7).write_hf(tmp.path(), DType::F32, 1);
    let m = LoadedModel::load(tmp.path()).unwrap();
    (tmp, m)
}

fn paged(model: &Model) -> KvCache {
    let cfg = model.config();
    KvCache::for_model(
        KvConfig {
            block_size: 4,
            budget_bytes: 64 * 4 * cfg.kv_bytes_per_token(),
            format: treegrpo::model::KvFormat::F32,
        },
        cfg,
    )
    .unwrap()
}

/// One forward over `work` (slot, start, tokens), every row's logits.
fn forward(
    model: &Model,
    kv: &mut dyn KvStore,
    work: &[(KvSlot, usize, Vec<u32>)],
) -> Vec<Vec<Vec<f32>>> {
    let batch = ForwardBatch {
        seqs: work
            .iter()
            .map(|(slot, start, tokens)| BatchSeq {
                slot: *slot,
                start: *start,
                tokens: tokens.clone(),
                logits: LogitsWanted::All,
            })
            .collect(),
    };
    let out = model.forward(&batch, kv).unwrap();
    out.into_iter().map(|s| s.rows).collect()
}

/// One engine step on the paged cache: reserve, forward, commit.
fn step(model: &Model, kv: &mut KvCache, work: &[(SeqId, Vec<u32>)]) -> Vec<Vec<Vec<f32>>> {
    let mut w = Vec::new();
    for (seq, tokens) in work {
        kv.reserve(*seq, tokens.len()).unwrap();
        w.push((seq.slot(), kv.seq_len(*seq).unwrap(), tokens.clone()));
    }
    let out = forward(model, kv, &w);
    for (seq, tokens) in work {
        kv.commit(*seq, tokens).unwrap();
    }
    kv.check_invariants().unwrap();
    out
}

fn prompt() -> Vec<u32> {
    (0..10).map(|i| 3 + (i * 37) % 250).collect()
}

#[test]
fn paged_prefill_is_bit_identical_to_dense() {
    let (_tmp, m) = tiny();
    let model = &*m.model;
    let cfg = model.config();
    let prompt = prompt();

    let mut kv = paged(model);
    let one = kv.new_sequence();
    let out = step(model, &mut kv, &[(one, prompt.clone())]);
    assert_eq!(out[0], logits_all(&m, &prompt), "one-shot prefill");

    // Chunks that straddle block boundaries, against the dense store chunked alike.
    let chunked = kv.new_sequence();
    let mut dense = DenseKvStore::new(cfg.num_layers, cfg.kv_dim());
    let slot = dense.add_sequence();
    for (a, b) in [(0, 3), (3, 9), (9, 10)] {
        let p = step(model, &mut kv, &[(chunked, prompt[a..b].to_vec())]);
        let d = forward(model, &mut dense, &[(slot, a, prompt[a..b].to_vec())]);
        assert_eq!(p, d, "chunk {a}..{b}");
    }
}

#[test]
fn forked_branches_decode_together_like_separate_dense_sequences() {
    let (_tmp, m) = tiny();
    let model = &*m.model;
    let cfg = model.config();
    let prompt = prompt();
    let chunks = [(0, 3), (3, 10)];

    let mut kv = paged(model);
    let root = kv.new_sequence();
    for (a, b) in chunks {
        step(model, &mut kv, &[(root, prompt[a..b].to_vec())]);
    }
    let pin = kv.pin(root).unwrap();
    let branches: Vec<SeqId> = (0..3).map(|_| kv.fork(root).unwrap()).collect();
    kv.free(root).unwrap();

    // Reference: three dense sequences, each prefilled the same way.
    let mut dense = DenseKvStore::new(cfg.num_layers, cfg.kv_dim());
    let slots: Vec<KvSlot> = (0..3).map(|_| dense.add_sequence()).collect();
    for &s in &slots {
        for (a, b) in chunks {
            forward(model, &mut dense, &[(s, a, prompt[a..b].to_vec())]);
        }
    }

    let mut paths: Vec<Vec<u32>> = vec![prompt.clone(); 3];
    for t in 0..7u32 {
        let toks: Vec<u32> = (0..3).map(|i| 40 + 50 * i + t).collect();
        let work: Vec<(SeqId, Vec<u32>)> = branches
            .iter()
            .zip(&toks)
            .map(|(&s, &t)| (s, vec![t]))
            .collect();
        let p = step(model, &mut kv, &work);
        let dwork: Vec<(KvSlot, usize, Vec<u32>)> = slots
            .iter()
            .zip(&toks)
            .map(|(&s, &t)| (s, dense.len(s), vec![t]))
            .collect();
        let d = forward(model, &mut dense, &dwork);
        assert_eq!(p, d, "decode step {t}: paged branches == dense sequences");
        for (i, &tok) in toks.iter().enumerate() {
            paths[i].push(tok);
            let want = logits_all(&m, &paths[i]);
            assert!(max_abs_diff(&p[i][0], want.last().unwrap()) < TOL);
        }
    }
    // Each branch copied the root's partly filled block once; the rest is shared.
    assert_eq!(kv.stats().cow_copies, 3);
    assert_eq!(kv.blocks_in_use(), 3 + 3 * (17usize.div_ceil(4) - 10 / 4));

    for b in branches {
        kv.free(b).unwrap();
    }
    kv.unpin(pin).unwrap();
    assert_eq!(kv.blocks_in_use(), 0);
}

#[test]
fn a_prompt_started_from_cached_blocks_gives_the_same_logits() {
    let (_tmp, m) = tiny();
    let model = &*m.model;
    let prompt = prompt();
    let mut kv = paged(model);
    let first = kv.new_sequence();
    step(model, &mut kv, &[(first, prompt.clone())]);
    kv.free(first).unwrap();

    // Shares the first 9 tokens: the 2 full blocks (8 tokens) come from the cache.
    let mut other = prompt[..9].to_vec();
    other.extend([200, 201, 202]);
    let (s, cached) = kv.start_sequence(&other);
    assert_eq!(cached, 8);
    let out = step(model, &mut kv, &[(s, other[cached..].to_vec())]);
    let want = logits_all(&m, &other);
    for (got, want) in out[0].iter().zip(&want[cached..]) {
        assert!(max_abs_diff(got, want) < TOL);
    }
    // The same prompt again: all full blocks cached, the last token recomputed.
    let (again, cached) = kv.start_sequence(&prompt[..8]);
    assert_eq!(cached, 7);
    let out = step(model, &mut kv, &[(again, prompt[7..8].to_vec())]);
    assert!(max_abs_diff(&out[0][0], &logits_all(&m, &prompt[..8])[7]) < TOL);
}

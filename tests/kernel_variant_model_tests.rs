//! Every kernel variant this CPU runs (AVX-512, AVX2, scalar), forced in turn, on whole
//! models: the logits oracle against candle-transformers (1e-3, as in
//! `model_oracle_tests`), zero-tolerance batch invariance of the forward, and identical
//! logits across variants. Dense weights get the same batch-invariance check on HF
//! safetensors models in f32 and bf16, and the default model served dense in f32
//! (`LoadedModel::with_dense_weights`) gives bit-identically the Q4 model's logits.
//!
//! The variant is a process-wide setting, so everything runs in one test function
//! (no other test in this binary can run a forward meanwhile).

mod common;

use candle_core::DType;
use common::oracle::{candle_logits, candle_model};
use common::tiny::{Flavour, TinyModel};
use treegrpo::model::kernels::{Isa, WeightFormat};
use treegrpo::model::{
    BatchSeq, ChatMessage, DenseKvStore, ForwardBatch, LoadedModel, LogitsWanted,
};

/// One sequence's logits, one row per position.
type Logits = Vec<Vec<f32>>;

/// Logits of every new token of each sequence, all computed in one forward per step:
/// each `steps[i]` lists (sequence, tokens) pairs fed together.
fn run_steps(m: &LoadedModel, seqs: usize, steps: &[Vec<(usize, Vec<u32>)>]) -> Vec<Vec<Vec<f32>>> {
    let cfg = m.model.config();
    let mut kv = DenseKvStore::new(cfg.num_layers, cfg.kv_dim());
    let slots: Vec<usize> = (0..seqs).map(|_| kv.add_sequence()).collect();
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
fn assert_batch_invariant(m: &LoadedModel, a: &[u32], what: &str) -> Vec<Vec<f32>> {
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

#[test]
fn every_kernel_variant_passes_the_oracle_and_batch_invariance() {
    let path = common::default_model();
    let model = LoadedModel::load(&path).unwrap();
    let tokens = model
        .chat_prompt(&[ChatMessage::new("user", "What is the capital of France?")])
        .unwrap();
    let oracle = candle_logits(&mut candle_model(&path), &tokens);
    // The same model served dense (as a trainer's weights are): f32 holds exactly the
    // values the Q4 kernel multiplies by, so its logits must be bit-identical.
    let dense_f32 = LoadedModel::load(&path)
        .unwrap()
        .with_dense_weights(WeightFormat::F32)
        .unwrap();

    let tmp = tempfile::tempdir().unwrap();
    let tiny = TinyModel::new(Flavour::Qwen2, 5);
    let mut dense = Vec::new();
    for dtype in [DType::F32, DType::BF16] {
        let dir = tmp.path().join(format!("{dtype:?}"));
        tiny.write_hf(&dir, dtype, 1);
        dense.push((dtype, LoadedModel::load(&dir).unwrap()));
    }
    // Short enough that the other sequences of the check (twice as long, plus a few
    // steps) stay inside the tiny model's 64-token context.
    let dense_tokens: Vec<u32> = (0..20u32).map(|i| (i * 37 + 11) % 283).collect();

    let mut first: Option<(Isa, Logits, Vec<Logits>)> = None;
    for isa in Isa::ALL.into_iter().filter(|i| i.available()) {
        isa.force().unwrap();
        let ours = assert_batch_invariant(&model, &tokens, &format!("{isa:?} default model"));
        let worst = ours
            .iter()
            .zip(&oracle)
            .map(|(a, b)| common::max_abs_diff(a, b))
            .fold(0f32, f32::max);
        eprintln!("{isa:?}: worst |Δlogit| vs candle = {worst:.6}");
        let served_dense = assert_batch_invariant(
            &dense_f32,
            &tokens,
            &format!("{isa:?} dense f32 default model"),
        );
        assert!(
            served_dense == ours,
            "{isa:?}: dense f32 copy differs from the Q4 model"
        );
        assert!(
            worst <= 1e-3,
            "{isa:?}: |Δlogit| {worst} vs candle-transformers"
        );
        let dense_logits: Vec<_> = dense
            .iter()
            .map(|(dtype, m)| {
                assert_batch_invariant(m, &dense_tokens, &format!("{isa:?} {dtype:?}"))
            })
            .collect();
        match &first {
            None => first = Some((isa, ours, dense_logits)),
            Some((base, q, d)) => {
                assert!(
                    &ours == q,
                    "{isa:?} and {base:?} differ on the default model"
                );
                assert!(
                    &dense_logits == d,
                    "{isa:?} and {base:?} differ on dense models"
                );
            }
        }
    }
}

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
use common::batch::{assert_batch_invariant, Logits};
use common::oracle::{candle_logits, candle_model};
use common::tiny::{Flavour, TinyModel};
use treegrpo::model::kernels::{Isa, WeightFormat};
use treegrpo::model::{ChatMessage, LoadedModel};

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

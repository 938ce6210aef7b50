//! Our decoder against an independent implementation: candle-transformers' quantised
//! llama, run on the same GGUF file.
//!
//! candle runs in its `CANDLE_DEQUANTIZE_ALL` mode: every quantised weight is
//! dequantised to f32 once and multiplied in f32. That is exactly the arithmetic our
//! kernel performs (f32 activations against the same blocks' exact f32 values), so the
//! two implementations may differ only by summation order. (candle's default CPU mode
//! instead rounds every activation row to 8 bits before the matmul; against that mode
//! logits move by about one unit and greedy answers change, so it is not an oracle.)
//!
//! Tolerance: 1e-3 absolute on logits that span 30-60 units. Differences in f32
//! summation order are ~1e-6 relative per op; over 30 layers they stay below ~1e-3
//! (measured worst case, printed by the test: 1.8e-4), so 1e-3 leaves room without hiding
//! a real bug: a wrong RoPE pair or a swapped head moves logits by whole units.

mod common;

use common::oracle::{candle_logits, candle_model, dequantize_all_in_candle};
use common::tiny::logits_all;

use candle_core::{Device, Tensor};
use treegrpo::model::{ChatMessage, LoadedModel};

const PROMPTS: [&str; 3] = [
    "What is the capital of France?",
    "Write a haiku about the sea.",
    "List three prime numbers greater than 10, separated by commas.",
];
const TOLERANCE: f32 = 1e-3;

#[test]
fn logits_match_candle_transformers_at_every_position() {
    dequantize_all_in_candle();
    let path = common::default_model();
    let ours = LoadedModel::load(&path).unwrap();
    for prompt in PROMPTS {
        let tokens = ours
            .chat_prompt(&[ChatMessage::new("user", prompt)])
            .unwrap();
        let mut theirs = candle_model(&path);
        let expected = candle_logits(&mut theirs, &tokens);
        let got = logits_all(&ours, &tokens);
        assert_eq!(got.len(), tokens.len());
        let mut worst = 0f32;
        for (pos, (g, e)) in got.iter().zip(&expected).enumerate() {
            let d = common::max_abs_diff(g, e);
            worst = worst.max(d);
            assert!(
                d <= TOLERANCE,
                "{prompt:?} position {pos}: max |Δlogit| = {d}"
            );
            assert_eq!(
                common::argmax(g),
                common::argmax(e),
                "{prompt:?} position {pos}: argmax differs"
            );
        }
        eprintln!(
            "{prompt:?}: {} positions, worst |Δlogit| = {worst:.5}",
            tokens.len()
        );
    }
}

#[test]
fn greedy_continuations_match_candle_transformers() {
    dequantize_all_in_candle();
    let path = common::default_model();
    let ours = LoadedModel::load(&path).unwrap();
    for prompt in PROMPTS {
        let tokens = ours
            .chat_prompt(&[ChatMessage::new("user", prompt)])
            .unwrap();
        let req = common::single_sequence::GenerateRequest {
            penalties: treegrpo::engine::Penalties::NONE,
            prompt: tokens.clone(),
            max_new_tokens: 32,
            sampling: treegrpo::engine::Sampling::Greedy,
            seed: 0,
            stop_tokens: Vec::new(),
            prefill_chunk: 512,
        };
        let got: Vec<u32> = common::single_sequence::generate(&ours.model, &req)
            .unwrap()
            .tokens
            .iter()
            .map(|t| t.token)
            .collect();

        let mut theirs = candle_model(&path);
        let mut logits = candle_logits(&mut theirs, &tokens).pop().unwrap();
        let mut expected = Vec::new();
        for pos in tokens.len()..tokens.len() + 32 {
            let next = common::argmax(&logits) as u32;
            expected.push(next);
            let x = Tensor::new(&[next], &Device::Cpu)
                .unwrap()
                .unsqueeze(0)
                .unwrap();
            logits = theirs
                .forward(&x, pos)
                .unwrap()
                .flatten_all()
                .unwrap()
                .to_vec1()
                .unwrap();
        }
        assert_eq!(got, expected, "{prompt:?}");
    }
}

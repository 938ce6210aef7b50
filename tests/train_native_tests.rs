//! The native training decoder (`train::native`: the engine's forward over a packed
//! trie, hand-written backward kernels) against its oracles.
//!
//! - Every gradient of a random 2-layer model of each family (llama: tied head,
//!   interleaved RoPE; qwen2: q/k/v biases, untied head, half-split RoPE) equals the
//!   candle-autodiff decoder's within 1e-5 of the tensor's largest gradient, in f32,
//!   for a surrogate `Σ g·log p + Σ e·H` with random `g` and `e` on packed trees; the
//!   log-probabilities and entropies agree too, and every weight gets a gradient.
//! - On dense f32 weights, rollouts sampled by the engine and then `treegrpo update
//!   --lr 0` give `rollout_logprob_diff_max` exactly 0 and every TIS weight exactly 1:
//!   the trainer computes the engine's numbers bit for bit.

mod common;

use std::process::Command;
use std::sync::Arc;

use candle_core::{DType, Device, Tensor};
use common::rng::Rng;
use common::tiny::{Flavour, TinyModel};
use treegrpo::model::LoadedModel;
use treegrpo::train::native::{Grads, NativeDecoder};
use treegrpo::train::pack::pack;
use treegrpo::train::{PackedBatch, Params, TreeLayout};

fn params(tiny: &TinyModel) -> Params {
    let tmp = tempfile::tempdir().unwrap();
    let path = tmp.path().join("tiny.gguf");
    tiny.write_gguf(&path);
    let m = LoadedModel::load(&path).unwrap();
    Params::from_model(&m.model, DType::F32).unwrap()
}

/// A trie of several trajectories of random tokens that share prefixes at random
/// points, every position scored.
fn trie_batch(rng: &mut Rng, vocab: usize) -> PackedBatch {
    let mut seqs: Vec<Vec<u32>> = Vec::new();
    for _ in 0..3 {
        let len = rng.range(3, 9);
        let prompt = rng.tokens(len, vocab);
        let mut made: Vec<Vec<u32>> = Vec::new();
        for _ in 0..4 {
            let parent = rng.pick(&(0..made.len()).collect::<Vec<_>>());
            let mut s = match parent {
                Some(i) if rng.chance(70) => {
                    let cut = rng.range(prompt.len(), made[i].len());
                    made[i][..cut].to_vec()
                }
                _ => prompt.clone(),
            };
            let grow = rng.range(2, 12);
            s.extend(rng.tokens(grow, vocab));
            made.push(s);
        }
        seqs.extend(made);
    }
    let wanted: Vec<Vec<bool>> = seqs.iter().map(|s| vec![true; s.len()]).collect();
    let inputs: Vec<(&[u32], &[bool])> = seqs
        .iter()
        .zip(&wanted)
        .map(|(s, w)| (s.as_slice(), w.as_slice()))
        .collect();
    let packed = pack(&inputs, true, 1 << 20);
    assert_eq!(packed.len(), 1);
    packed[0].batch.clone()
}

fn flat(t: &Tensor) -> Vec<f64> {
    t.to_dtype(DType::F64)
        .unwrap()
        .flatten_all()
        .unwrap()
        .to_vec1::<f64>()
        .unwrap()
}

fn check_against_oracle(flavour: Flavour, seed: u64) {
    let tiny = TinyModel::new(flavour, seed);
    let p = params(&tiny);
    let mut rng = Rng::new(seed);
    let batch = trie_batch(&mut rng, tiny.vocab.tokens.len());
    let temperature = 0.7;
    let m = batch.targets.len();
    let g_logp: Vec<f64> = (0..m).map(|_| rng.normal()).collect();
    let g_entropy: Vec<f64> = (0..m).map(|_| 0.3 * rng.normal()).collect();

    // The oracle: candle autodiff through the composed decoder.
    let scored = p.score(&batch, temperature, true).unwrap();
    let entropy_t = scored.entropy.clone().unwrap();
    let g = Tensor::from_vec(
        g_logp.iter().map(|&v| v as f32).collect::<Vec<_>>(),
        m,
        &Device::Cpu,
    )
    .unwrap();
    let e = Tensor::from_vec(
        g_entropy.iter().map(|&v| v as f32).collect::<Vec<_>>(),
        m,
        &Device::Cpu,
    )
    .unwrap();
    let surrogate = ((&scored.logp * g).unwrap().sum_all().unwrap()
        + (&entropy_t * e).unwrap().sum_all().unwrap())
    .unwrap();
    let store = surrogate.backward().unwrap();

    let dec = NativeDecoder::new(&p).unwrap();
    let fwd = dec.forward(&batch, temperature, true).unwrap();
    for (name, ours, theirs) in [
        ("logp", &fwd.logp, flat(&scored.logp)),
        ("entropy", &fwd.entropy, flat(&entropy_t)),
    ] {
        for (a, b) in ours.iter().zip(&theirs) {
            assert!(
                (a - b).abs() <= 2e-5 * (1.0 + b.abs()),
                "{name}: {a} vs {b}"
            );
        }
    }
    let mut grads = Grads::zeros(&p);
    dec.backward(&batch, fwd, &g_logp, &g_entropy, &mut grads)
        .unwrap();
    let ours = grads.into_tensors().unwrap();
    for ((name, var), ours) in p.named().iter().zip(&ours) {
        let theirs = flat(
            store
                .get(var.as_tensor())
                .expect("the oracle reaches every weight"),
        );
        let ours = flat(ours);
        let scale = theirs.iter().map(|x| x.abs()).fold(0.0, f64::max);
        assert!(scale > 0.0, "{name}: the oracle's gradient is zero");
        let ours_scale = ours.iter().map(|x| x.abs()).fold(0.0, f64::max);
        assert!(
            ours_scale > 0.0 && ours_scale.is_finite(),
            "{name}: no gradient"
        );
        let err = ours
            .iter()
            .zip(&theirs)
            .map(|(a, b)| (a - b).abs())
            .fold(0.0, f64::max);
        assert!(
            err <= 1e-5 * scale,
            "{name}: max |Δ| {err} at scale {scale}"
        );
    }
    eprintln!(
        "{flavour:?}: {} rows, {m} targets, {} weights agree",
        batch.tokens.len(),
        ours.len()
    );
}

#[test]
fn llama_gradients_match_the_candle_oracle() {
    check_against_oracle(Flavour::Llama, 3);
}

#[test]
fn qwen2_gradients_match_the_candle_oracle() {
    check_against_oracle(Flavour::Qwen2, 4);
}

#[test]
fn a_chain_and_a_single_row_batch_match_the_oracle_too() {
    let tiny = TinyModel::new(Flavour::Llama, 9);
    let p = params(&tiny);
    let dec = NativeDecoder::new(&p).unwrap();
    for tokens in [vec![7u32], vec![7, 8, 9, 10, 11]] {
        let n = tokens.len();
        let batch = PackedBatch {
            layout: Arc::new(TreeLayout::chains(&[n])),
            score_rows: (0..n as u32).collect(),
            targets: tokens.iter().map(|t| t + 1).collect(),
            tokens,
        };
        let fwd = dec.forward(&batch, 1.0, false).unwrap();
        let oracle = flat(&p.score(&batch, 1.0, false).unwrap().logp);
        for (a, b) in fwd.logp.iter().zip(&oracle) {
            assert!((a - b).abs() <= 2e-5 * (1.0 + b.abs()), "{a} vs {b}");
        }
    }
}

/// The engine's rollouts, then an update at lr 0 on them: the trainer's
/// log-probabilities are the rollout's exactly (dense f32 weights).
#[test]
fn rollout_then_update_reports_a_zero_logprob_gap_on_dense_weights() {
    let dir = tempfile::tempdir().unwrap();
    let model = dir.path().join("model");
    common::tiny::write_long_context(&model, 5);
    let bin = env!("CARGO_BIN_EXE_treegrpo");
    let out = dir.path().join("rollout");
    let o = Command::new(bin)
        .args([
            "rollout",
            "--task",
            "calc",
            "--prompts",
            "2",
            "--trees",
            "2",
            "--expand",
            "2",
        ])
        .args([
            "--max-step-tokens",
            "12",
            "--turns",
            "2",
            "--temperature",
            "0.8",
            "--seed",
            "3",
        ])
        .arg("--model")
        .arg(&model)
        .arg("--out")
        .arg(&out)
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let o = Command::new(bin)
        .args(["update", "--lr", "0", "--micro-batch-tokens", "64"])
        .arg("--model")
        .arg(&model)
        .arg("--trajectories")
        .arg(out.join("trajectories.jsonl"))
        .arg("--out")
        .arg(dir.path().join("updated"))
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let line: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert!(line["tokens"].as_u64().unwrap() > 20, "{line}");
    assert_eq!(
        line["rollout_logprob_diff_max"].as_f64(),
        Some(0.0),
        "{line}"
    );
    assert_eq!(
        line["rollout_logprob_diff_mean"].as_f64(),
        Some(0.0),
        "{line}"
    );
    assert_eq!(line["tis_mean"].as_f64(), Some(1.0), "{line}");
}

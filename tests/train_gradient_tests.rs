//! The update's gradient against oracles.
//!
//! - Central finite differences of the full loss (dual-clipped PPO term with ratios
//!   inside, below, above and beyond the dual clip and past the log-ratio clamp, TIS
//!   weights capped and not, k3 KL and entropy bonus on) for **every** weight of a
//!   tiny model of each family, in f64. Tolerance: `|fd − g| ≤ 1e-7 + 1e-5·|g|`. With
//!   step h = 1e-5 the truncation error is O(h²·L''') ≈ 1e-10 and the rounding error
//!   about 1e-16/h ≈ 1e-11, so a correct gradient passes by three orders of magnitude
//!   while a wrong one (a dropped mask, a missing term) misses by many more — the
//!   second test shows the check failing on a deliberately dropped mask.
//! - Packed (a trie) equals unpacked (one chain per trajectory): the loss and every
//!   gradient, on random trees with mixed-sign advantages, masked observations and
//!   nodes of several children, within 1e-5 relative in f32.
//! - SGD moves every weight by exactly −lr × its gradient.

mod common;

use candle_core::{DType, Tensor};
use common::rng::Rng;
use common::tiny::{Flavour, TinyModel};
use treegrpo::model::LoadedModel;
use treegrpo::train::{
    LossAgg, LossConfig, Optimizer, OptimizerConfig, OptimizerKind, Params, TrainSample, Update,
    UpdateConfig,
};

fn params(tiny: &TinyModel, dtype: DType) -> Params {
    let tmp = tempfile::tempdir().unwrap();
    let path = tmp.path().join("tiny.gguf");
    tiny.write_gguf(&path);
    let m = LoadedModel::load(&path).unwrap();
    Params::from_model(&m.model, dtype).unwrap()
}

/// Samples of two prompts, trajectories sharing prefixes (as a tree's leaves do),
/// observation tokens masked, advantages of both signs.
fn tree_samples(rng: &mut Rng, vocab: usize, prompts: usize, leaves: usize) -> Vec<TrainSample> {
    let mut out = Vec::new();
    for _ in 0..prompts {
        let len = rng.range(2, 5);
        let prompt = rng.tokens(len, vocab);
        let mut made: Vec<Vec<u32>> = Vec::new();
        let mut masks: Vec<Vec<u8>> = Vec::new();
        for _ in 0..leaves {
            // Branch from a random point of an earlier leaf's response, or start fresh.
            let (mut resp, mut mask) = match rng.pick(&(0..made.len()).collect::<Vec<_>>()) {
                Some(i) if rng.chance(70) => {
                    let cut = rng.below(made[i].len() + 1);
                    (made[i][..cut].to_vec(), masks[i][..cut].to_vec())
                }
                _ => (Vec::new(), Vec::new()),
            };
            for _ in 0..rng.range(1, 3) {
                let step = rng.range(1, 4);
                resp.extend(rng.tokens(step, vocab));
                mask.extend(std::iter::repeat_n(1u8, step));
                if rng.chance(60) {
                    let obs = rng.range(1, 3);
                    resp.extend(rng.tokens(obs, vocab));
                    mask.extend(std::iter::repeat_n(0u8, obs));
                }
            }
            made.push(resp.clone());
            masks.push(mask.clone());
            let mut tokens = prompt.clone();
            tokens.extend(&resp);
            let adv = rng.normal();
            out.push(TrainSample {
                tokens,
                prompt_len: prompt.len(),
                response_mask: mask,
                rollout_logprobs: None,
                old_logprobs: None,
                ref_logprobs: None,
                advantage: if adv.abs() < 0.05 { 0.5 } else { adv },
            });
        }
    }
    out
}

/// The current policy's log-probability of every response token of every sample.
fn current_logprobs(p: &Params, samples: &[TrainSample]) -> Vec<Vec<f64>> {
    use treegrpo::train::pack::pack;
    let wanted: Vec<Vec<bool>> = samples
        .iter()
        .map(|s| (0..s.tokens.len()).map(|i| i >= s.prompt_len).collect())
        .collect();
    let inputs: Vec<(&[u32], &[bool])> = samples
        .iter()
        .zip(&wanted)
        .map(|(s, w)| (s.tokens.as_slice(), w.as_slice()))
        .collect();
    let packed = &pack(&inputs, false, 1 << 20)[0];
    let logp = p.score(&packed.batch, 1.0, false).unwrap().logp;
    let logp = logp.to_dtype(DType::F64).unwrap().to_vec1::<f64>().unwrap();
    samples
        .iter()
        .enumerate()
        .map(|(k, s)| {
            (s.prompt_len..s.tokens.len())
                .map(|pos| logp[packed.scored[k][pos].unwrap() as usize])
                .collect()
        })
        .collect()
}

/// Old, reference and rollout log-probabilities that put the ratios in every regime
/// of the loss, well away from its kinks (≥ 0.05 in ratio).
fn off_policy(rng: &mut Rng, p: &Params, samples: &mut [TrainSample]) {
    // r = exp(logp - old): below 1-ε, inside, above 1+ε (clipped for A > 0), beyond the
    // dual clip c = 3 (clipped for A < 0), and a log-ratio past the ±20 clamp.
    let log_ratios = [
        0.5f64.ln(),
        0.9f64.ln(),
        1.1f64.ln(),
        1.5f64.ln(),
        3.6f64.ln(),
        21.0,
        -21.5,
    ];
    let current = current_logprobs(p, samples);
    for (s, lp) in samples.iter_mut().zip(current) {
        let mut old = Vec::new();
        let mut reference = Vec::new();
        let mut rollout = Vec::new();
        for &l in &lp {
            let o = l - log_ratios[rng.below(log_ratios.len())];
            old.push(o);
            reference.push(l + 0.3 * rng.normal());
            // TIS weight exp(old - rollout): below and above the cap of 2.
            rollout.push(o - rng.pick(&[-0.4, 0.1, 0.3, 1.2]).unwrap());
        }
        s.old_logprobs = Some(old);
        s.ref_logprobs = Some(reference);
        s.rollout_logprobs = Some(rollout);
    }
}

fn full_loss_config(agg: LossAgg) -> UpdateConfig {
    UpdateConfig {
        loss: LossConfig {
            agg,
            kl_coef: 0.2,
            entropy_coef: 0.05,
            ..LossConfig::default()
        },
        max_grad_norm: 0.0,
        packed: true,
        micro_batch_tokens: 24,
        temperature: 0.8,
    }
}

/// A finite-difference check's worst violation: (weight, index, fd, analytic, excess).
type Violation = (String, usize, f64, f64, f64);

/// The worst violation of `|fd − g| ≤ 1e-7 + 1e-5·|g|` over the weights `which`
/// selects (all when `None`), with `analytic` gradients against finite differences of
/// the loss of `samples`: (name, index, fd, g, excess), or `None` if all pass.
fn finite_difference_check(
    p: &Params,
    samples: &[TrainSample],
    cfg: &UpdateConfig,
    analytic: &[Tensor],
    which: Option<&[&str]>,
) -> (usize, Option<Violation>) {
    let h = 1e-5;
    let loss = |p: &Params| {
        Update::new(p, samples, cfg)
            .by_autodiff()
            .loss()
            .unwrap()
            .loss
            .loss
    };
    let mut worst: Option<Violation> = None;
    let mut checked = 0;
    for ((name, var), g) in p.named().into_iter().zip(analytic) {
        if which.is_some_and(|w| !w.iter().any(|n| name.contains(n))) {
            continue;
        }
        let orig = var
            .as_tensor()
            .flatten_all()
            .unwrap()
            .to_vec1::<f64>()
            .unwrap();
        let g = g.flatten_all().unwrap().to_vec1::<f64>().unwrap();
        let shape = var.as_tensor().shape().clone();
        let mut w = orig.clone();
        for i in 0..orig.len() {
            w[i] = orig[i] + h;
            var.set(&Tensor::from_slice(&w, &shape, &candle_core::Device::Cpu).unwrap())
                .unwrap();
            let up = loss(p);
            w[i] = orig[i] - h;
            var.set(&Tensor::from_slice(&w, &shape, &candle_core::Device::Cpu).unwrap())
                .unwrap();
            let down = loss(p);
            w[i] = orig[i];
            let fd = (up - down) / (2.0 * h);
            let excess = (fd - g[i]).abs() - (1e-7 + 1e-5 * g[i].abs());
            checked += 1;
            if excess > 0.0 && worst.as_ref().is_none_or(|w| excess > w.4) {
                worst = Some((name.clone(), i, fd, g[i], excess));
            }
        }
        var.set(&Tensor::from_slice(&orig, &shape, &candle_core::Device::Cpu).unwrap())
            .unwrap();
    }
    (checked, worst)
}

#[test]
fn every_weights_gradient_matches_finite_differences() {
    for (flavour, agg) in [
        (Flavour::Llama, LossAgg::TokenMean),
        (Flavour::Qwen2, LossAgg::SeqMeanTokenMean),
    ] {
        let tiny = TinyModel::small(flavour, 21);
        let p = params(&tiny, DType::F64);
        let mut rng = Rng::new(5);
        let mut samples = tree_samples(&mut rng, tiny.vocab.tokens.len(), 2, 3);
        off_policy(&mut rng, &p, &mut samples);
        let cfg = full_loss_config(agg);
        let eval = Update::new(&p, &samples, &cfg)
            .by_autodiff()
            .gradients()
            .unwrap();
        assert!(eval.micro_batches > 1, "the check spans micro-batches");
        let out = &eval.loss;
        // Every regime of the loss is exercised.
        assert!(
            out.clip_fraction > 0.1 && out.clip_fraction < 0.9,
            "{out:?}"
        );
        assert!(
            out.kl > 0.0 && out.entropy > 0.0 && out.tis_mean != 1.0,
            "{out:?}"
        );
        let grads = eval.grads.unwrap();
        let (checked, worst) = finite_difference_check(&p, &samples, &cfg, &grads, None);
        assert_eq!(checked, p.count(), "every weight is checked");
        assert!(worst.is_none(), "{flavour:?}: worst violation {worst:?}");
    }
}

#[test]
fn the_check_fails_when_an_observation_mask_is_dropped() {
    let tiny = TinyModel::small(Flavour::Llama, 21);
    let p = params(&tiny, DType::F64);
    let mut rng = Rng::new(5);
    let mut samples = tree_samples(&mut rng, tiny.vocab.tokens.len(), 2, 3);
    off_policy(&mut rng, &p, &mut samples);
    let cfg = full_loss_config(LossAgg::TokenMean);
    // The bug: observation tokens trained on (their mask dropped) in the gradient only.
    let mut buggy = samples.clone();
    let mut dropped = 0;
    for s in &mut buggy {
        for m in &mut s.response_mask {
            dropped += usize::from(*m == 0);
            *m = 1;
        }
    }
    assert!(dropped > 0);
    let grads = Update::new(&p, &buggy, &cfg)
        .by_autodiff()
        .gradients()
        .unwrap()
        .grads
        .unwrap();
    let (_, worst) = finite_difference_check(
        &p,
        &samples,
        &cfg,
        &grads,
        Some(&["model.norm", "layers.1.mlp.down"]),
    );
    assert!(
        worst.is_some(),
        "a dropped mask must fail the gradient check"
    );
}

fn flat(t: &Tensor) -> Vec<f64> {
    t.to_dtype(DType::F64)
        .unwrap()
        .flatten_all()
        .unwrap()
        .to_vec1::<f64>()
        .unwrap()
}

#[test]
fn packed_trees_give_the_unpacked_loss_and_gradients() {
    let tiny = TinyModel::new(Flavour::Llama, 8);
    let p = params(&tiny, DType::F32);
    let mut rng = Rng::new(17);
    for round in 0..3 {
        let mut samples = tree_samples(&mut rng, tiny.vocab.tokens.len(), 3, 5);
        off_policy(&mut rng, &p, &mut samples);
        let mut cfg = full_loss_config(
            [
                LossAgg::TokenMean,
                LossAgg::SeqMeanTokenSum,
                LossAgg::SeqMeanTokenMean,
            ][round],
        );
        cfg.micro_batch_tokens = 1 << 20;
        let packed = Update::new(&p, &samples, &cfg).gradients().unwrap();
        cfg.packed = false;
        let unpacked = Update::new(&p, &samples, &cfg).gradients().unwrap();
        let (a, b) = (&packed.loss, &unpacked.loss);
        assert!(
            (a.loss - b.loss).abs() <= 1e-5 * b.loss.abs().max(1e-3),
            "{a:?} vs {b:?}"
        );
        assert_eq!((a.tokens, a.clip_fraction), (b.tokens, b.clip_fraction));
        assert!(packed.forwarded.packed < unpacked.forwarded.packed);
        assert_eq!(unpacked.forwarded.packed, unpacked.forwarded.unpacked);
        for (((name, _), ga), gb) in p
            .named()
            .iter()
            .zip(packed.grads.unwrap())
            .zip(unpacked.grads.unwrap())
        {
            let (ga, gb) = (flat(&ga), flat(&gb));
            let scale = gb.iter().map(|x| x.abs()).fold(0.0, f64::max).max(1e-12);
            let err = ga
                .iter()
                .zip(&gb)
                .map(|(x, y)| (x - y).abs())
                .fold(0.0, f64::max);
            assert!(
                err <= 1e-5 * scale,
                "{name}: max |Δ| {err} at scale {scale}"
            );
        }
        eprintln!(
            "round {round}: {} rows packed vs {} unpacked",
            packed.forwarded.packed, unpacked.forwarded.packed
        );
    }
}

#[test]
fn sgd_moves_every_weight_by_exactly_minus_lr_times_its_gradient() {
    let tiny = TinyModel::small(Flavour::Qwen2, 4);
    let p = params(&tiny, DType::F32);
    let mut rng = Rng::new(9);
    let samples = tree_samples(&mut rng, tiny.vocab.tokens.len(), 2, 3);
    let cfg = UpdateConfig {
        max_grad_norm: 0.0,
        ..full_loss_config(LossAgg::TokenMean)
    };
    let grads = Update::new(&p, &samples, &cfg)
        .gradients()
        .unwrap()
        .grads
        .unwrap();
    let before: Vec<Vec<f64>> = p.named().iter().map(|(_, v)| flat(v.as_tensor())).collect();
    let lr = 0.125; // a power of two: lr·g is exact in f32
    let mut opt = Optimizer::new(OptimizerConfig {
        kind: OptimizerKind::Sgd,
        lr,
        ..OptimizerConfig::default()
    });
    let m = Update::new(&p, &samples, &cfg).step(&mut opt).unwrap();
    assert!(m.grad_norm > 0.0 && m.tokens > 0);
    for (((name, v), g), b) in p.named().iter().zip(&grads).zip(&before) {
        let (after, g) = (flat(v.as_tensor()), flat(g));
        for i in 0..after.len() {
            let want = (b[i] as f32 - (lr as f32) * g[i] as f32) as f64;
            assert_eq!(after[i], want, "{name}[{i}]");
        }
    }
}

#[test]
fn clipping_scales_the_step_and_a_nan_gradient_changes_nothing() {
    let tiny = TinyModel::small(Flavour::Llama, 4);
    let p = params(&tiny, DType::F64);
    let mut rng = Rng::new(3);
    let samples = tree_samples(&mut rng, tiny.vocab.tokens.len(), 2, 3);
    let cfg = full_loss_config(LossAgg::TokenMean);
    let grads = Update::new(&p, &samples, &cfg)
        .by_autodiff()
        .gradients()
        .unwrap()
        .grads
        .unwrap();
    let norm: f64 = grads
        .iter()
        .map(|g| flat(g).iter().map(|x| x * x).sum::<f64>())
        .sum::<f64>()
        .sqrt();
    let before: Vec<Vec<f64>> = p.named().iter().map(|(_, v)| flat(v.as_tensor())).collect();
    let lr = 0.5;
    let sgd = OptimizerConfig {
        kind: OptimizerKind::Sgd,
        lr,
        ..OptimizerConfig::default()
    };
    // Clipped to half its norm: every weight moves by -lr * g * max / (norm + 1e-6).
    let clipped = UpdateConfig {
        max_grad_norm: norm / 2.0,
        ..cfg
    };
    let m = Update::new(&p, &samples, &clipped)
        .by_autodiff()
        .step(&mut Optimizer::new(sgd))
        .unwrap();
    assert!((m.grad_norm - norm).abs() <= 1e-12 * norm);
    let coef = (norm / 2.0) / (norm + 1e-6);
    for (((name, v), g), b) in p.named().iter().zip(&grads).zip(&before) {
        for ((a, g), b) in flat(v.as_tensor()).iter().zip(flat(g)).zip(b) {
            assert!(
                (a - (b - lr * coef * g)).abs() <= 1e-12 * (1.0 + b.abs()),
                "{name}"
            );
        }
    }

    // A NaN weight makes the gradient NaN: the update is refused and nothing moves.
    let (name, var) = &p.named()[3];
    let mut w = flat(var.as_tensor());
    w[0] = f64::NAN;
    var.set(&Tensor::from_vec(w, var.as_tensor().shape(), &candle_core::Device::Cpu).unwrap())
        .unwrap();
    let snapshot: Vec<Vec<f64>> = p.named().iter().map(|(_, v)| flat(v.as_tensor())).collect();
    let err = Update::new(&p, &samples, &cfg)
        .by_autodiff()
        .step(&mut Optimizer::new(sgd))
        .unwrap_err();
    assert!(
        matches!(err, treegrpo::train::TrainError::NonFiniteGradient { .. }),
        "{err:?} ({name})"
    );
    for ((_, v), s) in p.named().iter().zip(&snapshot) {
        let now = flat(v.as_tensor());
        assert!(now.iter().zip(s).all(|(a, b)| a.to_bits() == b.to_bits()));
    }
}

//! Boosted tokens (a tree branch's first tokens, drawn from a branch sampling's wider
//! distribution) in the update: their truncated importance weight divides by the
//! behaviour logprob they were recorded with, token by token, and masking leaves them
//! out of the loss.
//!
//! The oracle: with the KL and entropy terms off, on-policy ratios (1) and an
//! advantage `A`, the token-mean loss over N loss tokens is `−A·Σ_t tis_t / N` and the
//! reported mean weight is `Σ_t tis_t / N`. With a behaviour gap on one token `j` only,
//! every other weight is 1, so both give `tis_j` back — compared with
//! `min(exp(π_j − μ_j), cap)` recomputed from the trainer's own logprob π and the
//! recorded behaviour μ — and the weight's effect on the gradient is linear: the
//! gradient moves from the unboosted one by `(tis_j − 1)` times one direction.

mod common;

use candle_core::DType;
use common::tiny::{Flavour, TinyModel};
use treegrpo::closed_loop::samples::{train_sample, BoostedTokens};
use treegrpo::model::LoadedModel;
use treegrpo::rollout::Trajectory;
use treegrpo::train::pack::pack;
use treegrpo::train::{LossConfig, Params, Update, UpdateConfig};

fn params() -> Params {
    let tmp = tempfile::tempdir().unwrap();
    let path = tmp.path().join("tiny.gguf");
    TinyModel::new(Flavour::Llama, 11).write_gguf(&path);
    let m = LoadedModel::load(&path).unwrap();
    Params::from_model(&m.model, DType::F32).unwrap()
}

fn config() -> UpdateConfig {
    UpdateConfig {
        loss: LossConfig {
            kl_coef: 0.0,
            entropy_coef: 0.0,
            tis_cap: 2.0,
            ..LossConfig::default()
        },
        max_grad_norm: 0.0,
        packed: false,
        micro_batch_tokens: 1 << 16,
        temperature: 1.0,
    }
}

/// The trainer's log-probability of every response token of `t`.
fn trainer_logprobs(p: &Params, t: &Trajectory) -> Vec<f64> {
    let mut tokens = t.prompt_ids.clone();
    tokens.extend(&t.response_ids);
    let wanted: Vec<bool> = (0..tokens.len()).map(|i| i >= t.prompt_ids.len()).collect();
    let packed = &pack(&[(tokens.as_slice(), wanted.as_slice())], false, 1 << 20)[0];
    let logp = p.score(&packed.batch, 1.0, false).unwrap().logp;
    let logp = logp.to_dtype(DType::F64).unwrap().to_vec1::<f64>().unwrap();
    (t.prompt_ids.len()..tokens.len())
        .map(|pos| logp[packed.scored[0][pos].unwrap() as usize])
        .collect()
}

/// Two steps: a branch's first step whose first 3 tokens were boosted, its
/// observation, and a second step drawn from the policy. Behaviour logprobs: the
/// policy's, minus `gaps` on the boosted tokens (a boost that made them less, or
/// more, likely than the policy would).
fn branch_trajectory(p: &Params, gaps: [f64; 3]) -> Trajectory {
    let mut t = Trajectory::new(vec![5, 9, 14]);
    let first = [20u32, 31, 7, 44, 12];
    let obs = [3u32, 8];
    let second = [17u32, 25, 40];
    t.push_model(&first, &[0.0; 5], &[0.0; 5], 3);
    t.push_observation(&obs);
    t.push_model(&second, &[0.0; 3], &[], 0);
    let policy = trainer_logprobs(p, &t);
    for (j, m) in t.response_mask.iter().enumerate() {
        if *m == 1 {
            t.response_logprobs[j] = policy[j] as f32;
            t.response_behaviour_logprobs[j] = policy[j] as f32;
        }
    }
    for (j, gap) in gaps.iter().enumerate() {
        t.response_behaviour_logprobs[j] = (policy[j] - gap) as f32;
    }
    t
}

/// What one update of `t` at `advantage` gives: the per-token weight read back from
/// the loss, the one read back from the reported mean weight (both with every token
/// but `j` at weight 1), and the flattened gradient.
struct Weighed {
    from_loss: f64,
    from_mean: f64,
    grads: Vec<f64>,
}

fn weigh(p: &Params, t: &Trajectory, advantage: f64) -> Weighed {
    let s = train_sample(t, advantage, Some(BoostedTokens::Corrected));
    let out = Update::new(p, &[s], &config()).gradients().unwrap();
    let n = out.loss.tokens as f64;
    assert_eq!(out.loss.tokens, 8, "8 model tokens are loss tokens");
    let grads = out
        .grads
        .unwrap()
        .iter()
        .flat_map(|g| g.flatten_all().unwrap().to_vec1::<f32>().unwrap())
        .map(f64::from)
        .collect();
    Weighed {
        from_loss: -out.loss.pg_loss * n / advantage - (n - 1.0),
        from_mean: out.loss.tis_mean * n - (n - 1.0),
        grads,
    }
}

#[test]
fn boosted_tokens_are_weighted_by_their_behaviour_logprob_token_by_token() {
    let p = params();
    let advantage = 0.8;
    let plain = weigh(&p, &branch_trajectory(&p, [0.0; 3]), advantage);
    assert!((plain.from_loss - 1.0).abs() < 1e-5, "{}", plain.from_loss);
    // exp(gap): 0.61 (below 1), 1.65 (inside the cap), 4.48 (capped at 2); and at
    // half the gap 0.78, 1.28, 2.12 (capped again).
    for (j, gap) in [-0.5, 0.5, 1.5].into_iter().enumerate() {
        let weighed = |gap: f64| {
            let mut gaps = [0.0; 3];
            gaps[j] = gap;
            let t = branch_trajectory(&p, gaps);
            assert_eq!(t.response_boosted, vec![1, 1, 1, 0, 0, 0, 0, 0, 0, 0]);
            let policy = trainer_logprobs(&p, &t)[j];
            let behaviour = t.response_behaviour_logprobs[j] as f64;
            let oracle = ((policy as f32) as f64 - behaviour).exp().min(2.0);
            let got = weigh(&p, &t, advantage);
            for w in [got.from_loss, got.from_mean] {
                assert!(
                    (w - oracle).abs() < 1e-4,
                    "token {j}: weight {w}, oracle {oracle}"
                );
            }
            (oracle, got.grads)
        };
        let (w, full) = weighed(gap);
        let (w_half, half) = weighed(gap / 2.0);
        // The weight reaches the gradient, linearly: G(w) − G(1) ∝ (w − 1).
        let moved: Vec<f64> = full
            .iter()
            .zip(&plain.grads)
            .map(|(g, g0)| g - g0)
            .collect();
        let norm = moved.iter().map(|d| d * d).sum::<f64>().sqrt();
        assert!(
            norm > 1e-6,
            "token {j}: its weight did not reach the gradient"
        );
        let scale = (w_half - 1.0) / (w - 1.0);
        for (k, (g, g0)) in half.iter().zip(&plain.grads).enumerate() {
            let expected = g0 + moved[k] * scale;
            assert!(
                (g - expected).abs() < 1e-4 * norm + 1e-7,
                "token {j}, gradient entry {k}: {g} against {expected}"
            );
        }
    }
}

#[test]
fn masked_boosted_tokens_contribute_no_gradient() {
    let p = params();
    let advantage = -0.6;
    let grads = |gaps: [f64; 3], boosted: BoostedTokens| {
        let t = branch_trajectory(&p, gaps);
        let s = train_sample(&t, advantage, Some(boosted));
        let out = Update::new(&p, &[s], &config()).gradients().unwrap();
        let flat: Vec<f32> = out
            .grads
            .unwrap()
            .iter()
            .flat_map(|g| g.flatten_all().unwrap().to_vec1::<f32>().unwrap())
            .collect();
        (out.loss.tokens, flat)
    };
    let (tokens, masked_a) = grads([-0.5, 0.5, 1.5], BoostedTokens::Masked);
    assert_eq!(tokens, 5, "the 3 boosted tokens are out of the loss");
    // Whatever the boosted tokens' behaviour, a masked update does not see them …
    let (_, masked_b) = grads([1.0, -1.0, 0.2], BoostedTokens::Masked);
    assert_eq!(masked_a, masked_b);
    assert!(
        masked_a.iter().any(|&g| g != 0.0),
        "the other tokens still train"
    );
    // … while a corrected one does (their weights differ, so does the gradient).
    let (tokens, corrected_a) = grads([-0.5, 0.5, 1.5], BoostedTokens::Corrected);
    let (_, corrected_b) = grads([1.0, -1.0, 0.2], BoostedTokens::Corrected);
    assert_eq!(tokens, 8);
    assert_ne!(corrected_a, corrected_b);
}

#[test]
fn demonstrations_and_old_records_read_as_before() {
    let p = params();
    let mut t = branch_trajectory(&p, [0.0; 3]);
    // A record written before behaviour logprobs were kept: the policy's are taken.
    t.response_behaviour_logprobs.clear();
    t.response_boosted.clear();
    let s = train_sample(&t, 1.0, Some(BoostedTokens::Masked));
    let policy: Vec<f64> = t.response_logprobs.iter().map(|&l| l as f64).collect();
    assert_eq!(s.rollout_logprobs.as_deref(), Some(policy.as_slice()));
    assert_eq!(s.response_mask, t.response_mask);
    // A demonstration takes no rollout logprobs at all.
    assert_eq!(train_sample(&t, 1.0, None).rollout_logprobs, None);
}

//! Sampling against a naive reference: the head-selection shortcut for min-p / top-k /
//! top-p must pick exactly the token a full sort of the vocabulary would, with vLLM's
//! order (min-p, then top-k, then top-p renormalised over what is left). Min-p's
//! distribution and the `top_logprobs` alternatives against hand-computed values.

use treegrpo::engine::sampling::{sample, top_logprobs};
use treegrpo::engine::{Sampling, SeqRng};

/// Full sort, truncate, renormalise, one uniform draw: the textbook procedure.
fn naive(
    logits: &[f32],
    t: f32,
    top_k: Option<usize>,
    top_p: Option<f32>,
    min_p: Option<f32>,
    rng: &mut SeqRng,
) -> usize {
    let max = logits
        .iter()
        .fold(f64::NEG_INFINITY, |m, &l| m.max(l as f64 / t as f64));
    let lse = max
        + logits
            .iter()
            .map(|&l| (l as f64 / t as f64 - max).exp())
            .sum::<f64>()
            .ln();
    let lp = |i: usize| logits[i] as f64 / t as f64 - lse;
    let mut idx: Vec<usize> = (0..logits.len()).collect();
    idx.sort_by(|&a, &b| logits[b].total_cmp(&logits[a]).then(a.cmp(&b)));
    if let Some(m) = min_p {
        let floor = m as f64 * lp(idx[0]).exp();
        idx.retain(|&i| lp(i).exp() >= floor);
    }
    if let Some(k) = top_k {
        idx.truncate(k);
    }
    if let Some(p) = top_p {
        // Renormalised over what min-p and top-k left (over everything: mass 1).
        let base: f64 = if idx.len() == logits.len() {
            1.0
        } else {
            idx.iter().map(|&i| lp(i).exp()).sum()
        };
        let (mut mass, mut keep) = (0.0, 0);
        for &i in &idx {
            mass += lp(i).exp();
            keep += 1;
            if mass >= p as f64 * base {
                break;
            }
        }
        idx.truncate(keep.max(1));
    }
    let total: f64 = idx.iter().map(|&i| lp(i).exp()).sum();
    let mut u = rng.next_f64() * total;
    for &i in &idx {
        u -= lp(i).exp();
        if u < 0.0 {
            return i;
        }
    }
    idx[idx.len() - 1]
}

#[test]
fn truncated_sampling_equals_a_full_sort() {
    let mut gen = SeqRng::new(1);
    for case in 0..300u64 {
        let vocab = 1 + (gen.next_u64() % 3000) as usize;
        let spread = 1.0 + (gen.next_u64() % 20) as f32;
        let logits: Vec<f32> = (0..vocab)
            .map(|_| (gen.next_f64() as f32 - 0.5) * spread)
            .collect();
        let top_k = [None, Some(1), Some(5), Some(50), Some(vocab)][case as usize % 5];
        let top_p = [None, Some(0.5), Some(0.9), Some(0.99)][case as usize % 4];
        let min_p = [None, Some(0.05), Some(0.3)][case as usize % 3];
        // Untruncated sampling walks the vocabulary in id order instead (same
        // distribution, no sort); this test is about the truncated path.
        if !(top_k.is_some_and(|k| k < vocab) || top_p.is_some() || min_p.is_some()) {
            continue;
        }
        let s = Sampling::Random {
            min_p,
            temperature: 0.8,
            top_k,
            top_p,
        };
        let mut a = SeqRng::new(case);
        let mut b = SeqRng::new(case);
        let got = sample(&logits, &s, &mut a).token as usize;
        let want = naive(&logits, 0.8, top_k, top_p, min_p, &mut b);
        assert_eq!(
            got, want,
            "case {case}: vocab {vocab}, top_k {top_k:?}, top_p {top_p:?}, min_p {min_p:?}"
        );
    }
}

/// Logits [2, 1, 0, -1] at T = 1 with min_p 0.3: p₁/p₀ = e⁻¹ ≈ 0.37 stays, p₂/p₀ =
/// e⁻² ≈ 0.14 goes; draws follow {e/(e+1), 1/(e+1)} over tokens 0 and 1.
#[test]
fn min_p_keeps_the_hand_computed_set() {
    let logits = [2.0f32, 1.0, 0.0, -1.0];
    let s = Sampling::new(1.0, None, None, Some(0.3)).unwrap();
    let mut rng = SeqRng::new(5);
    let mut counts = [0usize; 4];
    let n = 40_000;
    for _ in 0..n {
        counts[sample(&logits, &s, &mut rng).token as usize] += 1;
    }
    assert_eq!(counts[2] + counts[3], 0, "{counts:?}");
    let e = std::f64::consts::E;
    let share = counts[0] as f64 / n as f64;
    assert!((share - e / (e + 1.0)).abs() < 0.01, "{share}");
    // The reported logprob is the untruncated one: log p₀ of the full softmax.
    let lse = logits.iter().map(|&l| (l as f64).exp()).sum::<f64>().ln();
    let tok = sample(&logits, &s, &mut SeqRng::new(1));
    let want = logits[tok.token as usize] as f64 - lse;
    assert!((tok.logprob as f64 - want).abs() < 1e-6);
}

#[test]
fn top_logprobs_are_the_best_of_the_reported_distribution() {
    let logits = [0.5f32, 3.0, -1.0, 3.0, 2.0];
    let t = 0.5f64;
    let s = Sampling::new(t as f32, None, None, None).unwrap();
    let top = top_logprobs(&logits, &s, 3);
    let lse = logits
        .iter()
        .map(|&l| (l as f64 / t).exp())
        .sum::<f64>()
        .ln();
    // Ties by the lower id: 1 before 3.
    let want = [1u32, 3, 4];
    assert_eq!(top.iter().map(|a| a.token).collect::<Vec<_>>(), want);
    for a in &top {
        let lp = logits[a.token as usize] as f64 / t - lse;
        assert!((a.logprob as f64 - lp).abs() < 1e-6);
    }
    assert!(top_logprobs(&logits, &s, 0).is_empty());
    assert_eq!(top_logprobs(&logits, &s, 99).len(), logits.len());
}

#[test]
fn checked_constructor_refuses_what_it_cannot_serve() {
    use treegrpo::engine::SamplingError;
    assert_eq!(
        Sampling::new(0.0, Some(5), Some(0.5), Some(0.1)),
        Ok(Sampling::Greedy)
    );
    for t in [-0.5, f32::NAN, f32::INFINITY] {
        assert!(matches!(
            Sampling::new(t, None, None, None),
            Err(SamplingError::Temperature(_))
        ));
    }
    assert_eq!(
        Sampling::new(1.0, None, Some(0.0), None),
        Err(SamplingError::TopP(0.0))
    );
    assert_eq!(
        Sampling::new(1.0, None, None, Some(1.5)),
        Err(SamplingError::MinP(1.5))
    );
    assert_eq!(SamplingError::MinP(1.5).field(), "min_p");
}

// ---- Branch sampling: tokens drawn from a boost record the boost's probability ----

use treegrpo::engine::sampling::{draw, DrawOptions};
use treegrpo::engine::Penalties;

/// logits [2, 1, 0, −1] at T: softmax by hand, `exp(l/T) / Σ exp(l/T)`.
fn hand_softmax(t: f64) -> [f64; 4] {
    let e = [2.0f64, 1.0, 0.0, -1.0].map(|l| (l / t).exp());
    let z: f64 = e.iter().sum();
    e.map(|x| x / z)
}

const LOGITS: [f32; 4] = [2.0, 1.0, 0.0, -1.0];

fn policy() -> Sampling {
    Sampling::new(1.0, None, None, None).unwrap()
}

fn boosted(options_from: Sampling, seed: u64) -> treegrpo::engine::sampling::Drawn {
    let options = DrawOptions {
        draw_from: Some(options_from),
        ..DrawOptions::PLAIN
    };
    draw(&LOGITS, &policy(), options, &mut SeqRng::new(seed))
}

#[test]
fn a_boosted_token_records_the_boost_temperature_and_the_policy_beside_it() {
    let boost = Sampling::new(2.0, None, None, None).unwrap();
    let (p_boost, p_policy) = (hand_softmax(2.0), hand_softmax(1.0));
    let mut counts = [0usize; 4];
    for seed in 0..20_000 {
        let d = boosted(boost, seed);
        let x = d.sampled.token as usize;
        counts[x] += 1;
        assert!((d.behaviour_logprob as f64 - p_boost[x].ln()).abs() < 1e-5);
        assert!((d.sampled.logprob as f64 - p_policy[x].ln()).abs() < 1e-5);
    }
    // The draws follow the boost's distribution, not the policy's: p = (0.455, 0.276,
    // 0.167, 0.102) at T = 2 against (0.644, 0.237, 0.087, 0.032) at T = 1; 20,000
    // draws put each share within 0.015 of its probability.
    for (x, &c) in counts.iter().enumerate() {
        let share = c as f64 / 20_000.0;
        assert!(
            (share - p_boost[x]).abs() < 0.015,
            "token {x}: {share} vs {}",
            p_boost[x]
        );
    }
}

#[test]
fn a_truncated_boost_renormalises_the_behaviour_logprob() {
    // Top-2 at T = 2: only tokens 0 and 1, with p / (p0 + p1).
    let boost = Sampling::new(2.0, Some(2), None, None).unwrap();
    let p = hand_softmax(2.0);
    for seed in 0..2_000 {
        let d = boosted(boost, seed);
        let x = d.sampled.token as usize;
        assert!(x < 2, "top-2 drew token {x}");
        let expected = (p[x] / (p[0] + p[1])).ln();
        assert!((d.behaviour_logprob as f64 - expected).abs() < 1e-5);
        assert!((d.sampled.logprob as f64 - hand_softmax(1.0)[x].ln()).abs() < 1e-5);
    }
    // Top-p 0.7 at T = 2: 0.455 + 0.276 = 0.731 ≥ 0.7 keeps tokens 0 and 1 as well.
    let nucleus = Sampling::new(2.0, None, Some(0.7), None).unwrap();
    for seed in 0..500 {
        let d = boosted(nucleus, seed);
        let x = d.sampled.token as usize;
        assert!(x < 2);
        assert!((d.behaviour_logprob as f64 - (p[x] / (p[0] + p[1])).ln()).abs() < 1e-5);
    }
}

#[test]
fn unboosted_draws_are_the_policy_draws_they_always_were() {
    // No boost and no truncation: the same token as `sample`, behaviour = policy.
    for seed in 0..500 {
        let d = draw(
            &LOGITS,
            &policy(),
            DrawOptions::PLAIN,
            &mut SeqRng::new(seed),
        );
        let s = sample(&LOGITS, &policy(), &mut SeqRng::new(seed));
        assert_eq!(d.sampled, s);
        assert_eq!(d.behaviour_logprob, s.logprob);
    }
    // A run's own top-k: the policy logprob stays the untruncated one (what a
    // trainer recomputes), the behaviour is renormalised over the kept tokens.
    let top2 = Sampling::new(1.0, Some(2), None, None).unwrap();
    let p = hand_softmax(1.0);
    let d = draw(&LOGITS, &top2, DrawOptions::PLAIN, &mut SeqRng::new(3));
    let x = d.sampled.token as usize;
    assert!((d.sampled.logprob as f64 - p[x].ln()).abs() < 1e-5);
    assert!((d.behaviour_logprob as f64 - (p[x] / (p[0] + p[1])).ln()).abs() < 1e-5);
    // Penalties shape the behaviour (the choice), not the policy logprob: a presence
    // penalty of 2 on token 0 turns its logit 2 into 0.
    let mut history = treegrpo::engine::penalties::TokenHistory::new([]);
    history.push_output(0);
    let penalties = Penalties::new(1.0, 2.0, 0.0).unwrap();
    let options = DrawOptions {
        penalties: &penalties,
        history: Some(&history),
        ..DrawOptions::PLAIN
    };
    let d = draw(&LOGITS, &policy(), options, &mut SeqRng::new(5));
    let x = d.sampled.token as usize;
    let shaped = [0.0f64, 1.0, 0.0, -1.0].map(f64::exp);
    let z: f64 = shaped.iter().sum();
    assert!((d.behaviour_logprob as f64 - (shaped[x] / z).ln()).abs() < 1e-5);
    assert!((d.sampled.logprob as f64 - p[x].ln()).abs() < 1e-5);
}

#[test]
fn a_banned_token_is_never_drawn_and_the_behaviour_is_renormalised_without_it() {
    // min_tokens' mask: token 0 (the most likely, p = 0.644 at T = 1) may not be drawn.
    let p = hand_softmax(1.0);
    let kept: f64 = p[1..].iter().sum();
    for (sampling, seeds) in [(policy(), 0..2_000u64), (Sampling::Greedy, 0..1)] {
        for seed in seeds {
            let options = DrawOptions {
                banned: &[0],
                ..DrawOptions::PLAIN
            };
            let d = draw(&LOGITS, &sampling, options, &mut SeqRng::new(seed));
            let x = d.sampled.token as usize;
            assert_ne!(x, 0, "a banned token was drawn (seed {seed})");
            // The policy logprob stays the model's; the behaviour is the masked one's.
            assert!((d.sampled.logprob as f64 - p[x].ln()).abs() < 1e-5);
            assert!((d.behaviour_logprob as f64 - (p[x] / kept).ln()).abs() < 1e-5);
            if sampling == Sampling::Greedy {
                assert_eq!(x, 1, "greedy takes the best token left");
            }
        }
    }
    // Out-of-vocabulary ids in the list change nothing.
    let options = DrawOptions {
        banned: &[99],
        ..DrawOptions::PLAIN
    };
    let plain = draw(&LOGITS, &policy(), DrawOptions::PLAIN, &mut SeqRng::new(7));
    assert_eq!(
        draw(&LOGITS, &policy(), options, &mut SeqRng::new(7)),
        plain
    );
}

#[test]
fn a_sampling_read_from_json_is_checked_as_a_built_one_is() {
    let ok: Sampling =
        serde_json::from_str(r#"{"Random":{"temperature":0.7,"top_k":null,"top_p":null}}"#)
            .unwrap();
    assert_eq!(ok, Sampling::new(0.7, None, None, None).unwrap());
    assert_eq!(
        serde_json::from_str::<Sampling>(r#""Greedy""#).unwrap(),
        Sampling::Greedy
    );
    // The same JSON round-trips.
    assert_eq!(
        serde_json::from_str::<Sampling>(&serde_json::to_string(&ok).unwrap()).unwrap(),
        ok
    );
    for bad in [
        r#"{"Random":{"temperature":-1.0,"top_k":null,"top_p":null}}"#,
        r#"{"Random":{"temperature":0.0,"top_k":null,"top_p":null}}"#,
        r#"{"Random":{"temperature":1.0,"top_k":null,"top_p":1.5}}"#,
        r#"{"Random":{"temperature":1.0,"top_k":null,"top_p":null,"min_p":2.0}}"#,
    ] {
        let err = serde_json::from_str::<Sampling>(bad)
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("temperature") || err.contains("top_p") || err.contains("min_p"),
            "{bad}: {err}"
        );
    }
}

//! Sampling against a naive reference: the head-selection shortcut for top-k / top-p
//! must pick exactly the token a full sort of the vocabulary would.

use treegrpo::engine::sampling::sample;
use treegrpo::engine::{Sampling, SeqRng};

/// Full sort, truncate, renormalise, one uniform draw: the textbook procedure.
fn naive(
    logits: &[f32],
    t: f32,
    top_k: Option<usize>,
    top_p: Option<f32>,
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
    if let Some(k) = top_k {
        idx.truncate(k);
    }
    if let Some(p) = top_p {
        let (mut mass, mut keep) = (0.0, 0);
        for &i in &idx {
            mass += lp(i).exp();
            keep += 1;
            if mass >= p as f64 {
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
        // Untruncated sampling walks the vocabulary in id order instead (same
        // distribution, no sort); this test is about the truncated path.
        if !(top_k.is_some_and(|k| k < vocab) || top_p.is_some()) {
            continue;
        }
        let s = Sampling::Random {
            min_p: None,
            temperature: 0.8,
            top_k,
            top_p,
        };
        let mut a = SeqRng::new(case);
        let mut b = SeqRng::new(case);
        let got = sample(&logits, &s, &mut a).token as usize;
        let want = naive(&logits, 0.8, top_k, top_p, &mut b);
        assert_eq!(
            got, want,
            "case {case}: vocab {vocab}, top_k {top_k:?}, top_p {top_p:?}"
        );
    }
}

//! The trainer's differentiable forward against independent oracles.
//!
//! - The tree layout: runs and positions of a hand-built trie.
//! - Tree attention (our op with its own backward) against attention composed from
//!   candle ops with a dense ancestor mask, values and all three gradients, in f64.
//! - The whole decoder against the engine's forward ([`Model::forward`]) on the same
//!   tiny models, both families (interleaved and half-split RoPE, biases, tied and
//!   untied heads), chains and packed trees.

mod common;

use std::sync::Arc;

use candle_core::{DType, Device, Tensor, Var, D};
use common::rng::Rng;
use common::tiny::{logits_all, Flavour, TinyModel};
use treegrpo::model::LoadedModel;
use treegrpo::train::oracle::attention::tree_attention;
use treegrpo::train::pack::pack;
use treegrpo::train::{Params, TreeLayout};

#[test]
#[allow(clippy::single_range_in_vec_init)] // a row's runs are a list, here of one
fn layout_runs_follow_the_trie_and_positions_are_depths() {
    // 0-1-2 (a chain), 3 a child of 1, 4 a child of 3, 5 a new root, 6 a child of 2.
    let l = TreeLayout::new(vec![
        None,
        Some(0),
        Some(1),
        Some(1),
        Some(3),
        None,
        Some(2),
    ])
    .unwrap();
    assert_eq!(l.positions(), &[0, 1, 2, 2, 3, 0, 3]);
    assert_eq!(l.runs(2), &[0..3]);
    assert_eq!(l.runs(3), &[0..2, 3..4]);
    assert_eq!(l.runs(4), &[0..2, 3..5]);
    assert_eq!(l.runs(5), &[5..6]);
    assert_eq!(l.runs(6), &[0..3, 6..7]);
    assert!(l.attends(4, 1) && !l.attends(4, 2) && !l.attends(6, 5));
    let err = TreeLayout::new(vec![None, Some(3), None, None]).unwrap_err();
    assert_eq!((err.row, err.parent), (1, 3));
    assert_eq!(TreeLayout::chains(&[2, 3]).positions(), &[0, 1, 0, 1, 2]);
}

/// A random forest layout: each row's parent is an earlier row of its tree, often the
/// previous one (long runs), sometimes another (branches), sometimes none (new tree).
fn random_layout(rng: &mut Rng, n: usize) -> TreeLayout {
    let mut parents = Vec::with_capacity(n);
    let mut tree_start = 0;
    for i in 0..n {
        let p = if i == 0 {
            None
        } else {
            match rng.below(10) {
                0 => {
                    tree_start = i;
                    None
                }
                1..=3 if i > tree_start => Some((tree_start + rng.below(i - tree_start)) as u32),
                _ if i > tree_start => Some(i as u32 - 1),
                _ => None,
            }
        };
        parents.push(p);
    }
    TreeLayout::new(parents).unwrap()
}

fn random_var(rng: &mut Rng, dims: &[usize]) -> Var {
    let n: usize = dims.iter().product();
    let v: Vec<f64> = (0..n).map(|_| rng.normal()).collect();
    Var::from_tensor(&Tensor::from_vec(v, dims, &Device::Cpu).unwrap()).unwrap()
}

/// Attention composed from candle ops (all with a backward) and a dense mask.
fn dense_attention(q: &Tensor, k: &Tensor, v: &Tensor, layout: &TreeLayout) -> Tensor {
    let (n, heads, d) = q.dims3().unwrap();
    let kv_heads = k.dim(1).unwrap();
    let group: Vec<u32> = (0..heads)
        .map(|h| (h / (heads / kv_heads)) as u32)
        .collect();
    let group = Tensor::new(group.as_slice(), &Device::Cpu).unwrap();
    let q = q.transpose(0, 1).unwrap().contiguous().unwrap(); // [H, n, d]
    let k = k
        .index_select(&group, 1)
        .unwrap()
        .transpose(0, 1)
        .unwrap()
        .contiguous()
        .unwrap();
    let v = v
        .index_select(&group, 1)
        .unwrap()
        .transpose(0, 1)
        .unwrap()
        .contiguous()
        .unwrap();
    let mask: Vec<f64> = (0..n * n)
        .map(|x| {
            if layout.attends(x / n, x % n) {
                0.0
            } else {
                -1e9
            }
        })
        .collect();
    let mask = Tensor::from_vec(mask, (n, n), &Device::Cpu).unwrap();
    let scores = (q.matmul(&k.t().unwrap()).unwrap() / (d as f64).sqrt()).unwrap();
    let scores = scores.broadcast_add(&mask).unwrap();
    let max = scores.max_keepdim(D::Minus1).unwrap().detach();
    let e = scores.broadcast_sub(&max).unwrap().exp().unwrap();
    let p = e.broadcast_div(&e.sum_keepdim(D::Minus1).unwrap()).unwrap();
    p.matmul(&v)
        .unwrap()
        .transpose(0, 1)
        .unwrap()
        .contiguous()
        .unwrap()
}

fn max_rel(a: &Tensor, b: &Tensor) -> f64 {
    let a = a.flatten_all().unwrap().to_vec1::<f64>().unwrap();
    let b = b.flatten_all().unwrap().to_vec1::<f64>().unwrap();
    a.iter()
        .zip(&b)
        .map(|(x, y)| (x - y).abs() / (1.0 + y.abs()))
        .fold(0.0, f64::max)
}

#[test]
fn tree_attention_and_its_backward_equal_masked_dense_attention() {
    let mut rng = Rng::new(11);
    for (n, heads, kv_heads, d) in [(1, 2, 1, 4), (23, 4, 2, 8), (57, 6, 2, 4), (40, 3, 3, 6)] {
        let layout = Arc::new(random_layout(&mut rng, n));
        let q = random_var(&mut rng, &[n, heads, d]);
        let k = random_var(&mut rng, &[n, kv_heads, d]);
        let v = random_var(&mut rng, &[n, kv_heads, d]);
        let probe = random_var(&mut rng, &[n, heads, d]).as_tensor().detach();
        let ours = tree_attention(q.as_tensor(), k.as_tensor(), v.as_tensor(), &layout).unwrap();
        let dense = dense_attention(q.as_tensor(), k.as_tensor(), v.as_tensor(), &layout);
        assert!(max_rel(&ours, &dense) < 1e-12, "forward n={n}");
        let g_ours = (ours * &probe)
            .unwrap()
            .sum_all()
            .unwrap()
            .backward()
            .unwrap();
        let g_dense = (dense * &probe)
            .unwrap()
            .sum_all()
            .unwrap()
            .backward()
            .unwrap();
        for (name, var) in [("q", &q), ("k", &k), ("v", &v)] {
            let a = g_ours
                .get(var.as_tensor())
                .expect("our op gives a gradient");
            let b = g_dense.get(var.as_tensor()).unwrap();
            let err = max_rel(a, b);
            assert!(err < 1e-11, "d{name} n={n}: {err}");
        }
    }
}

#[test]
fn the_decoder_gives_the_engines_logprobs_on_chains_and_packed_trees() {
    for flavour in [Flavour::Llama, Flavour::Qwen2] {
        let tmp = tempfile::tempdir().unwrap();
        let tiny = TinyModel::new(flavour, 3);
        let path = tmp.path().join("tiny.gguf");
        tiny.write_gguf(&path);
        let m = LoadedModel::load(&path).unwrap();
        let params = Params::from_model(&m.model, DType::F32).unwrap();
        // Three sequences sharing prefixes of different lengths.
        let a: Vec<u32> = vec![5, 40, 41, 42, 43, 44, 45, 46, 47, 48, 49];
        let mut b = a[..6].to_vec();
        b.extend([60, 61, 62, 63]);
        let mut c = a[..2].to_vec();
        c.extend([70, 71, 72, 73, 74, 75, 76]);
        let seqs = [a, b, c];
        let wanted: Vec<Vec<bool>> = seqs.iter().map(|s| vec![true; s.len()]).collect();
        let inputs: Vec<(&[u32], &[bool])> = seqs
            .iter()
            .zip(&wanted)
            .map(|(s, w)| (s.as_slice(), w.as_slice()))
            .collect();
        for share in [false, true] {
            let packed = pack(&inputs, share, 1 << 20);
            assert_eq!(packed.len(), 1);
            let p = &packed[0];
            let rows = p.batch.tokens.len();
            assert_eq!(rows, if share { 11 + 4 + 7 } else { 11 + 10 + 9 });
            let logp = params
                .score(&p.batch, 1.0, false)
                .unwrap()
                .logp
                .to_vec1::<f32>()
                .unwrap();
            let mut worst = 0f64;
            for (k, seq) in seqs.iter().enumerate() {
                let engine = logits_all(&m, seq);
                for pos in 1..seq.len() {
                    let u = p.scored[k][pos].unwrap() as usize;
                    let want = common::log_softmax_at(&engine[pos - 1], seq[pos]);
                    worst = worst.max((logp[u] as f64 - want).abs());
                }
            }
            // f32 throughout, different summation orders: a few ulps of the logits.
            assert!(worst < 2e-4, "{flavour:?} share={share}: |Δ logp| {worst}");
        }
    }
}

#[test]
fn fused_target_scoring_and_its_backward_equal_the_composed_log_softmax() {
    use treegrpo::train::oracle::scoring::target_logprob_and_entropy;
    let mut rng = Rng::new(4);
    let (m, vocab, t) = (7, 37, 0.7);
    let logits = random_var(&mut rng, &[m, vocab]);
    let targets: Vec<u32> = (0..m).map(|_| rng.below(vocab) as u32).collect();
    let probe = random_var(&mut rng, &[m, 2]).as_tensor().detach();
    let fused = target_logprob_and_entropy(logits.as_tensor(), &targets, t).unwrap();
    // Composed from candle ops that have a backward.
    let z = (logits.as_tensor() / t).unwrap();
    let max = z.max_keepdim(D::Minus1).unwrap().detach();
    let zs = z.broadcast_sub(&max).unwrap();
    let lse = zs
        .exp()
        .unwrap()
        .sum_keepdim(D::Minus1)
        .unwrap()
        .log()
        .unwrap();
    let log_p = zs.broadcast_sub(&lse).unwrap();
    let ids = Tensor::new(targets.as_slice(), &Device::Cpu)
        .unwrap()
        .unsqueeze(1)
        .unwrap();
    let logp = log_p.gather(&ids, 1).unwrap();
    let h = (log_p.exp().unwrap() * &log_p)
        .unwrap()
        .sum_keepdim(D::Minus1)
        .unwrap()
        .neg()
        .unwrap();
    let composed = Tensor::cat(&[logp, h], 1).unwrap();
    assert!(max_rel(&fused, &composed) < 1e-12);
    let ga = (fused * &probe)
        .unwrap()
        .sum_all()
        .unwrap()
        .backward()
        .unwrap();
    let gb = (composed * &probe)
        .unwrap()
        .sum_all()
        .unwrap()
        .backward()
        .unwrap();
    let err = max_rel(
        ga.get(logits.as_tensor()).unwrap(),
        gb.get(logits.as_tensor()).unwrap(),
    );
    assert!(err < 1e-12, "{err}");
}

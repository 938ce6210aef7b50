//! Seeded random forests: a naive second implementation agrees with the layer, and
//! its properties hold on every forest; random corruptions are caught.

use super::*;
use treegrpo::random::{SplitMix64, Uniform};

// ------------------------------------------------------ seeded random forests

/// The library's SplitMix64 (deterministic, no crate), with the draws these tests use.
struct Rng(SplitMix64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0.next_u64()
    }
    fn below(&mut self, n: usize) -> usize {
        self.0.below(n)
    }
    fn unit(&mut self) -> f64 {
        (self.next() >> 11) as f64 / (1u64 << 53) as f64
    }
    fn chance(&mut self, p: f64) -> bool {
        self.unit() < p
    }
}

/// 1–4 trees of 1–10 nodes; some extra roots (virtual root), shuffled node
/// order, junk rewards on some internal nodes, random loss masks. Rewards are
/// binary, uniform, small integers, or all equal to one exact constant.
fn random_trees(rng: &mut Rng) -> Vec<Vec<NodeView>> {
    let kind = rng.below(4);
    let constant = rng.below(5) as f64 * 0.5;
    let reward = |rng: &mut Rng| match kind {
        0 => rng.below(2) as f64,
        1 => rng.unit() * 4.0 - 2.0,
        2 => constant,
        _ => rng.below(4) as f64,
    };
    (0..1 + rng.below(4))
        .map(|_| {
            let n = 1 + rng.below(10);
            let parents: Vec<Option<usize>> = (0..n)
                .map(|i| {
                    if i == 0 || rng.chance(0.1) {
                        None
                    } else {
                        Some(rng.below(i))
                    }
                })
                .collect();
            // Relabel nodes with a random permutation so parents may come after children.
            let mut perm: Vec<usize> = (0..n).collect();
            if rng.chance(0.5) {
                for i in (1..n).rev() {
                    perm.swap(i, rng.below(i + 1));
                }
            }
            let mut nodes = vec![NodeView::default(); n];
            for i in 0..n {
                let is_leaf = !parents.contains(&Some(i));
                let r = if is_leaf {
                    Some(reward(rng))
                } else if rng.chance(0.2) {
                    Some(99.0)
                } else {
                    None
                };
                let mask = (0..rng.below(4)).map(|_| rng.chance(0.5)).collect();
                nodes[perm[i]] = NodeView {
                    parent: parents[i].map(|p| NodeIdx(perm[p])),
                    reward: r,
                    loss_mask: mask,
                };
            }
            nodes
        })
        .collect()
}

// ------------------------------------------------- the naive second opinion

/// (tree, node, reward) of every leaf, tree-major, node order: found by scanning
/// for nodes that nobody names as parent.
fn naive_leaves(trees: &[Vec<NodeView>]) -> Vec<(usize, usize, f64)> {
    let mut out = Vec::new();
    for (t, nodes) in trees.iter().enumerate() {
        for i in 0..nodes.len() {
            if !nodes.iter().any(|n| n.parent == Some(NodeIdx(i))) {
                out.push((t, i, nodes[i].reward.unwrap()));
            }
        }
    }
    out
}

/// (x − mean)/(std + 1e-6) with the unbiased std, from scratch; a group of one
/// has mean 0 and std 1.
fn naive_norm(x: f64, group: &[f64]) -> f64 {
    if group.len() == 1 {
        return x / (1.0 + E);
    }
    let mut sum = 0.0;
    for g in group {
        sum += g;
    }
    let mean = sum / group.len() as f64;
    let mut sq = 0.0;
    for g in group {
        sq += (g - mean) * (g - mean);
    }
    let std = (sq / (group.len() - 1) as f64).sqrt();
    (x - mean) / (std + E)
}

fn naive_advantages(trees: &[Vec<NodeView>], mode: AdvantageMode) -> Vec<f64> {
    let leaves = naive_leaves(trees);
    let prompt: Vec<f64> = leaves.iter().map(|l| l.2).collect();
    let mut out = Vec::new();
    for &(t, _, r) in &leaves {
        let tree: Vec<f64> = leaves.iter().filter(|l| l.0 == t).map(|l| l.2).collect();
        out.push(match mode {
            Tree => naive_norm(r, &tree) + naive_norm(r, &prompt),
            Tree2Norm => {
                let a1: Vec<f64> = tree.iter().map(|&x| naive_norm(x, &prompt)).collect();
                naive_norm(naive_norm(r, &prompt), &a1)
            }
            Inter | Grpo => naive_norm(r, &prompt),
            Intra => naive_norm(r, &tree),
        });
    }
    out
}

/// Root-to-node path by walking parent links (inputs here are known acyclic).
fn naive_path(nodes: &[NodeView], node: usize) -> Vec<usize> {
    let mut path = vec![node];
    while let Some(p) = nodes[*path.last().unwrap()].parent {
        path.push(p.0);
    }
    path.reverse();
    path
}

#[test]
fn naive_implementation_agrees_on_random_forests() {
    let mut rng = Rng(SplitMix64::new(0xA11CE));
    for case in 0..300 {
        let trees = random_trees(&mut rng);
        let f = forest(&trees);
        let leaves = naive_leaves(&trees);
        let prompt_mean = leaves.iter().map(|l| l.2).sum::<f64>() / leaves.len() as f64;
        for mode in MODES {
            let adv = leaf_advantages(&f, mode);
            let naive = naive_advantages(&trees, mode);
            assert_all_close(&format!("case {case} {mode}"), &adv.values(), &naive, 1e-9);
            let packed = packed_weights(&f, &adv).unwrap();
            for (t, nodes) in trees.iter().enumerate() {
                for n in 0..nodes.len() {
                    // Leaves below n: those whose path passes through n.
                    let below: Vec<usize> = (0..leaves.len())
                        .filter(|&k| {
                            leaves[k].0 == t && naive_path(nodes, leaves[k].1).contains(&n)
                        })
                        .collect();
                    let w: f64 = below.iter().map(|&k| naive[k]).sum();
                    assert!(
                        close(packed.trees[t][n], w, 1e-9),
                        "case {case} {mode} packed {t}/{n}"
                    );
                    let value =
                        below.iter().map(|&k| leaves[k].2).sum::<f64>() / below.len() as f64;
                    let sv = &step_values(&f).trees[t][n];
                    assert_eq!(sv.leaves, below.len());
                    assert!(close(sv.value, value, 1e-9), "case {case} value {t}/{n}");
                    let base = nodes[n].parent.map_or(prompt_mean, |p| {
                        let b: Vec<&(usize, usize, f64)> = leaves
                            .iter()
                            .filter(|l| l.0 == t && naive_path(nodes, l.1).contains(&p.0))
                            .collect();
                        b.iter().map(|l| l.2).sum::<f64>() / b.len() as f64
                    });
                    assert!(
                        close(sv.advantage, value - base, 1e-9),
                        "case {case} step adv {t}/{n}"
                    );
                }
            }
            for (k, &(t, n, _)) in leaves.iter().enumerate() {
                let want: Vec<f64> = naive_path(&trees[t], n)
                    .iter()
                    .flat_map(|&p| {
                        trees[t][p]
                            .loss_mask
                            .iter()
                            .map(|&m| if m { naive[k] } else { 0.0 })
                    })
                    .collect();
                let got = token_advantages(&f, &adv, t, NodeIdx(n)).unwrap();
                assert_all_close(
                    &format!("case {case} {mode} tokens {t}/{n}"),
                    &got,
                    &want,
                    1e-9,
                );
            }
        }
    }
}

// ------------------------------------------------------------ property tests

#[test]
fn properties_on_random_forests() {
    let mut rng = Rng(SplitMix64::new(0x5EED));
    for case in 0..400 {
        let trees = random_trees(&mut rng);
        let f = forest(&trees);
        let [tree, two, inter, intra, grpo] = MODES.map(|m| leaf_advantages(&f, m));

        // tree == inter + intra, bit for bit; grpo == inter.
        for ((t, a), b) in tree.leaves.iter().zip(&inter.leaves).zip(&intra.leaves) {
            assert_eq!(
                t.advantage.to_bits(),
                (a.advantage + b.advantage).to_bits(),
                "case {case}"
            );
        }
        assert_eq!(grpo.values(), inter.values());

        for t in f.trees() {
            // Within a tree of ≥2 leaves, intra (and 2norm) advantages sum to ~0.
            if t.leaves().len() >= 2 {
                for adv in [&intra, &two] {
                    let sum: f64 = t
                        .leaves()
                        .iter()
                        .map(|&l| adv.get(t.index(), l).unwrap())
                        .sum();
                    assert!(
                        sum.abs() <= 1e-9,
                        "case {case} {}: tree {} sums to {sum}",
                        adv.mode,
                        t.index()
                    );
                }
            }
            // A node's value is its children's values weighted by their leaf counts.
            let sv = &step_values(&f).trees[t.index()];
            for n in 0..t.num_nodes() {
                let kids = t.children(NodeIdx(n)).unwrap();
                if !kids.is_empty() {
                    let w: f64 = kids
                        .iter()
                        .map(|c| sv[c.0].value * sv[c.0].leaves as f64)
                        .sum();
                    let count: usize = kids.iter().map(|c| sv[c.0].leaves).sum();
                    assert_eq!(count, sv[n].leaves);
                    assert!(
                        close(sv[n].value, w / count as f64, 1e-9),
                        "case {case} node {n}"
                    );
                }
            }
        }

        for adv in [&tree, &two, &inter, &intra, &grpo] {
            let packed = packed_weights(&f, adv).unwrap();
            let (mut per_leaf_tokens, mut packed_tokens) = (0.0, 0.0);
            for t in f.trees() {
                // Root(s) carry the sum of all the tree's leaf advantages.
                let roots: f64 = (0..t.num_nodes())
                    .filter(|&n| t.parent(NodeIdx(n)).is_none())
                    .map(|n| packed.trees[t.index()][n])
                    .sum();
                let leaves: f64 = t
                    .leaves()
                    .iter()
                    .map(|&l| adv.get(t.index(), l).unwrap())
                    .sum();
                assert!(
                    close(roots, leaves, 1e-9),
                    "case {case} {}: root {roots} vs leaves {leaves}",
                    adv.mode
                );
                // Packing identity: training every trajectory token by token gives
                // the same total weight as training each unique node once.
                for &l in t.leaves() {
                    per_leaf_tokens += token_advantages(&f, adv, t.index(), l)
                        .unwrap()
                        .iter()
                        .sum::<f64>();
                }
                for n in 0..t.num_nodes() {
                    packed_tokens += packed
                        .node_tokens(&f, t.index(), NodeIdx(n))
                        .unwrap()
                        .iter()
                        .sum::<f64>();
                }
            }
            assert!(
                close(per_leaf_tokens, packed_tokens, 1e-9),
                "case {case} {}",
                adv.mode
            );
        }
    }
}

#[test]
fn random_corruptions_are_caught() {
    use AdvantageError::*;
    let mut rng = Rng(SplitMix64::new(0xBAD));
    for case in 0..200 {
        let mut trees = random_trees(&mut rng);
        let t = rng.below(trees.len());
        let n = rng.below(trees[t].len());
        let len = trees[t].len();
        let is_leaf = !trees[t].iter().any(|x| x.parent == Some(NodeIdx(n)));
        let err = match rng.below(3) {
            0 if is_leaf => {
                trees[t][n].reward = None;
                MissingReward {
                    tree: t,
                    node: NodeIdx(n),
                }
            }
            1 => {
                trees[t][n].parent = Some(NodeIdx(len + 3));
                ParentOutOfRange {
                    tree: t,
                    node: NodeIdx(n),
                    parent: NodeIdx(len + 3),
                    len,
                }
            }
            _ => {
                trees[t][n].parent = Some(NodeIdx(n));
                let got = build(trees).unwrap_err();
                assert!(
                    matches!(got, Cycle { tree, .. } if tree == t),
                    "case {case}: {got}"
                );
                continue;
            }
        };
        assert_eq!(build(trees).unwrap_err(), err, "case {case}");
    }
}

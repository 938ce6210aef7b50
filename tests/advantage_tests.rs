//! Tests of the Tree-GRPO advantage layer: hand-computed golden cases, error
//! cases, property tests over seeded random forests, and agreement with a
//! deliberately naive re-implementation written below.

use treegrpo::advantage::{
    leaf_advantages, packed_weights, step_values, token_advantages, AdvantageError, AdvantageMode,
    NodeIdx, NodeView, PromptForest, TreeView, STD_EPS,
};

const E: f64 = 1e-6; // the std epsilon, spelled out for the hand arithmetic
const MODES: [AdvantageMode; 5] = AdvantageMode::ALL;
use AdvantageMode::{Grpo, Inter, Intra, Tree, Tree2Norm};

fn root() -> NodeView {
    NodeView::root()
}
fn step(parent: usize) -> NodeView {
    NodeView::step(parent)
}
fn leaf(parent: usize, reward: f64) -> NodeView {
    NodeView::leaf(Some(parent), reward)
}
fn forest(trees: &[Vec<NodeView>]) -> PromptForest {
    let views = trees
        .iter()
        .map(|nodes| TreeView {
            nodes: nodes.clone(),
        })
        .collect();
    PromptForest::new(views).expect("valid forest")
}
fn close(a: f64, b: f64, tol: f64) -> bool {
    (a - b).abs() <= tol * b.abs().max(1.0)
}
fn assert_all_close(what: &str, got: &[f64], want: &[f64], tol: f64) {
    assert_eq!(got.len(), want.len(), "{what}: length");
    for (i, (g, w)) in got.iter().zip(want).enumerate() {
        assert!(close(*g, *w, tol), "{what}[{i}]: got {g}, want {w}");
    }
}

/// Data-driven golden check: per-leaf advantages (tree-major, node order) for one mode.
fn check(name: &str, trees: &[Vec<NodeView>], mode: AdvantageMode, want: &[f64]) {
    let got = leaf_advantages(&forest(trees), mode).values();
    assert_all_close(&format!("{name}/{mode}"), &got, want, 1e-9);
}

// ---------------------------------------------------------------- golden cases

#[test]
fn golden_binary_rewards() {
    // tree 0: leaves r = 1, 0; tree 1: leaves r = 1, 1.
    let trees = [
        vec![root(), leaf(0, 1.0), leaf(0, 0.0)],
        vec![root(), leaf(0, 1.0), leaf(0, 1.0)],
    ];
    // prompt [1,0,1,1]: mean .75, var (3·.0625 + .5625)/3 = .25, std .5
    //   inter: .25/.500001 = 0.499999000002, -.75/.500001 = -1.499997000006
    // tree 0 [1,0]: mean .5, std √.5 = .70710678..; intra ±.5/(.70710678..+1e-6) = ±0.70710578118796
    // tree 1 [1,1]: std 0, intra 0
    let (p, n) = (0.499999000002, -1.499997000006);
    check("binary", &trees, Inter, &[p, n, p, p]);
    check("binary", &trees, Grpo, &[p, n, p, p]);
    check(
        "binary",
        &trees,
        Intra,
        &[0.7071057811879616, -0.7071057811879616, 0.0, 0.0],
    );
    // tree = intra + inter: .70710578.. + .499999.. ; -.70710578.. - 1.499997..
    check(
        "binary",
        &trees,
        Tree,
        &[1.2071047811899616, -2.2071027811939614, p, p],
    );
    // 2norm, tree 0 renormalises [p, n]: ±((p−n)/2)/(|p−n|/√2 + 1e-6)
    //   = ±0.999998/(1.41421073.. + 1e-6) = ±0.7071062811859011; tree 1: [p, p] → 0
    check(
        "binary",
        &trees,
        Tree2Norm,
        &[0.7071062811859011, -0.7071062811859011, 0.0, 0.0],
    );
}

#[test]
fn golden_all_equal_rewards_give_zero() {
    // Every group has ≥2 leaves and zero spread: (r − mean)/(0 + 1e-6) = 0 in every mode.
    let trees = [
        vec![root(), step(0), leaf(1, 1.0), leaf(1, 1.0), leaf(0, 1.0)],
        vec![root(), leaf(0, 1.0), leaf(0, 1.0)],
    ];
    for mode in MODES {
        check("all-equal", &trees, mode, &[0.0; 5]);
    }
}

#[test]
fn golden_groups_of_one() {
    // One chain, r = 2: every group has one leaf → mean 0, std 1: term 2/(1+1e-6).
    let chain = [vec![root(), step(0), leaf(1, 2.0)]];
    check("lone", &chain, Inter, &[1.9999980000020001]); // 2/1.000001
    check("lone", &chain, Intra, &[1.9999980000020001]);
    check("lone", &chain, Tree, &[3.9999960000040002]); // 2·2/1.000001
    check("lone", &chain, Tree2Norm, &[1.9999960000060002]); // 2/1.000001²

    // GRPO: three one-leaf chains r = 0, 1, 2; prompt mean 1, std 1.
    let chains = [
        vec![root(), leaf(0, 0.0)],
        vec![root(), leaf(0, 1.0)],
        vec![root(), leaf(0, 2.0)],
    ];
    let u = 0.9999990000010001; // 1/1.000001
    check("chains", &chains, Grpo, &[-u, 0.0, u]); // (r−1)/(1+1e-6)
    check("chains", &chains, Inter, &[-u, 0.0, u]);
    check("chains", &chains, Intra, &[0.0, u, 2.0 * u]); // each tree is a group of one: r/(1+1e-6)
    check("chains", &chains, Tree, &[-u, u, 2.9999970000030003]); // (r−1 + r)/1.000001
    let u2 = 0.9999980000030001; // 1/1.000001²: lone-tree renormalisation of ±u
    check("chains", &chains, Tree2Norm, &[-u2, 0.0, u2]);

    // The same chains as one tree of parentless leaves (a virtual root):
    // tree group = prompt group = [0,1,2].
    let flat = [vec![
        NodeView::leaf(None, 0.0),
        NodeView::leaf(None, 1.0),
        NodeView::leaf(None, 2.0),
    ]];
    check("flat", &flat, Grpo, &[-u, 0.0, u]);
    check("flat", &flat, Intra, &[-u, 0.0, u]);
    check("flat", &flat, Tree, &[-2.0 * u, 0.0, 2.0 * u]);
}

/// Tree cut to K = 3 leaves: node 2 lost one of its two leaves, so it has 1.
///
/// ```text
///        0            leaves: 3 (r=0), 4 (r=1), 5 (r=2)
///      /   \
///     1     2
///    / \     \
///   3   4     5     (6, the pruned sibling of 5, is gone)
/// ```
fn cut_tree() -> Vec<NodeView> {
    let m = |v: &[u8]| v.iter().map(|&b| b == 1).collect::<Vec<bool>>();
    vec![
        root().with_loss_mask(m(&[1, 1])),
        step(0).with_loss_mask(m(&[1, 0, 0])),
        step(0).with_loss_mask(m(&[0, 1])),
        leaf(1, 0.0).with_loss_mask(m(&[1])),
        leaf(1, 1.0),
        leaf(2, 2.0).with_loss_mask(m(&[1, 1])),
    ]
}

#[test]
fn golden_tree_cut_to_k_leaves() {
    let trees = [cut_tree()];
    let u = 0.9999990000010001; // 1/1.000001
                                // rewards [0,1,2]: mean 1, std 1 for both the tree and the (one-tree) prompt.
    check("cut", &trees, Intra, &[-u, 0.0, u]);
    check("cut", &trees, Inter, &[-u, 0.0, u]);
    check("cut", &trees, Tree, &[-2.0 * u, 0.0, 2.0 * u]);
    // 2norm: a1 = ±u, 0 → std u → ±u/(u + 1e-6) = ±1/(1 + 1e-6 + 1e-12) ≈ ±0.999999
    check("cut", &trees, Tree2Norm, &[-0.999999, 0.0, 0.999999]);

    let f = forest(&trees);
    let sv = step_values(&f);
    let t = &sv.trees[0];
    // leaf counts: root 3, node 1 two, node 2 only one (its sibling subtree was pruned)
    let counts: Vec<usize> = t.iter().map(|s| s.leaves).collect();
    assert_eq!(counts, [3, 2, 1, 1, 1, 1]);
    // values: root (0+1+2)/3 = 1, node 1 (0+1)/2 = .5, node 2 = 2, leaves = rewards
    assert_all_close(
        "values",
        &t.iter().map(|s| s.value).collect::<Vec<_>>(),
        &[1.0, 0.5, 2.0, 0.0, 1.0, 2.0],
        1e-12,
    );
    // advantages: root 1 − prompt mean 1 = 0; .5−1; 2−1; 0−.5; 1−.5; 2−2
    let adv: Vec<f64> = t.iter().map(|s| s.advantage).collect();
    assert_all_close("step adv", &adv, &[0.0, -0.5, 1.0, -0.5, 0.5, 0.0], 1e-12);

    // packed (intra): node 1 = −u + 0, node 2 = u, root = −u + 0 + u = 0
    let intra = leaf_advantages(&f, Intra);
    let pw = packed_weights(&f, &intra).unwrap();
    assert_all_close("packed", &pw.trees[0], &[0.0, -u, u, -u, 0.0, u], 1e-12);
    // node 1's tokens [model, obs, obs] → [−u, 0, 0]
    assert_all_close(
        "node tokens",
        &pw.node_tokens(&f, 0, NodeIdx(1)).unwrap(),
        &[-u, 0.0, 0.0],
        1e-12,
    );
}

#[test]
fn golden_token_advantages() {
    let f = forest(&[cut_tree()]);
    let intra = leaf_advantages(&f, Intra);
    let u = 0.9999990000010001;
    let tok = |leaf| token_advantages(&f, &intra, 0, NodeIdx(leaf)).unwrap();
    // leaf 3 (A = −u): root [m,m] + node 1 [m,o,o] + leaf 3 [m]
    assert_all_close("leaf 3", &tok(3), &[-u, -u, -u, 0.0, 0.0, -u], 0.0);
    // leaf 4 (A = 0): 2 + 3 + 0 tokens, all zero
    assert_all_close("leaf 4", &tok(4), &[0.0; 5], 0.0);
    // leaf 5 (A = u): root [m,m] + node 2 [o,m] + leaf 5 [m,m]
    assert_all_close("leaf 5", &tok(5), &[u, u, 0.0, u, u, u], 0.0);
}

#[test]
fn golden_trees_of_different_sizes() {
    // tree 0: three leaves r = 0,1,2; tree 1: a chain ending in one leaf r = 3.
    let trees = [
        vec![root(), leaf(0, 0.0), leaf(0, 1.0), leaf(0, 2.0)],
        vec![root(), step(0), leaf(1, 3.0)],
    ];
    // prompt [0,1,2,3]: mean 1.5, var (2.25+.25+.25+2.25)/3 = 5/3, std 1.2909944487358056
    //   c = 1/(std + 1e-6) = 0.7745960692419482 → inter = (r − 1.5)·c
    let c = 0.7745960692419482;
    check(
        "sizes",
        &trees,
        Inter,
        &[-1.5 * c, -0.5 * c, 0.5 * c, 1.5 * c],
    );
    // intra: tree 0 mean 1 std 1 → (r−1)/1.000001; tree 1 is a group of one → 3/1.000001
    let u = 0.9999990000010001;
    check("sizes", &trees, Intra, &[-u, 0.0, u, 2.9999970000030003]);
    // tree: −u − 1.5c, −.5c, u + .5c, 3u + 1.5c
    check(
        "sizes",
        &trees,
        Tree,
        &[
            -2.1618931038639224,
            -0.3872980346209741,
            1.3872970346219742,
            4.161891103865923,
        ],
    );
    // 2norm: tree 0 a1 = c·(−1.5,−.5,.5): mean −.5c, std c → c·(−1,0,1)/(c+1e-6) = ±0.99999870900622
    //        tree 1 alone: 1.5c/(1+1e-6) = 1.1618929419699806
    check(
        "sizes",
        &trees,
        Tree2Norm,
        &[
            -0.9999987090062179,
            0.0,
            0.9999987090062179,
            1.1618929419699806,
        ],
    );
}

// ----------------------------------------------------------------- input errors

fn build(trees: Vec<Vec<NodeView>>) -> Result<PromptForest, AdvantageError> {
    PromptForest::new(trees.into_iter().map(|nodes| TreeView { nodes }).collect())
}

#[test]
fn invalid_input_is_a_typed_error() {
    use AdvantageError::*;
    assert_eq!(build(vec![]).unwrap_err(), EmptyPromptGroup);
    assert_eq!(
        build(vec![vec![root(), leaf(0, 1.0)], vec![]]).unwrap_err(),
        EmptyTree { tree: 1 }
    );
    let missing = vec![root(), step(0), leaf(0, 1.0)]; // node 1 is a leaf without reward
    assert_eq!(
        build(vec![missing]).unwrap_err(),
        MissingReward {
            tree: 0,
            node: NodeIdx(1)
        }
    );
    let bad = build(vec![vec![root(), step(7)]]).unwrap_err();
    assert_eq!(
        bad,
        ParentOutOfRange {
            tree: 0,
            node: NodeIdx(1),
            parent: NodeIdx(7),
            len: 2
        }
    );
    let self_loop = vec![root(), leaf(0, 1.0), leaf(2, 1.0)];
    assert_eq!(
        build(vec![self_loop]).unwrap_err(),
        Cycle {
            tree: 0,
            node: NodeIdx(2)
        }
    );
    let two_cycle = vec![root(), leaf(0, 1.0), step(3), step(2)];
    assert_eq!(
        build(vec![two_cycle]).unwrap_err(),
        Cycle {
            tree: 0,
            node: NodeIdx(2)
        }
    );
    let no_root = vec![step(1), step(0)];
    assert!(matches!(build(vec![no_root]).unwrap_err(), Cycle { .. }));
    let nan = build(vec![vec![root(), leaf(0, f64::NAN)]]).unwrap_err();
    assert!(matches!(
        nan,
        NonFiniteReward {
            tree: 0,
            node: NodeIdx(1),
            ..
        }
    ));

    let f = forest(&[cut_tree()]);
    let adv = leaf_advantages(&f, Tree);
    assert_eq!(
        token_advantages(&f, &adv, 0, NodeIdx(1)).unwrap_err(),
        NotALeaf {
            tree: 0,
            node: NodeIdx(1)
        }
    );
    assert_eq!(
        token_advantages(&f, &adv, 3, NodeIdx(1)).unwrap_err(),
        TreeOutOfRange { tree: 3, trees: 1 }
    );
    let other = forest(&[vec![root(), leaf(0, 1.0)]]);
    let other_adv = leaf_advantages(&other, Tree);
    assert!(matches!(
        packed_weights(&f, &other_adv).unwrap_err(),
        MissingAdvantage { .. }
    ));
}

#[test]
fn internal_rewards_are_ignored() {
    let mut with = cut_tree();
    with[1].reward = Some(100.0);
    let (a, b) = (forest(&[with]), forest(&[cut_tree()]));
    assert_eq!(
        leaf_advantages(&a, Tree).values(),
        leaf_advantages(&b, Tree).values()
    );
}

#[test]
fn mode_names_round_trip() {
    let names = ["tree", "tree-2norm", "inter", "intra", "grpo"];
    for (mode, name) in MODES.into_iter().zip(names) {
        assert_eq!(mode.to_string(), name);
        assert_eq!(name.parse::<AdvantageMode>().unwrap(), mode);
        assert_eq!(serde_json::to_string(&mode).unwrap(), format!("\"{name}\""));
        assert_eq!(
            serde_json::from_str::<AdvantageMode>(&format!("\"{name}\"")).unwrap(),
            mode
        );
    }
    assert_eq!(AdvantageMode::default(), Tree);
    assert_eq!(
        "tree2norm".parse::<AdvantageMode>().unwrap_err(),
        AdvantageError::UnknownMode("tree2norm".into())
    );
    assert_eq!(STD_EPS, E);
}

#[test]
fn outputs_serialise() {
    let f = forest(&[cut_tree()]);
    let adv = leaf_advantages(&f, Tree2Norm);
    let json = serde_json::to_string(&adv).unwrap();
    assert!(
        json.starts_with(r#"{"mode":"tree-2norm","leaves":[{"tree":0,"node":3,"reward":0.0,"#),
        "{json}"
    );
    serde_json::to_string(&step_values(&f)).unwrap();
    serde_json::to_string(&packed_weights(&f, &adv).unwrap()).unwrap();
    let node: NodeView = serde_json::from_str(r#"{"parent":0,"reward":1.5}"#).unwrap();
    assert_eq!(node, leaf(0, 1.5));
}

// ------------------------------------------------------ seeded random forests

/// SplitMix64: a tiny deterministic RNG so the property tests need no crate.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }
    fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
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
    let mut rng = Rng(0xA11CE);
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
    let mut rng = Rng(0x5EED);
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
    let mut rng = Rng(0xBAD);
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

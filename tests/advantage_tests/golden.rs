//! Hand-computed golden cases of every advantage mode, and the typed errors of bad
//! input.

use super::*;

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
        AdvantageError::UnknownMode {
            given: "tree2norm".into()
        }
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

//! Tests of the Tree-GRPO advantage layer: hand-computed golden cases and error
//! cases (`golden.rs`), property tests over seeded random forests and agreement with
//! a deliberately naive re-implementation (`random.rs`). One test binary: the
//! helpers below are shared by both.

mod golden;
mod random;

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

/// A forest from `trees`, or the layer's typed error for it.
fn build(trees: Vec<Vec<NodeView>>) -> Result<PromptForest, AdvantageError> {
    PromptForest::new(trees.into_iter().map(|nodes| TreeView { nodes }).collect())
}

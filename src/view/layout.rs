//! Where each node of a tree is drawn: a tidy tree over the parent links (leaves
//! take consecutive horizontal slots, an inner node sits centred over its first and
//! last child, depth runs top-down), and the slot/depth → pixel mapping.

use std::collections::HashMap;

use crate::rollout::{NodeId, Tree};

use super::{LEVEL_H, MARGIN, RADIUS, SLOT_W};

/// Where each node of a tree is drawn.
pub(super) struct Layout {
    /// Per node (index into `tree.nodes`): horizontal slot position (leaves are whole
    /// numbers) and drawn depth.
    pub(super) x: Vec<f64>,
    pub(super) depth: Vec<usize>,
    /// Drawn parent → child edges, as node indices.
    pub(super) edges: Vec<(usize, usize)>,
    /// Per node: whether it has drawn children.
    pub(super) has_children: Vec<bool>,
    pub(super) slots: usize,
    pub(super) max_depth: usize,
}

/// Tidy layout over the parent links. Robust to any input: unknown or self parents
/// make a node a root, cycles are cut, every node is placed exactly once.
pub(super) fn layout(tree: &Tree) -> Layout {
    let n = tree.nodes.len();
    let mut index_of: HashMap<NodeId, usize> = HashMap::with_capacity(n);
    for (i, node) in tree.nodes.iter().enumerate() {
        index_of.entry(node.id).or_insert(i);
    }
    let mut children: Vec<Vec<usize>> = vec![Vec::new(); n];
    let mut is_root = vec![false; n];
    for (i, node) in tree.nodes.iter().enumerate() {
        match node.parent.and_then(|p| index_of.get(&p).copied()) {
            Some(p) if p != i => children[p].push(i),
            _ => is_root[i] = true,
        }
    }

    let mut x = vec![0.0; n];
    let mut depth = vec![0usize; n];
    let mut visited = vec![false; n];
    let mut drawn: Vec<Vec<usize>> = vec![Vec::new(); n];
    let mut edges = Vec::new();
    let mut slots = 0usize;
    // Roots first, then whatever a cycle kept out of reach, each as a root of its own.
    let starts: Vec<usize> = (0..n)
        .filter(|&i| is_root[i])
        .chain((0..n).filter(|&i| !is_root[i]))
        .collect();
    for start in starts {
        if visited[start] {
            continue;
        }
        visited[start] = true;
        // Iterative post-order: (node, children already pushed).
        let mut stack = vec![(start, false)];
        while let Some((i, expanded)) = stack.pop() {
            if !expanded {
                stack.push((i, true));
                let kids: Vec<usize> = children[i]
                    .iter()
                    .copied()
                    .filter(|&c| !visited[c])
                    .collect();
                for &c in &kids {
                    visited[c] = true;
                    depth[c] = depth[i] + 1;
                    edges.push((i, c));
                }
                for &c in kids.iter().rev() {
                    stack.push((c, false));
                }
                drawn[i] = kids;
            } else if let (Some(&first), Some(&last)) = (drawn[i].first(), drawn[i].last()) {
                x[i] = (x[first] + x[last]) / 2.0;
            } else {
                x[i] = slots as f64;
                slots += 1;
            }
        }
    }
    let max_depth = depth.iter().copied().max().unwrap_or(0);
    let has_children = drawn.iter().map(|d| !d.is_empty()).collect();
    Layout {
        x,
        depth,
        edges,
        has_children,
        slots,
        max_depth,
    }
}

pub(super) fn px(slot: f64) -> f64 {
    MARGIN + slot * SLOT_W + SLOT_W / 2.0
}

pub(super) fn py(depth: usize) -> f64 {
    MARGIN + RADIUS + depth as f64 * LEVEL_H
}

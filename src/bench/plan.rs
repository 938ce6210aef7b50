//! Which rows a bench run measures, and in what order: the default modes, or those
//! `only` names (by label, `tree-2-2-1`, or by kind, `tree`), with the peer engine's
//! chain row (feature `mistralrs`) right after our first chain row, so the two
//! engines' chains are measured back to back.

use super::modes::{default_modes, BenchMode, ModeKind};

/// G of the peer's chain row: as our chain mode's.
#[cfg(feature = "mistralrs")]
const PEER_CHAINS: usize = 4;

/// One row of a bench run.
#[derive(Debug, Clone, PartialEq)]
pub enum BenchRow {
    /// One of our modes.
    Ours(BenchMode),
    /// The peer engine's G chains per prompt.
    #[cfg(feature = "mistralrs")]
    PeerChain(usize),
}

/// Whether `only` (empty: everything) asks for the row with this label and kind.
fn wanted(only: &[String], label: &str, kind: ModeKind) -> bool {
    only.is_empty() || only.iter().any(|o| o == label || o == kind.name())
}

/// The rows `only` selects (empty: every row this build can run), in the order they
/// run. An empty answer means `only` matched nothing.
pub fn bench_rows(only: &[String]) -> Vec<BenchRow> {
    let modes: Vec<BenchMode> = default_modes()
        .into_iter()
        .filter(|m| wanted(only, &m.label, m.mode))
        .collect();
    #[cfg(feature = "mistralrs")]
    let peer = wanted(
        only,
        &format!("mistralrs-chain-{PEER_CHAINS}"),
        ModeKind::MistralrsChain,
    )
    .then_some(BenchRow::PeerChain(PEER_CHAINS));
    #[cfg(not(feature = "mistralrs"))]
    let peer: Option<BenchRow> = None;
    in_order(modes, peer)
}

/// `modes` in their order, with `peer` right after the first chain mode (or last).
fn in_order(modes: Vec<BenchMode>, mut peer: Option<BenchRow>) -> Vec<BenchRow> {
    let mut rows = Vec::with_capacity(modes.len() + 1);
    for mode in modes {
        let is_chain = mode.mode == ModeKind::Chain;
        rows.push(BenchRow::Ours(mode));
        if is_chain {
            rows.extend(peer.take());
        }
    }
    rows.extend(peer);
    rows
}

#[cfg(test)]
mod tests {
    use super::*;

    fn labels(rows: &[BenchRow]) -> Vec<String> {
        rows.iter()
            .map(|r| match r {
                BenchRow::Ours(m) => m.label.clone(),
                #[cfg(feature = "mistralrs")]
                BenchRow::PeerChain(g) => format!("mistralrs-chain-{g}"),
            })
            .collect()
    }

    #[test]
    fn only_selects_by_label_or_kind_in_the_default_order() {
        let all = bench_rows(&[]);
        assert!(labels(&all).starts_with(&["chain-4".to_string()]));
        let only = |o: &[&str]| {
            labels(&bench_rows(
                &o.iter().map(|s| s.to_string()).collect::<Vec<_>>(),
            ))
        };
        assert_eq!(only(&["tree-2-2-1"]), ["tree-2-2-1"]);
        assert_eq!(
            only(&["tree-recompute", "chain-4"]),
            ["chain-4", "tree-recompute-2-2-1"]
        );
        assert!(only(&["nothing"]).is_empty());
    }

    #[cfg(feature = "mistralrs")]
    #[test]
    fn the_peer_chain_row_follows_our_first_chain_row() {
        let rows = labels(&bench_rows(&[]));
        assert_eq!(rows[..2], ["chain-4", "mistralrs-chain-4"]);
        let peer_only = labels(&bench_rows(&["mistralrs-chain".into()]));
        assert_eq!(peer_only, ["mistralrs-chain-4"]);
    }
}

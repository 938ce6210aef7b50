//! `treegrpo view`: draw a rollout's `forest.jsonl` as one self-contained HTML page.

use std::path::PathBuf;

use anyhow::Context;
use clap::Args;
use treegrpo::rollout::read_forest;
use treegrpo::view::render_forest_html;

#[derive(Debug, Args)]
pub struct ViewArgs {
    /// The forest file a rollout wrote (`DIR/forest.jsonl`).
    pub forest: PathBuf,
    /// Where to write the HTML page.
    #[arg(long, default_value = "tree.html")]
    pub out: PathBuf,
}

pub fn run(a: ViewArgs) -> anyhow::Result<()> {
    let trees = read_forest(&a.forest)?;
    if trees.is_empty() {
        anyhow::bail!("{}: no trees in the file", a.forest.display());
    }
    let nodes: usize = trees.iter().map(|t| t.nodes.len()).sum();
    let html = render_forest_html(&trees);
    std::fs::write(&a.out, html).with_context(|| format!("writing {}", a.out.display()))?;
    println!(
        "wrote {}: {} trees, {} nodes",
        a.out.display(),
        trees.len(),
        nodes
    );
    Ok(())
}

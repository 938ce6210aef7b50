//! The presentation layer above `rollout`: a forest drawn as one self-contained HTML
//! page (`treegrpo view`), and reward curves as SVG ([`plot`]): what a person
//! looks at to see how a rollout's trees branched, which leaves earned reward, and what
//! the model wrote at each step.
//!
//! The page is plain data in, a string out: inline SVG per tree, inline CSS, a little
//! inline JS for the click-to-inspect panel, and nothing fetched from the network. Every
//! string from the forest is HTML-escaped (in SVG text, tooltips and attributes) or, for
//! the panel, embedded as JSON with `<`, `>` and `&` written as `\u` escapes and put into
//! the page with `textContent`, never `innerHTML`.
//!
//! Layout is a simple tidy tree: leaves take consecutive horizontal slots, an inner node
//! sits centred over its first and last child, depth runs top-down. The SVG keeps its
//! natural size (width grows with the leaf count) inside a horizontally scrolling box, so
//! large trees stay readable instead of shrinking.

use std::fmt::Write as _;

use serde::Serialize;

use crate::env::Action;
use crate::rollout::{Node, NodeId, Tree};

mod layout;
pub mod plot;
use layout::{layout, px, py};

/// Horizontal room per leaf, in pixels.
pub(crate) const SLOT_W: f64 = 64.0;
/// Vertical distance between depths.
pub(crate) const LEVEL_H: f64 = 92.0;
pub(crate) const MARGIN: f64 = 28.0;
pub(crate) const RADIUS: f64 = 13.0;
/// Height of one label line under a node.
const LINE_H: f64 = 12.0;
/// Room under the deepest row for its label lines (up to three).
const LABEL_ROOM: f64 = 3.0 * LINE_H + 6.0;
/// Characters of step text shown in a hover tooltip (the click panel shows all).
const TOOLTIP_CHARS: usize = 400;

/// Escapes text for HTML element content and quoted attribute values.
pub fn escape_html(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&#39;"),
            _ => out.push(c),
        }
    }
    out
}

/// A short name for a node's action.
fn kind_label(node: &Node) -> &'static str {
    match &node.action {
        Some(Action::Search(_)) => "search",
        Some(Action::Answer(_)) => "answer",
        Some(Action::Calc(_)) => "calc",
        Some(Action::Invalid(_)) => "invalid",
        Some(Action::External { .. }) => "step",
        None if node.parent.is_none() => "prompt",
        None => "step",
    }
}

/// The action's content, or why it is invalid.
fn action_text(action: &Option<Action>) -> Option<String> {
    match action {
        Some(Action::Invalid(reason)) => Some(format!("invalid: {reason:?}")),
        Some(a) => a.content().map(str::to_string),
        None => None,
    }
}

/// Fill colour of a node: reward from red (0) to green (1), grey for a leaf without a
/// (finite) reward, neutral for inner steps.
fn fill(node: &Node, is_leaf: bool) -> String {
    match node.reward {
        Some(r) if r.is_finite() => {
            let r = r.clamp(0.0, 1.0);
            format!("hsl({:.0},68%,44%)", r * 120.0)
        }
        _ if is_leaf => "#9e9e9e".to_string(),
        _ if node.parent.is_none() => "#455a64".to_string(),
        _ => "#dde3e8".to_string(),
    }
}

fn fmt_opt(v: Option<f64>) -> String {
    match v {
        Some(v) => format!("{v:.3}"),
        None => "—".to_string(),
    }
}

fn fmt_signed(v: f64) -> String {
    if v.is_finite() {
        format!("{v:+.2}")
    } else {
        format!("{v}")
    }
}

fn truncate_chars(s: &str, max: usize) -> String {
    match s.char_indices().nth(max) {
        Some((cut, _)) => format!("{}…", &s[..cut]),
        None => s.to_string(),
    }
}

fn mean_reward(tree: &Tree) -> Option<f64> {
    let rewards: Vec<f64> = tree.leaves().filter_map(|n| n.reward).collect();
    if rewards.is_empty() {
        None
    } else {
        Some(rewards.iter().sum::<f64>() / rewards.len() as f64)
    }
}

/// What the click panel shows for one node (embedded as JSON).
#[derive(Serialize)]
struct NodeData<'a> {
    id: NodeId,
    parent: Option<NodeId>,
    depth: usize,
    kind: &'static str,
    action: Option<String>,
    text: &'a str,
    observation: Option<&'a str>,
    terminal: bool,
    reward: Option<f64>,
    value: Option<f64>,
    advantage: Option<f64>,
    tokens: usize,
    obs_tokens: usize,
    mean_logprob: Option<f64>,
}

#[derive(Serialize)]
struct TreeData<'a> {
    prompt_uid: &'a str,
    tree_id: usize,
    nodes: Vec<NodeData<'a>>,
}

fn node_data(node: &Node) -> NodeData<'_> {
    let mean_logprob = if node.logprobs.is_empty() {
        None
    } else {
        Some(node.logprobs.iter().map(|&l| l as f64).sum::<f64>() / node.logprobs.len() as f64)
    };
    NodeData {
        id: node.id,
        parent: node.parent,
        depth: node.depth,
        kind: kind_label(node),
        action: action_text(&node.action),
        text: &node.text,
        observation: node.observation.as_deref(),
        terminal: node.terminal,
        reward: node.reward,
        value: node.value,
        advantage: node.advantage,
        tokens: node.tokens.len(),
        obs_tokens: node.obs_tokens.len(),
        mean_logprob,
    }
}

/// JSON safe inside a `<script>` element: `<`, `>` and `&` only ever occur inside JSON
/// strings, where their `\u` escapes mean the same.
fn script_json<T: Serialize>(value: &T) -> String {
    let json = serde_json::to_string(value).unwrap_or_else(|_| "[]".to_string());
    json.replace('<', "\\u003c")
        .replace('>', "\\u003e")
        .replace('&', "\\u0026")
}

fn tooltip(node: &Node) -> String {
    let mut t = format!(
        "node {} · depth {} · {}",
        node.id,
        node.depth,
        kind_label(node)
    );
    if let Some(a) = action_text(&node.action) {
        let _ = write!(t, ": {}", truncate_chars(&a, 120));
    }
    let _ = write!(
        t,
        "\nreward {} · value {} · advantage {}\ntokens {} · observation tokens {}",
        fmt_opt(node.reward),
        fmt_opt(node.value),
        fmt_opt(node.advantage),
        node.tokens.len(),
        node.obs_tokens.len()
    );
    if !node.text.is_empty() {
        let _ = write!(t, "\n\n{}", truncate_chars(&node.text, TOOLTIP_CHARS));
    }
    if let Some(obs) = &node.observation {
        let _ = write!(t, "\n\nobservation: {}", truncate_chars(obs, 200));
    }
    t
}

/// The label lines under a node, as (CSS class, text): the action kind, the advantage
/// (if known), the reward (if any).
fn label_lines(node: &Node) -> Vec<(&'static str, String)> {
    let mut lines = vec![("kind", kind_label(node).to_string())];
    if let Some(a) = node.advantage {
        let class = if a > 0.0 {
            "adv pos"
        } else if a < 0.0 {
            "adv neg"
        } else {
            "adv zero"
        };
        lines.push((class, format!("A {}", fmt_signed(a))));
    }
    if let Some(r) = node.reward {
        lines.push(("reward", format!("r {r:.2}")));
    }
    lines
}

fn render_tree(out: &mut String, t: usize, tree: &Tree) {
    let lay = layout(tree);
    let leaves = tree.leaves().count();
    let width = (2.0 * MARGIN + lay.slots.max(1) as f64 * SLOT_W).max(240.0);
    let height = py(lay.max_depth) + RADIUS + LABEL_ROOM + MARGIN / 2.0;
    let _ = write!(
        out,
        "<section class=\"tree\" id=\"tree-{t}\">\n<h2><span class=\"uid\">{}</span> · tree {} \
         <span class=\"meta\">· {} nodes · {} leaves · mean reward {}</span></h2>\n\
         <div class=\"row\"><div class=\"canvas\">\n",
        escape_html(&tree.prompt_uid),
        tree.tree_id,
        tree.nodes.len(),
        leaves,
        fmt_opt(mean_reward(tree)),
    );
    if tree.nodes.is_empty() {
        out.push_str("<p class=\"empty\">This tree has no nodes.</p>\n");
    }
    let _ = writeln!(
        out,
        "<svg width=\"{width:.0}\" height=\"{height:.0}\" \
         role=\"img\" aria-label=\"tree {}\">",
        tree.tree_id
    );
    let labels: Vec<Vec<(&'static str, String)>> = tree.nodes.iter().map(label_lines).collect();
    out.push_str("<g class=\"edges\">\n");
    for &(p, c) in &lay.edges {
        // From under the parent's labels (so no line crosses them) to the child's top.
        let below = RADIUS + labels[p].len() as f64 * LINE_H + 4.0;
        let (x1, y1) = (px(lay.x[p]), py(lay.depth[p]) + below);
        let (x2, y2) = (px(lay.x[c]), py(lay.depth[c]) - RADIUS);
        let ym = (y1 + y2) / 2.0;
        let _ = writeln!(
            out,
            "<path d=\"M{x1:.1} {y1:.1} C{x1:.1} {ym:.1} {x2:.1} {ym:.1} {x2:.1} {y2:.1}\"/>"
        );
    }
    out.push_str("</g>\n");
    for (i, node) in tree.nodes.iter().enumerate() {
        let is_leaf = !lay.has_children[i];
        let (cx, cy) = (px(lay.x[i]), py(lay.depth[i]));
        let fill = fill(node, is_leaf);
        // Dark fills get white digits.
        let dark = node.reward.is_some_and(f64::is_finite) || node.parent.is_none() || is_leaf;
        let _ = write!(
            out,
            "<g class=\"node\" data-node-id=\"{}\" data-tree=\"{t}\" data-index=\"{i}\" \
             data-kind=\"{}\" data-leaf=\"{}\" tabindex=\"0\">\
             <title>{}</title>\
             <circle cx=\"{cx:.1}\" cy=\"{cy:.1}\" r=\"{RADIUS}\" fill=\"{fill}\"/>\
             <text class=\"id{}\" x=\"{cx:.1}\" y=\"{:.1}\">{}</text>",
            node.id,
            kind_label(node),
            is_leaf,
            escape_html(&tooltip(node)),
            if dark { " dark" } else { "" },
            cy + 4.0,
            node.id,
        );
        for (k, (class, text)) in labels[i].iter().enumerate() {
            let _ = write!(
                out,
                "<text class=\"{class}\" x=\"{cx:.1}\" y=\"{:.1}\">{}</text>",
                cy + RADIUS + (k + 1) as f64 * LINE_H,
                escape_html(text)
            );
        }
        out.push_str("</g>\n");
    }
    out.push_str("</svg>\n</div>\n");
    let _ = writeln!(
        out,
        "<aside class=\"details\" data-tree=\"{t}\"><p class=\"hint\">Click a node to see its \
         step: the model's text, action, observation, reward, value, advantage.</p></aside>\n\
         </div>\n</section>"
    );
}

const STYLE: &str = r#"
:root { color-scheme: light; }
* { box-sizing: border-box; }
body { margin: 0; font: 14px/1.4 system-ui, -apple-system, "Segoe UI", "DejaVu Sans", "Liberation Sans", Arial, sans-serif; color: #1c2327; background: #f6f7f9; }
header { padding: 14px 22px 10px; background: #fff; border-bottom: 1px solid #dfe3e7; position: sticky; top: 0; z-index: 2; }
h1 { font-size: 19px; margin: 0 0 4px; }
.summary { margin: 0 0 6px; color: #4a555c; }
.legend { display: flex; gap: 18px; align-items: center; flex-wrap: wrap; font-size: 12px; color: #4a555c; }
.legend .scale { display: inline-block; width: 120px; height: 10px; border-radius: 5px; vertical-align: middle; margin: 0 4px; background: linear-gradient(to right, hsl(0,68%,44%), hsl(60,68%,44%), hsl(120,68%,44%)); }
.legend .dot { display: inline-block; width: 11px; height: 11px; border-radius: 50%; vertical-align: middle; margin-right: 4px; border: 1px solid #607d8b; }
main { padding: 8px 22px 40px; }
section.tree { scroll-margin-top: 110px; background: #fff; border: 1px solid #dfe3e7; border-radius: 8px; margin: 14px 0; padding: 10px 14px 12px; }
h2 { font-size: 15px; margin: 0 0 6px; font-weight: 600; }
h2 .uid { font-family: ui-monospace, "DejaVu Sans Mono", "Liberation Mono", monospace; }
h2 .meta { font-weight: 400; color: #5b676e; }
.row { display: flex; gap: 14px; align-items: flex-start; }
.canvas { flex: 1 1 auto; min-width: 0; overflow-x: auto; overflow-y: hidden; border: 1px solid #eef0f2; border-radius: 6px; background: #fcfcfd; }
.canvas svg { display: block; margin: 0 auto; }
.details { flex: 0 0 360px; max-height: 520px; overflow: auto; border: 1px solid #e3e7ea; border-radius: 6px; padding: 8px 10px; font-size: 13px; background: #fafbfc; }
.details .hint { color: #7a868d; margin: 4px 0; }
.details h3 { font-size: 14px; margin: 0 0 6px; }
.details dl { display: grid; grid-template-columns: auto 1fr; gap: 2px 10px; margin: 0 0 8px; }
.details dt { color: #5b676e; }
.details dd { margin: 0; font-variant-numeric: tabular-nums; overflow-wrap: anywhere; }
.details h4 { font-size: 12px; margin: 8px 0 2px; color: #5b676e; text-transform: uppercase; letter-spacing: .04em; }
.details pre { white-space: pre-wrap; overflow-wrap: anywhere; margin: 0; padding: 6px; background: #fff; border: 1px solid #e3e7ea; border-radius: 4px; max-height: 260px; overflow: auto; font: 12px/1.35 ui-monospace, "DejaVu Sans Mono", "Liberation Mono", monospace; }
.edges path { fill: none; stroke: #9aa6ad; stroke-width: 1.5; }
g.node { cursor: pointer; outline: none; }
g.node circle { stroke: #37474f; stroke-width: 1.2; }
g.node:hover circle, g.node:focus circle { stroke: #0d47a1; stroke-width: 2.5; }
g.node[data-selected="1"] circle { stroke: #0d47a1; stroke-width: 3.5; }
g.node text { text-anchor: middle; font-size: 10px; paint-order: stroke; stroke: #fcfcfd; stroke-width: 3px; stroke-linejoin: round; fill: #263238; }
g.node text.id { font-size: 10px; font-weight: 600; stroke: none; fill: #263238; }
g.node text.id.dark { fill: #fff; }
g.node text.adv, g.node text.reward { font-variant-numeric: tabular-nums; }
g.node text.reward { fill: #37474f; font-weight: 600; }
g.node text.adv.pos { fill: #1b5e20; }
g.node text.adv.neg { fill: #b71c1c; }
.empty { color: #7a868d; }
"#;

const SCRIPT: &str = r##"
(function () {
  "use strict";
  var data = JSON.parse(document.getElementById("forest-data").textContent);
  function num(v) { return (v === null || v === undefined) ? "—" : (typeof v === "number" ? v.toFixed(3) : String(v)); }
  function el(tag, text) { var e = document.createElement(tag); if (text !== undefined) e.textContent = text; return e; }
  function show(g) {
    var t = +g.getAttribute("data-tree"), i = +g.getAttribute("data-index");
    var tree = data[t], n = tree && tree.nodes[i];
    var panel = document.querySelector('aside.details[data-tree="' + t + '"]');
    if (!n || !panel) return;
    var prev = document.querySelectorAll('g.node[data-tree="' + t + '"][data-selected="1"]');
    for (var k = 0; k < prev.length; k++) prev[k].removeAttribute("data-selected");
    g.setAttribute("data-selected", "1");
    while (panel.firstChild) panel.removeChild(panel.firstChild);
    panel.appendChild(el("h3", "node " + n.id + " · depth " + n.depth + " · " + n.kind + (n.terminal ? " · leaf" : "")));
    var dl = el("dl");
    var rows = [["parent", n.parent === null ? "—" : String(n.parent)], ["reward", num(n.reward)], ["value", num(n.value)],
                ["advantage", num(n.advantage)], ["tokens", String(n.tokens)], ["observation tokens", String(n.obs_tokens)],
                ["mean logprob", num(n.mean_logprob)]];
    rows.forEach(function (r) { dl.appendChild(el("dt", r[0])); dl.appendChild(el("dd", r[1])); });
    panel.appendChild(dl);
    if (n.action !== null) { panel.appendChild(el("h4", "action")); panel.appendChild(el("pre", n.action)); }
    panel.appendChild(el("h4", "step text"));
    panel.appendChild(el("pre", n.text === "" ? "(none)" : n.text));
    if (n.observation !== null) { panel.appendChild(el("h4", "observation")); panel.appendChild(el("pre", n.observation)); }
  }
  var nodes = document.querySelectorAll("g.node");
  for (var k = 0; k < nodes.length; k++) {
    nodes[k].addEventListener("click", function (ev) {
      var g = ev.currentTarget;
      show(g);
      // A shareable link to this node: tree.html#t<tree>-n<node id>.
      if (history.replaceState) history.replaceState(null, "", "#t" + g.getAttribute("data-tree") + "-n" + g.getAttribute("data-node-id"));
    });
    nodes[k].addEventListener("keydown", function (ev) { if (ev.key === "Enter" || ev.key === " ") { ev.preventDefault(); show(ev.currentTarget); } });
  }
  // A tree wider than its box opens scrolled to its root (centred over the whole tree).
  var canvases = document.querySelectorAll(".canvas");
  for (var k = 0; k < canvases.length; k++) {
    var cv = canvases[k], root = cv.querySelector("g.node circle");
    if (root && cv.scrollWidth > cv.clientWidth) cv.scrollLeft = root.cx.baseVal.value - cv.clientWidth / 2;
  }
  var m = /^#t(\d+)-n(\d+)$/.exec(location.hash);
  if (m) {
    var g = document.querySelector('g.node[data-tree="' + m[1] + '"][data-node-id="' + m[2] + '"]');
    if (g) { show(g); var sec = document.getElementById("tree-" + m[1]); if (sec) sec.scrollIntoView(); }
  }
  document.body.setAttribute("data-nodes", String(nodes.length));
  document.body.setAttribute("data-ready", "1");
})();
"##;

/// Draws `trees` as one self-contained HTML page (no network, no external resources).
/// Each node is an SVG `<g class="node" data-node-id=… data-tree=…>` where `data-tree`
/// is the tree's position in `trees` (tree ids repeat across prompts).
pub fn render_forest_html(trees: &[Tree]) -> String {
    let nodes: usize = trees.iter().map(|t| t.nodes.len()).sum();
    let leaves: usize = trees.iter().map(|t| t.leaves().count()).sum();
    let prompts = {
        let mut seen: Vec<&str> = trees.iter().map(|t| t.prompt_uid.as_str()).collect();
        seen.sort_unstable();
        seen.dedup();
        seen.len()
    };
    let rewards: Vec<f64> = trees
        .iter()
        .flat_map(|t| t.leaves().filter_map(|n| n.reward))
        .collect();
    let mean = if rewards.is_empty() {
        None
    } else {
        Some(rewards.iter().sum::<f64>() / rewards.len() as f64)
    };

    let mut out = String::with_capacity(4096 + nodes * 900);
    let _ = write!(
        out,
        "<!DOCTYPE html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n\
         <meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">\n\
         <title>treegrpo forest · {} trees</title>\n<style>{STYLE}</style>\n</head>\n\
         <body data-ready=\"0\">\n<header>\n<h1>treegrpo forest</h1>\n\
         <p class=\"summary\">{prompts} prompts · {} trees · {nodes} nodes · {leaves} leaves · \
         mean leaf reward {}</p>\n<div class=\"legend\">\
         <span>leaf reward 0<span class=\"scale\"></span>1</span>\
         <span><span class=\"dot\" style=\"background:#9e9e9e\"></span>leaf without reward</span>\
         <span><span class=\"dot\" style=\"background:#dde3e8\"></span>inner step</span>\
         <span><span class=\"dot\" style=\"background:#455a64\"></span>prompt (root)</span>\
         <span>labels: node id · action · A = advantage · r = reward. Hover for a summary, click for the step.</span>\
         </div>\n</header>\n<main>\n",
        trees.len(),
        trees.len(),
        fmt_opt(mean),
    );
    if trees.is_empty() {
        out.push_str("<p class=\"empty\">No trees.</p>\n");
    }
    for (t, tree) in trees.iter().enumerate() {
        render_tree(&mut out, t, tree);
    }
    let data: Vec<TreeData> = trees
        .iter()
        .map(|t| TreeData {
            prompt_uid: &t.prompt_uid,
            tree_id: t.tree_id,
            nodes: t.nodes.iter().map(node_data).collect(),
        })
        .collect();
    let _ = write!(
        out,
        "</main>\n<script type=\"application/json\" id=\"forest-data\">{}</script>\n\
         <script>{SCRIPT}</script>\n</body>\n</html>\n",
        script_json(&data)
    );
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn node(id: usize, parent: usize, depth: usize) -> Node {
        Node {
            id: NodeId::new(id),
            parent: Some(NodeId::new(parent)),
            depth,
            ..Node::root()
        }
    }

    #[test]
    fn inner_nodes_sit_over_their_children() {
        let mut t = Tree::new("p".into(), 0);
        t.nodes.push(node(1, 0, 1));
        t.nodes.push(node(2, 1, 2));
        t.nodes.push(node(3, 1, 2));
        t.nodes.push(node(4, 0, 1));
        let l = layout(&t);
        assert_eq!(l.slots, 3);
        assert_eq!(l.x[2], 0.0);
        assert_eq!(l.x[3], 1.0);
        assert_eq!(l.x[1], 0.5);
        assert_eq!(l.x[4], 2.0);
        assert_eq!(l.x[0], 1.25);
        assert_eq!(l.max_depth, 2);
    }

    #[test]
    fn cycles_and_dangling_parents_still_place_every_node() {
        let mut t = Tree::new("p".into(), 0);
        t.nodes.push(node(1, 2, 1));
        t.nodes.push(node(2, 1, 1));
        t.nodes.push(node(3, 99, 1));
        let l = layout(&t);
        assert_eq!(l.x.len(), 4);
        assert!(l.slots >= 3);
        assert_eq!(l.edges.len(), 1);
    }
}

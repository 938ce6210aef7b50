//! `treegrpo view`: the forest page (node count, escaping, self-containment), the
//! forest reader's errors, the CLI on bad input, and the page in a real headless
//! Chromium (the script runs and every node is in the rendered DOM).

mod common;

use common::treegrpo;

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use treegrpo::env::{Action, InvalidReason};
use treegrpo::rollout::{read_forest, Node, NodeId, RolloutError, Tree};
use treegrpo::view::render_forest_html;

const NASTY: &str = "<script>alert(\"x&y\")</script>'";
const NASTY_ESCAPED: &str = "&lt;script&gt;alert(&quot;x&amp;y&quot;)&lt;/script&gt;&#39;";

fn step(id: usize, parent: usize, depth: usize, text: &str, action: Action) -> Node {
    Node {
        id: NodeId::new(id),
        parent: Some(NodeId::new(parent)),
        depth,
        tokens: vec![1, 2, 3],
        logprobs: vec![-0.5, -1.0, -1.5],
        obs_tokens: vec![4, 5],
        text: text.to_string(),
        action: Some(action),
        observation: Some(format!("<information>doc for {id} & more</information>")),
        ..Node::root()
    }
}

fn leaf(mut n: Node, reward: Option<f64>, advantage: f64) -> Node {
    n.terminal = true;
    n.reward = reward;
    n.value = reward;
    n.advantage = Some(advantage);
    n.obs_tokens.clear();
    n.observation = None;
    n
}

/// Two trees, 8 nodes: root → search(1) → {answer leaf 2 (r=1), answer leaf 3 (r=0,
/// nasty text)}, root → search(4) → invalid leaf 5 (no reward); root → answer leaf 1.
fn sample_trees() -> Vec<Tree> {
    let mut a = Tree::new("q-0001".into(), 0);
    let mut s1 = step(
        1,
        0,
        1,
        "<think>look it up</think><search>capital of France</search>",
        Action::Search("capital of France".into()),
    );
    s1.value = Some(0.5);
    s1.advantage = Some(0.1);
    a.nodes.push(s1);
    a.nodes.push(leaf(
        step(
            2,
            1,
            2,
            "<answer>Paris</answer>",
            Action::Answer("Paris".into()),
        ),
        Some(1.0),
        0.5,
    ));
    a.nodes.push(leaf(
        step(3, 1, 2, NASTY, Action::Answer(NASTY.into())),
        Some(0.0),
        -0.5,
    ));
    a.nodes.push(step(
        4,
        0,
        1,
        "<search>x</search>",
        Action::Search("x".into()),
    ));
    a.nodes.push(leaf(
        step(
            5,
            4,
            2,
            "I give up",
            Action::Invalid(InvalidReason::NoAction),
        ),
        None,
        0.0,
    ));
    let mut b = Tree::new("q-0001".into(), 1);
    b.nodes.push(leaf(
        step(
            1,
            0,
            1,
            "<answer>Lyon</answer>",
            Action::Answer("Lyon".into()),
        ),
        Some(0.2),
        -0.3,
    ));
    vec![a, b]
}

fn node_count(trees: &[Tree]) -> usize {
    trees.iter().map(|t| t.nodes.len()).sum()
}

#[test]
fn one_node_element_per_node() {
    let trees = sample_trees();
    let html = render_forest_html(&trees);
    assert_eq!(html.matches("class=\"node\"").count(), node_count(&trees));
    assert_eq!(node_count(&trees), 8);
    for (t, tree) in trees.iter().enumerate() {
        for n in &tree.nodes {
            let needle = format!("data-node-id=\"{}\" data-tree=\"{t}\"", n.id);
            assert_eq!(html.matches(&needle).count(), 1, "{needle}");
        }
    }
    // Tree headings: uid, id, leaf count, mean reward.
    assert!(html.contains("q-0001</span> · tree 0"));
    assert!(html.contains("6 nodes · 3 leaves · mean reward 0.500"));
    assert!(html.contains("2 nodes · 1 leaves · mean reward 0.200"));
    // Leaves coloured by reward (red 0, green 1), the rewardless leaf grey.
    assert!(html.contains("fill=\"hsl(120,68%,44%)\""));
    assert!(html.contains("fill=\"hsl(0,68%,44%)\""));
    assert!(html.contains("fill=\"#9e9e9e\""));
    // Advantages and action kinds are labelled.
    assert!(html.contains(">A +0.50<"));
    assert!(html.contains(">A -0.50<"));
    assert!(html.contains(">search<"));
    assert!(html.contains(">invalid<"));
}

#[test]
fn data_strings_are_escaped() {
    let trees = sample_trees();
    let html = render_forest_html(&trees);
    assert!(!html.contains("<script>alert"), "raw step text in the page");
    assert!(
        !html.contains("alert(\"x&y\")"),
        "raw quotes/ampersand in the page"
    );
    // The tooltip (SVG <title>) carries the escaped text.
    assert!(html.contains(NASTY_ESCAPED), "escaped text missing");
    assert!(html.contains("&lt;information&gt;doc for 1 &amp; more&lt;/information&gt;"));
    // Only the page's own two scripts (data and code) open or close.
    assert_eq!(html.matches("<script").count(), 2);
    assert_eq!(html.matches("</script").count(), 2);
    // The embedded JSON spells <, >, & as \u escapes and still parses to the same text.
    let start = html.find("id=\"forest-data\">").unwrap() + "id=\"forest-data\">".len();
    let end = start + html[start..].find("</script>").unwrap();
    let data: serde_json::Value = serde_json::from_str(&html[start..end]).unwrap();
    assert_eq!(data[0]["nodes"][3]["text"], NASTY);
    assert_eq!(data[0]["nodes"][3]["action"], NASTY);
    assert_eq!(data[0]["nodes"][5]["action"], "invalid: NoAction");
    // A nasty prompt uid is escaped in headings too.
    let mut trees = trees;
    trees[1].prompt_uid = NASTY.into();
    let html = render_forest_html(&trees);
    assert!(!html.contains("<script>alert"));
    assert!(html.contains(NASTY_ESCAPED));
}

#[test]
fn page_is_self_contained() {
    let html = render_forest_html(&sample_trees());
    assert!(!html.contains("http://"), "network reference");
    assert!(!html.contains("https://"), "network reference");
    assert!(!html.contains("src="));
    assert!(!html.contains("<link"));
    assert!(!html.contains("@import"));
    assert!(html.starts_with("<!DOCTYPE html>"));
    assert!(html.trim_end().ends_with("</html>"));
}

#[test]
fn wide_trees_grow_instead_of_shrinking() {
    let mut t = Tree::new("wide".into(), 0);
    for i in 1..=100 {
        t.nodes.push(leaf(
            step(i, 0, 1, "x", Action::Answer("x".into())),
            Some(i as f64 / 100.0),
            0.0,
        ));
    }
    let html = render_forest_html(std::slice::from_ref(&t));
    assert_eq!(html.matches("class=\"node\"").count(), 101);
    let w: f64 = html
        .split("<svg width=\"")
        .nth(1)
        .and_then(|s| s.split('"').next())
        .unwrap()
        .parse()
        .unwrap();
    assert!(w >= 100.0 * 50.0, "100 leaves squeezed into {w}px");
    assert!(
        !html.contains("viewBox"),
        "a viewBox would scale the tree down"
    );
    assert!(html.contains("overflow-x: auto"));
}

#[test]
fn broken_links_still_draw_every_node() {
    let mut t = Tree::new("odd".into(), 0);
    t.nodes.push(step(1, 2, 1, "a", Action::Search("a".into())));
    t.nodes.push(step(2, 1, 1, "b", Action::Search("b".into())));
    t.nodes
        .push(step(3, 42, 1, "c", Action::Search("c".into())));
    t.nodes
        .push(step(3, 3, 1, "dup id", Action::Search("d".into())));
    let empty = Tree {
        prompt_uid: "empty".into(),
        tree_id: 9,
        nodes: vec![],
    };
    let trees = vec![t, empty];
    let html = render_forest_html(&trees);
    assert_eq!(html.matches("class=\"node\"").count(), 5);
    assert!(!html.contains("NaN"));
    assert_eq!(render_forest_html(&[]).matches("class=\"node\"").count(), 0);
}

fn write_forest(dir: &Path, trees: &[Tree], extra: &str) -> PathBuf {
    let mut text = String::new();
    for t in trees {
        text.push_str(&serde_json::to_string(t).unwrap());
        text.push('\n');
    }
    text.push_str(extra);
    let path = dir.join("forest.jsonl");
    std::fs::write(&path, text).unwrap();
    path
}

#[test]
fn read_forest_round_trips_and_names_bad_lines() {
    let dir = tempfile::tempdir().unwrap();
    let trees = sample_trees();
    let path = write_forest(dir.path(), &trees, "\n");
    assert_eq!(read_forest(&path).unwrap(), trees);

    let path = write_forest(
        dir.path(),
        &trees,
        "{\"prompt_uid\": \"x\", \"tree_id\": 0}\n",
    );
    let err = read_forest(&path).unwrap_err();
    assert!(
        matches!(err, RolloutError::ForestLine { line: 3, .. }),
        "{err:?}"
    );
    let msg = err.to_string();
    assert!(msg.contains("forest.jsonl"), "{msg}");
    assert!(msg.contains("line 3"), "{msg}");
    // serde's reason is the source, printed after the message by a chain printer.
    let cause = std::error::Error::source(&err)
        .expect("the parse error")
        .to_string();
    assert!(cause.contains("nodes"), "{cause}");
    assert!(!cause.contains("line 1"), "{cause}");

    let err = read_forest(&dir.path().join("missing.jsonl")).unwrap_err();
    assert!(err.to_string().contains("missing.jsonl"), "{err}");
}

#[test]
fn cli_writes_the_page_and_counts() {
    let dir = tempfile::tempdir().unwrap();
    let forest = write_forest(dir.path(), &sample_trees(), "");
    let out_path = dir.path().join("tree.html");
    let out = treegrpo()
        .arg("view")
        .arg(&forest)
        .arg("--out")
        .arg(&out_path)
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "stderr: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(stdout.contains("tree.html"), "{stdout}");
    assert!(stdout.contains("2 trees, 8 nodes"), "{stdout}");
    let html = std::fs::read_to_string(&out_path).unwrap();
    assert_eq!(html.matches("class=\"node\"").count(), 8);
}

#[test]
fn cli_bad_forest_exits_1_naming_file_and_line() {
    let dir = tempfile::tempdir().unwrap();
    let forest = write_forest(dir.path(), &sample_trees()[..1], "{\"prompt_uid\": 1,\n");
    let out_path = dir.path().join("tree.html");
    let out = treegrpo()
        .arg("view")
        .arg(&forest)
        .arg("--out")
        .arg(&out_path)
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "stderr: {stderr}");
    assert!(stderr.contains("forest.jsonl"), "{stderr}");
    assert!(stderr.contains("line 2"), "{stderr}");
    assert!(!stderr.contains("panicked"), "{stderr}");
    assert!(!out_path.exists(), "a page was written for a bad forest");

    // Empty file, missing file, non-UTF-8 bytes: errors, never panics.
    let empty = dir.path().join("empty.jsonl");
    std::fs::write(&empty, "\n").unwrap();
    let binary = dir.path().join("binary.jsonl");
    std::fs::write(&binary, b"\xff\xfe\x00garbage\n").unwrap();
    for (path, needle) in [
        (empty, "empty.jsonl"),
        (dir.path().join("nope.jsonl"), "nope.jsonl"),
        (binary, "line 1"),
    ] {
        let out = treegrpo()
            .arg("view")
            .arg(&path)
            .arg("--out")
            .arg(&out_path)
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(1), "{path:?}: {stderr}");
        assert!(stderr.contains(needle), "{path:?}: {stderr}");
        assert!(!stderr.contains("panicked"), "{stderr}");
    }
}

const CHROMIUM: &str = "/usr/bin/chromium";
const BROWSER_TIMEOUT: Duration = Duration::from_secs(60);

/// Runs headless Chromium on `page` with `extra` flags; its stdout, or a panic naming
/// what went wrong. Killed after [`BROWSER_TIMEOUT`], so the test never hangs.
fn chromium(page: &Path, profile: &Path, extra: &[&str]) -> String {
    let out_file = profile.with_extension("stdout");
    let err_file = profile.with_extension("stderr");
    let mut child = Command::new(CHROMIUM)
        .args([
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--disable-quic",
            "--no-first-run",
            "--disable-background-networking",
            "--disable-component-update",
            "--disable-sync",
        ])
        .arg(format!("--user-data-dir={}", profile.display()))
        .args(extra)
        .arg(format!("file://{}", page.display()))
        .stdin(Stdio::null())
        .stdout(std::fs::File::create(&out_file).unwrap())
        .stderr(std::fs::File::create(&err_file).unwrap())
        .spawn()
        .expect("starting chromium");
    let start = Instant::now();
    let status = loop {
        if let Some(s) = child.try_wait().unwrap() {
            break s;
        }
        if start.elapsed() > BROWSER_TIMEOUT {
            let _ = child.kill();
            let _ = child.wait();
            panic!(
                "chromium did not finish in {BROWSER_TIMEOUT:?}; stderr:\n{}",
                std::fs::read_to_string(&err_file).unwrap_or_default()
            );
        }
        std::thread::sleep(Duration::from_millis(100));
    };
    let stdout = std::fs::read_to_string(&out_file).unwrap_or_default();
    assert!(
        status.success(),
        "chromium failed ({status}); stderr:\n{}",
        std::fs::read_to_string(&err_file).unwrap_or_default()
    );
    stdout
}

#[test]
fn chromium_renders_every_node_and_runs_the_script() {
    if !Path::new(CHROMIUM).exists() {
        if std::env::var("TREEGRPO_REQUIRE_BROWSER").as_deref() == Ok("1") {
            panic!("{CHROMIUM} is missing and TREEGRPO_REQUIRE_BROWSER=1");
        }
        eprintln!(
            "\n!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!\n\
             !!! SKIPPED: {CHROMIUM} not found; the forest page was NOT checked in a\n\
             !!! browser. Install Debian's `chromium` (or set TREEGRPO_REQUIRE_BROWSER=1\n\
             !!! to make this a failure).\n\
             !!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!\n"
        );
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let trees = sample_trees();
    let page = dir.path().join("tree.html");
    std::fs::write(&page, render_forest_html(&trees)).unwrap();
    let dom = chromium(&page, &dir.path().join("profile"), &["--dump-dom"]);
    let n = node_count(&trees);
    assert_eq!(
        dom.matches("class=\"node\"").count(),
        n,
        "rendered DOM:\n{dom}"
    );
    assert!(
        dom.contains("data-ready=\"1\""),
        "the script did not run:\n{dom}"
    );
    assert!(
        dom.contains(&format!("data-nodes=\"{n}\"")),
        "the script did not see every node:\n{dom}"
    );
    // The parsed page kept the nasty text as text: no injected script element ran.
    assert_eq!(dom.matches("<script").count(), 2, "{dom}");

    // A link to a node (#t<tree>-n<id>) opens it in the panel: the script fills the panel
    // with the node's text as text (serialised escaped), and no element is injected.
    let page_link = PathBuf::from(format!("{}#t0-n3", page.display()));
    let dom = chromium(&page_link, &dir.path().join("profile2"), &["--dump-dom"]);
    // (The script sets the attribute last; the CSS and the script also mention it.)
    assert_eq!(
        dom.matches("tabindex=\"0\" data-selected=\"1\">").count(),
        1,
        "{dom}"
    );
    assert!(dom.contains("data-index=\"3\" data-kind=\"answer\" data-leaf=\"true\" tabindex=\"0\" data-selected=\"1\">"));
    assert!(dom.contains("node 3 · depth 2 · answer · leaf"), "{dom}");
    assert!(
        dom.contains("<pre>&lt;script&gt;alert(\"x&amp;y\")&lt;/script&gt;'</pre>"),
        "panel text missing or unescaped:\n{dom}"
    );
    assert_eq!(dom.matches("<script").count(), 2, "{dom}");
}

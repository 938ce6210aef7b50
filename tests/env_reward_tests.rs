//! Reward tests: SQuAD normalisation, EM, F1 (hand-computed), the five
//! reward levels on real episodes, the F1 variant, and calc's numeric match.

use std::sync::Arc;

use async_trait::async_trait;
use treegrpo::env::normalize::{
    exact_match, f1_score, max_f1, normalize_answer, numeric_match, parse_number,
};
use treegrpo::env::reward::{reward_from, RewardLevels};
use treegrpo::env::{
    CalcEnv, EnvConfig, Environment, QaSample, RewardConfig, RewardMetric, SearchQaEnv, Tool,
    ToolError,
};

fn close(a: f64, b: f64) -> bool {
    (a - b).abs() < 1e-9
}

#[test]
fn squad_normalisation() {
    let cases = [
        ("The Eiffel Tower!", "eiffel tower"),
        ("  A   cat,  an apple and THE dog. ", "cat apple and dog"),
        ("anthem theory", "anthem theory"),
        ("U.S.A.", "usa"),
        ("the–end", "–end"),
        ("Zürich", "zürich"),
        ("", ""),
        ("the a an", ""),
    ];
    for (input, want) in cases {
        assert_eq!(normalize_answer(input), want, "input {input:?}");
    }
}

#[test]
fn exact_match_any_golden() {
    let golden = vec!["Paris".to_owned(), "City of Light".to_owned()];
    assert!(exact_match("paris.", &golden));
    assert!(exact_match("the city of light", &golden));
    assert!(!exact_match("Paris, France", &golden));
    assert!(!exact_match("", &golden));
}

#[test]
fn f1_hand_computed() {
    // pred [cat, sat], gold [cat, sat, down]: P = 1, R = 2/3, F1 = 0.8.
    assert!(close(f1_score("the cat sat", "cat sat down"), 0.8));
    // Multiset: pred [red, red, blue], gold [red, blue, green]: 2 common, P = R = 2/3.
    assert!(close(f1_score("red red blue", "red blue green"), 2.0 / 3.0));
    assert!(close(f1_score("Paris", "London"), 0.0));
    // Both normalise to nothing: 1; one side empty: 0.
    assert!(close(f1_score("a", "the"), 1.0));
    assert!(close(f1_score("", "x"), 0.0));
    // Best over golden answers: 0.8 against "new york city", 0 against "nyc".
    let golden = vec!["New York City".to_owned(), "NYC".to_owned()];
    assert!(close(max_f1("New York", &golden), 0.8));
}

#[test]
fn reward_levels_table() {
    let l = RewardLevels::default();
    assert!(close(reward_from(Some(1.0), true, &l), 1.0));
    assert!(close(reward_from(Some(1.0), false, &l), 0.8));
    assert!(close(reward_from(Some(0.0), true, &l), 0.2));
    assert!(close(reward_from(Some(0.0), false, &l), 0.1));
    assert!(close(reward_from(None, true, &l), 0.0));
    assert!(close(reward_from(None, false, &l), 0.0));
    // F1 interpolation: 0.2 + 0.5 * 0.8 and 0.1 + 0.5 * 0.7.
    assert!(close(reward_from(Some(0.5), true, &l), 0.6));
    assert!(close(reward_from(Some(0.5), false, &l), 0.45));
}

#[test]
fn numbers() {
    assert_eq!(parse_number(" $1,250. "), Some(1250.0));
    assert_eq!(parse_number("-3.5"), Some(-3.5));
    assert_eq!(parse_number("42 apples"), None);
    assert_eq!(parse_number("1e5"), None);
    let g = vec!["42".to_owned()];
    assert!(numeric_match("42.0", &g));
    assert!(numeric_match("42", &g));
    assert!(!numeric_match("41.999", &g));
    assert!(!numeric_match("forty-two", &g));
}

/// A search tool that always returns the same passage.
struct FixedSearch;

#[async_trait]
impl Tool for FixedSearch {
    fn name(&self) -> &str {
        "search"
    }
    async fn call(&self, _input: &str) -> Result<String, ToolError> {
        Ok("Doc 1(Title: Paris) Paris is the capital of France.".into())
    }
}

fn env(metric: RewardMetric, max_turns: usize) -> SearchQaEnv {
    let cfg = EnvConfig {
        max_turns,
        reward: RewardConfig {
            metric,
            ..RewardConfig::default()
        },
        ..EnvConfig::default()
    };
    SearchQaEnv::new(Arc::new(FixedSearch), cfg).expect("valid config")
}

async fn play(env: &dyn Environment, golden: &str, steps: &[&str]) -> treegrpo::env::Score {
    let sample = QaSample::new(
        "q1",
        "What is the capital of France?",
        vec![golden.to_owned()],
    );
    let mut ep = env.start(&sample).unwrap();
    for s in steps {
        env.step(&mut ep, s).await.expect("episode still running");
    }
    env.score(&ep)
}

#[tokio::test]
async fn five_reward_levels_on_episodes() {
    let e = env(RewardMetric::ExactMatch, 3);
    let search = "<think>I need the capital.</think>\n<search>capital of France</search>";
    let cases: Vec<(&str, Vec<&str>, f64)> = vec![
        (
            "correct, well formed",
            vec![search, "<think>It is Paris.</think><answer>Paris</answer>"],
            1.0,
        ),
        (
            "correct, malformed (no think)",
            vec![
                "<search>capital of France</search>",
                "<think>b</think><answer>paris</answer>",
            ],
            0.8,
        ),
        (
            "wrong, well formed",
            vec!["<think>Guess.</think><answer>London</answer>"],
            0.2,
        ),
        (
            "wrong, malformed (stray text)",
            vec!["<think>b</think>I guess <answer>London</answer>"],
            0.1,
        ),
        (
            "correct after an invalid step is malformed",
            vec!["no tags here", "<think>b</think><answer>Paris</answer>"],
            0.8,
        ),
        (
            "no answer",
            vec![
                "<think>a</think>no action",
                "<think>b</think>still none",
                "<think>c</think>x",
                "<think>d</think><search>q</search>",
            ],
            0.0,
        ),
    ];
    for (name, steps, want) in cases {
        let score = play(&e, "Paris", &steps).await;
        assert!(
            close(score.reward, want),
            "{name}: got {} ({:?})",
            score.reward,
            score.details
        );
    }
    // An unfinished episode has no answer.
    let score = play(&e, "Paris", &[search]).await;
    assert!(close(score.reward, 0.0));
    assert!(!score.details.well_formed);
}

#[tokio::test]
async fn score_details_count_steps() {
    let e = env(RewardMetric::ExactMatch, 3);
    let steps = [
        "<think>a</think><search>x</search>",
        "oops",
        "<think>c</think><answer>Paris</answer>",
    ];
    let d = play(&e, "Paris", &steps).await.details;
    assert_eq!(
        (d.steps, d.tool_calls, d.tool_errors, d.invalid_actions),
        (3, 1, 0, 1)
    );
    assert_eq!(d.answer.as_deref(), Some("Paris"));
    assert!(d.exact_match && !d.well_formed);
    assert_eq!(
        d.format_issue.as_deref(),
        Some("step 2: InvalidAction(NoAction)")
    );
}

#[tokio::test]
async fn f1_reward_variant() {
    let e = env(RewardMetric::F1, 3);
    // F1("New York", "New York City") = 0.8 (hand-computed above).
    let wf = play(
        &e,
        "New York City",
        &["<think>a</think><answer>New York</answer>"],
    )
    .await;
    assert!(close(wf.reward, 0.2 + 0.8 * 0.8), "{}", wf.reward);
    assert!(close(wf.details.f1, 0.8) && !wf.details.exact_match);
    let mf = play(&e, "New York City", &["<answer>New York</answer>"]).await;
    assert!(close(mf.reward, 0.1 + 0.7 * 0.8), "{}", mf.reward);
    // Exact answers still get the EM levels.
    let exact = play(
        &e,
        "New York City",
        &["<think>a</think><answer>new york city</answer>"],
    )
    .await;
    assert!(close(exact.reward, 1.0));
}

#[tokio::test]
async fn calc_rewards_numeric_match() {
    let e = CalcEnv::new(EnvConfig::default()).expect("valid config");
    let cases = [
        ("<think>a</think><answer>42</answer>", 1.0),
        ("<think>a</think><answer>42.0</answer>", 1.0),
        ("<answer>42</answer>", 0.8),
        ("<think>a</think><answer>41</answer>", 0.2),
        ("<think>a</think><answer>42 apples</answer>", 0.2),
        ("<answer>7</answer>", 0.1),
    ];
    for (step, want) in cases {
        let score = play(&e, "42", &[step]).await;
        assert!(close(score.reward, want), "{step}: {}", score.reward);
    }
}

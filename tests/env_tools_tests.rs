//! Tools and episode logic: hanging, failing and panicking tools end as
//! observations; invalid actions use turns; the turn limit forces an answer
//! turn; episodes fork; configuration is validated.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use async_trait::async_trait;
use treegrpo::env::protocol::{invalid_action_feedback, turn_limit_notice};
use treegrpo::env::{
    Action, ActionKind, CalcEnv, EnvConfig, EnvError, Environment, InvalidReason, QaSample,
    SearchQaEnv, SegmentKind, Tags, Tool, ToolError, ToolStatus,
};

/// Search-R1's feedback text, verbatim.
const REFERENCE_FEEDBACK: &str = "\nMy previous action is invalid. If I want to search, I should put the query between <search> and </search>. If I want to give the final answer, I should put the answer between <answer> and </answer>. Let me try again.\n";

/// A test tool: behaviour chosen per call number.
struct Scripted {
    calls: AtomicUsize,
    script: fn(usize) -> Behaviour,
}

#[derive(Clone, Copy)]
enum Behaviour {
    Answer,
    Hang,
    Fail,
    Panic,
    Flood,
}

#[async_trait]
impl Tool for Scripted {
    fn name(&self) -> &str {
        "search"
    }
    async fn call(&self, input: &str) -> Result<String, ToolError> {
        match (self.script)(self.calls.fetch_add(1, Ordering::SeqCst)) {
            Behaviour::Answer => Ok(format!("Doc 1(Title: Result) about {input}")),
            Behaviour::Hang => {
                tokio::time::sleep(Duration::from_secs(3600)).await;
                Ok("too late".into())
            }
            Behaviour::Fail => Err(ToolError::Failed("backend down".into())),
            Behaviour::Panic => panic!("tool bug"),
            Behaviour::Flood => Ok("x".repeat(100_000)),
        }
    }
}

fn search_env(script: fn(usize) -> Behaviour, cfg: EnvConfig) -> SearchQaEnv {
    let tool = Arc::new(Scripted {
        calls: AtomicUsize::new(0),
        script,
    });
    SearchQaEnv::new(tool, cfg).expect("valid config")
}

fn fast() -> EnvConfig {
    EnvConfig {
        tool_timeout: Duration::from_millis(50),
        ..EnvConfig::default()
    }
}

fn sample() -> QaSample {
    QaSample::new(
        "s1",
        "Who founded Vellmar Instruments?",
        vec!["Ada Vellmar".into()],
    )
}

const SEARCH: &str = "<think>Look it up.</think><search>Vellmar Instruments</search>";
const ANSWER: &str = "<think>Found it.</think><answer>Ada Vellmar</answer>";

#[tokio::test]
async fn hanging_and_failing_tools_become_observations() {
    let env = search_env(
        |n| [Behaviour::Hang, Behaviour::Fail, Behaviour::Answer][n.min(2)],
        fast(),
    );
    let mut ep = env.start(&sample()).unwrap();
    let started = Instant::now();
    let o1 = env.step(&mut ep, SEARCH).await.expect("step");
    assert!(
        started.elapsed() < Duration::from_secs(5),
        "the timeout fired"
    );
    assert_eq!(
        o1.observation.as_deref(),
        Some("\n\n<information>Tool error (search): timed out after 50 ms</information>\n\n")
    );
    assert!(!o1.done);
    let o2 = env.step(&mut ep, SEARCH).await.expect("step");
    assert_eq!(
        o2.observation
            .as_deref()
            .map(|o| o.contains("Tool error (search): backend down")),
        Some(true)
    );
    assert!(!o2.done);
    let o3 = env
        .step(&mut ep, ANSWER)
        .await
        .expect("the episode goes on");
    assert!(o3.done);
    let statuses: Vec<_> = ep.steps().iter().map(|s| s.tool_status).collect();
    assert_eq!(
        statuses,
        [Some(ToolStatus::TimedOut), Some(ToolStatus::Failed), None]
    );
    let score = env.score(&ep);
    // Tool trouble is not the model's format error.
    assert_eq!(score.reward, 1.0);
    assert_eq!(score.details.tool_errors, 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn panicking_tool_is_contained() {
    // A generous timeout: printing the panic's backtrace can take longer
    // than the 50 ms the other tests use.
    let cfg = EnvConfig {
        tool_timeout: Duration::from_secs(20),
        ..EnvConfig::default()
    };
    let env = search_env(
        |n| {
            if n == 0 {
                Behaviour::Panic
            } else {
                Behaviour::Answer
            }
        },
        cfg,
    );
    let mut ep = env.start(&sample()).unwrap();
    let obs = env
        .step(&mut ep, SEARCH)
        .await
        .expect("step")
        .observation
        .expect("obs");
    assert!(
        obs.contains("Tool error (search): the tool crashed"),
        "{obs}"
    );
    let o2 = env.step(&mut ep, SEARCH).await.expect("step");
    assert!(o2
        .observation
        .expect("obs")
        .contains("Doc 1(Title: Result) about Vellmar Instruments"));
    assert_eq!(ep.steps()[0].tool_status, Some(ToolStatus::Panicked));
}

#[tokio::test]
async fn runaway_output_is_truncated() {
    let cfg = EnvConfig {
        max_observation_chars: 100,
        ..fast()
    };
    let env = search_env(|_| Behaviour::Flood, cfg);
    let mut ep = env.start(&sample()).unwrap();
    let obs = env
        .step(&mut ep, SEARCH)
        .await
        .expect("step")
        .observation
        .expect("obs");
    assert!(
        obs.len() < 200 && obs.contains("...[truncated]"),
        "{}",
        obs.len()
    );
}

#[tokio::test]
async fn invalid_actions_use_turns_and_the_limit_forces_an_answer() {
    let env = search_env(|_| Behaviour::Answer, fast());
    let mut ep = env.start(&sample()).unwrap();
    let o1 = env.step(&mut ep, "I will just talk.").await.expect("step");
    assert_eq!(o1.action, Action::Invalid(InvalidReason::NoAction));
    assert_eq!(o1.observation.as_deref(), Some(REFERENCE_FEEDBACK));
    let o2 = env
        .step(&mut ep, "<think>x</think><calc>1+1</calc>")
        .await
        .expect("step");
    assert_eq!(
        o2.action,
        Action::Invalid(InvalidReason::NotAllowed {
            kind: ActionKind::Calc
        })
    );
    assert!(!ep.in_answer_only_turn());
    // Third (last) tool turn: result plus the notice.
    let o3 = env.step(&mut ep, SEARCH).await.expect("step");
    let notice = turn_limit_notice(&Tags::default(), ActionKind::Search);
    let obs = o3.observation.expect("obs");
    assert!(
        obs.starts_with("\n\n<information>Doc 1") && obs.ends_with(&notice),
        "{obs:?}"
    );
    assert!(notice.contains("cannot search") && notice.contains("<answer>"));
    assert!(ep.in_answer_only_turn() && !o3.done);
    // Forced answer turn: a search is invalid and ends the episode.
    let o4 = env.step(&mut ep, SEARCH).await.expect("step");
    assert_eq!(
        o4.action,
        Action::Invalid(InvalidReason::ToolAfterTurnLimit {
            kind: ActionKind::Search
        })
    );
    assert!(o4.done && o4.observation.is_none());
    assert_eq!(ep.steps().len(), 4);
    assert_eq!(env.score(&ep).reward, 0.0);
    assert!(matches!(
        env.step(&mut ep, ANSWER).await,
        Err(EnvError::EpisodeFinished(_))
    ));
}

#[tokio::test]
async fn forced_turn_accepts_an_answer_and_invalid_last_turn_gets_notice() {
    let cfg = EnvConfig {
        max_turns: 1,
        ..fast()
    };
    let env = search_env(|_| Behaviour::Answer, cfg);
    let mut ep = env.start(&sample()).unwrap();
    let o1 = env.step(&mut ep, "<think>x</think>").await.expect("step");
    let notice = turn_limit_notice(&Tags::default(), ActionKind::Search);
    assert_eq!(
        o1.observation,
        Some(format!("{REFERENCE_FEEDBACK}{notice}"))
    );
    let o2 = env.step(&mut ep, ANSWER).await.expect("step");
    assert!(o2.done && ep.steps()[1].answer_only_turn);
    let score = env.score(&ep);
    assert_eq!(
        score.reward, 0.8,
        "correct, but the invalid first step is malformed"
    );

    let direct = search_env(
        |_| Behaviour::Answer,
        EnvConfig {
            max_turns: 0,
            ..fast()
        },
    );
    let mut ep = direct.start(&sample()).unwrap();
    assert!(ep.prompt()[0].content.contains("cannot search"));
    let o = direct.step(&mut ep, SEARCH).await.expect("step");
    assert!(o.done && !o.action.is_valid());
}

#[tokio::test]
async fn episodes_fork_and_segment() {
    let env = search_env(|_| Behaviour::Answer, fast());
    let mut root = env.start(&sample()).unwrap();
    env.step(&mut root, SEARCH).await.expect("step");
    let mut left = root.clone();
    let mut right = root.clone();
    env.step(&mut left, ANSWER).await.expect("step");
    env.step(&mut right, "<think>Wrong.</think><answer>Bo</answer>")
        .await
        .expect("step");
    assert_eq!((root.steps().len(), root.is_done()), (1, false));
    assert_eq!(
        (env.score(&left).reward, env.score(&right).reward),
        (1.0, 0.2)
    );
    let segs = left.segments();
    let kinds: Vec<_> = segs.iter().map(|s| s.kind).collect();
    assert_eq!(
        kinds,
        [
            SegmentKind::Model,
            SegmentKind::Observation,
            SegmentKind::Model
        ]
    );
    assert_eq!(
        left.completion_text(),
        segs.iter().map(|s| s.text).collect::<String>()
    );
    assert!(segs[1].text.starts_with("\n\n<information>"));
}

#[test]
fn config_and_custom_tags() {
    let bad = EnvConfig {
        tags: Tags {
            search: "answer".into(),
            ..Tags::default()
        },
        ..EnvConfig::default()
    };
    assert!(matches!(CalcEnv::new(bad), Err(EnvError::Config(_))));
    let zero = EnvConfig {
        tool_timeout: Duration::ZERO,
        ..EnvConfig::default()
    };
    assert!(CalcEnv::new(zero).is_err());
    let tags = Tags {
        search: "tool".into(),
        ..Tags::default()
    };
    let env = search_env(
        |_| Behaviour::Answer,
        EnvConfig {
            tags: tags.clone(),
            ..fast()
        },
    );
    assert_eq!(env.stop_strings(), ["</tool>", "</answer>"]);
    let ep = env.start(&sample()).unwrap();
    assert!(ep.prompt()[0].content.contains("<tool> query </tool>"));
    assert!(
        invalid_action_feedback(&tags, ActionKind::Search).contains("between <tool> and </tool>")
    );
    assert_eq!(
        invalid_action_feedback(&Tags::default(), ActionKind::Search),
        REFERENCE_FEEDBACK
    );
}

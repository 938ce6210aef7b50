//! Every layer's error carries its cause as its `source`, typed (a library's error, a
//! lower layer's enum), never as text copied into a `String`; and no message repeats
//! its source, so a caller printing the chain (the CLI's `{:#}`, the server's
//! `error_chain`, Python's messages) shows each cause exactly once. An I/O error of the
//! rollout, the trainer and the closed loop names its path, then its cause.

use std::error::Error;
use std::io::{Error as IoError, ErrorKind};

use treegrpo::closed_loop::LoopError;
use treegrpo::rollout::RolloutError;
use treegrpo::train::TrainError;

/// The message and its causes, `: `-joined, as a chain printer writes them.
fn chain(e: &dyn Error) -> String {
    let mut text = e.to_string();
    let mut cause = e.source();
    while let Some(c) = cause {
        text.push_str(": ");
        text.push_str(&c.to_string());
        cause = c.source();
    }
    text
}

fn missing() -> IoError {
    IoError::new(ErrorKind::NotFound, "no such file")
}

#[test]
fn io_errors_name_their_path_then_their_cause_once() {
    let want = "/runs/x/log.jsonl: no such file";
    assert_eq!(
        chain(&RolloutError::Io("/runs/x/log.jsonl".into(), missing())),
        want
    );
    assert_eq!(
        chain(&TrainError::Io("/runs/x/log.jsonl".into(), missing())),
        want
    );
    assert_eq!(
        chain(&LoopError::Io("/runs/x/log.jsonl".into(), missing())),
        want
    );
}

/// `err` carries its cause as its `source` (whose message contains `cause`), its own
/// message does not repeat it, and the chain prints it exactly once.
fn assert_cause_once(err: &dyn Error, cause: &str) {
    let source = err.source().expect("the cause is the source");
    assert!(source.to_string().contains(cause), "{source}");
    assert!(
        !err.to_string().contains(cause),
        "message repeats its cause: {err}"
    );
    let text = chain(err);
    assert_eq!(text.matches(cause).count(), 1, "{text}");
}

/// A task that panicked, as a `JoinError`.
fn panicked_task() -> tokio::task::JoinError {
    let rt = tokio::runtime::Builder::new_current_thread()
        .build()
        .unwrap();
    rt.block_on(async {
        tokio::spawn(async { panic!("boom") })
            .await
            .expect_err("the task panics")
    })
}

#[test]
fn model_errors_carry_their_library_causes() {
    use treegrpo::model::{ChatTemplate, LoadedModel, ModelError};

    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("config.json"), "{\"hidden_size\": ").unwrap();
    let err = LoadedModel::load(dir.path()).expect_err("a broken config.json");
    assert!(matches!(err, ModelError::ConfigJson { .. }), "{err:?}");
    let serde = err.source().unwrap().downcast_ref::<serde_json::Error>();
    assert!(serde.is_some_and(|e| e.is_eof()), "{err:?}");
    assert_cause_once(&err, "EOF while parsing");

    let bad = dir.path().join("tokenizer.json");
    std::fs::write(&bad, "{\"model\": 3}").unwrap();
    let err = treegrpo::model::tokenizer::hf_tokenizer_file(&bad).unwrap_err();
    assert!(matches!(err, ModelError::TokenizerFile { .. }), "{err:?}");
    let cause = err.source().unwrap().to_string();
    assert_cause_once(&err, &cause);

    let err = ChatTemplate::new("{% if %}", String::new(), String::new()).unwrap_err();
    assert!(matches!(err, ModelError::Template(_)), "{err:?}");
    let jinja = err.source().unwrap().downcast_ref::<minijinja::Error>();
    assert!(jinja.is_some(), "{err:?}");
    assert_cause_once(&err, "syntax error");

    // Wrapped causes that used to be interpolated too: printed once now.
    let err = ModelError::Candle(candle_core::Error::Msg("shape".into()));
    assert_cause_once(&err, "shape");
    assert_eq!(chain(&err), "tensor op: shape");
    let err = ModelError::Io {
        path: "/m/model.gguf".into(),
        source: missing(),
    };
    assert_eq!(chain(&err), "/m/model.gguf: no such file");
}

#[test]
fn engine_task_failures_and_shared_errors_keep_their_cause() {
    use treegrpo::engine::EngineError;
    use treegrpo::model::ModelError;

    let err = EngineError::Task {
        task: "weight loading",
        source: panicked_task(),
    };
    assert!(err.source().unwrap().is::<tokio::task::JoinError>());
    assert_cause_once(&err, "panicked");
    assert!(
        chain(&err).starts_with("the weight loading task failed: "),
        "{err}"
    );

    // A second waiter on the same work gets the same failure: a cause that cannot be
    // cloned moves behind an `Arc`, both copies print as the original did.
    let mut first = EngineError::Model(ModelError::Io {
        path: "/m/x.gguf".into(),
        source: missing(),
    });
    let want = chain(&first);
    let second = first.replicate();
    assert!(matches!(first, EngineError::Shared(_)), "{first:?}");
    assert_eq!((chain(&first), chain(&second)), (want.clone(), want));
    assert!(chain(&second).ends_with(": no such file"));
    let io = second.source().and_then(|e| e.downcast_ref::<IoError>());
    assert_eq!(io.map(IoError::kind), Some(ErrorKind::NotFound));
    // A clonable variant stays itself (callers match on it).
    let mut fits = EngineError::EmptyPrompt;
    assert!(matches!(fits.replicate(), EngineError::EmptyPrompt));
    assert!(matches!(fits, EngineError::EmptyPrompt));
}

#[test]
fn kv_config_errors_are_typed() {
    use treegrpo::kv::{KvCache, KvConfig, KvConfigError, KvError};

    let config = KvConfig {
        block_size: 0,
        budget_bytes: 1 << 20,
        format: treegrpo::model::KvFormat::F32,
    };
    let err = KvCache::new(config, 2, 8).expect_err("a zero block size");
    assert!(
        matches!(
            err,
            KvError::InvalidConfig(KvConfigError::ZeroSize { block_size: 0, .. })
        ),
        "{err:?}"
    );
    assert_cause_once(&err, "must all be positive");
    assert_eq!(
        chain(&err),
        "invalid KV config: block_size 0, num_layers 2 and kv_dim 8 must all be positive"
    );
}

#[test]
fn env_errors_carry_the_parse_error_and_tools_show_their_cause_once() {
    use treegrpo::env::calc_eval::CalcError;
    use treegrpo::env::{load_samples, run_tool, CalcTool, EnvError, ToolError};

    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("q.jsonl");
    std::fs::write(
        &path,
        "{\"id\": 1, \"question\": \"Q?\", \"golden_answers\": [\"a\"]}\nnot json\n",
    )
    .unwrap();
    let err = load_samples(&path).unwrap_err();
    assert!(matches!(err, EnvError::JsonLine { line: 2, .. }), "{err:?}");
    assert!(err.source().unwrap().is::<serde_json::Error>());
    assert_cause_once(&err, "expected ident");

    let err = load_samples(&dir.path().join("none.jsonl")).unwrap_err();
    assert!(matches!(err, EnvError::Io { .. }), "{err:?}");
    assert_eq!(
        chain(&err).matches("No such file").count(),
        1,
        "{}",
        chain(&err)
    );

    let rt = tokio::runtime::Runtime::new().unwrap();
    let err = rt.block_on(async {
        use treegrpo::env::Tool;
        CalcTool.call("1/0").await.unwrap_err()
    });
    assert!(
        matches!(err, ToolError::Calc(CalcError::DivisionByZero)),
        "{err:?}"
    );
    assert_cause_once(&err, "division by zero");
    // The model reads the message and its cause.
    let outcome = rt.block_on(run_tool(
        std::sync::Arc::new(CalcTool),
        "1/0",
        std::time::Duration::from_secs(5),
    ));
    assert_eq!(
        outcome.text,
        "Tool error (calc): invalid input: division by zero"
    );

    let err = ToolError::Task {
        tool: "search",
        source: panicked_task(),
    };
    assert_cause_once(&err, "panicked");
}

#[test]
fn rollout_errors_print_each_cause_once() {
    use treegrpo::advantage::AdvantageError;
    use treegrpo::rollout::{read_forest, LineJsonError};

    // Was "advantages: tree 0 has no nodes: tree 0 has no nodes" under `{:#}`.
    let err = RolloutError::from(AdvantageError::EmptyTree { tree: 0 });
    assert_eq!(chain(&err), "advantages: tree 0 has no nodes");

    let err = RolloutError::Task {
        task: "branch",
        source: panicked_task(),
    };
    assert_cause_once(&err, "panicked");

    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("forest.jsonl");
    std::fs::write(&path, "{\"prompt_uid\": \"x\"}\n").unwrap();
    let err = read_forest(&path).unwrap_err();
    assert!(
        matches!(err, RolloutError::ForestLine { line: 1, .. }),
        "{err:?}"
    );
    let line = err
        .source()
        .unwrap()
        .downcast_ref::<LineJsonError>()
        .unwrap();
    assert!(line.0.is_data(), "{line:?}");
    assert_cause_once(&err, "missing field");
    assert!(!chain(&err).contains("at line"), "{}", chain(&err));
}

#[test]
fn train_and_loop_files_that_do_not_parse_carry_serdes_error() {
    let serde = || serde_json::from_str::<u32>("x").unwrap_err();
    let err = TrainError::Json {
        path: "/d/trajectories.jsonl".into(),
        line: 3,
        what: "a trajectory record",
        source: serde(),
    };
    assert_cause_once(&err, "expected value");
    assert!(chain(&err).starts_with("/d/trajectories.jsonl, line 3: not a trajectory record: "));
    let err = TrainError::Json {
        path: "/d/trainer_state.json".into(),
        line: 0,
        what: "a trainer state",
        source: serde(),
    };
    assert!(chain(&err).starts_with("/d/trainer_state.json: not a trainer state: "));

    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("log.jsonl");
    std::fs::write(&log, "\nnot a line\n").unwrap();
    let err = treegrpo::closed_loop::read_log(&log).unwrap_err();
    assert!(matches!(err, LoopError::LogLine { line: 2, .. }), "{err:?}");
    assert!(err.source().unwrap().is::<serde_json::Error>());
    assert_cause_once(&err, "expected ident");
}

#[cfg(feature = "serve")]
#[test]
fn serve_refusals_name_the_field_then_the_rule() {
    use treegrpo::engine::SamplingError;
    use treegrpo::serve::error::{error_chain, ServeError};

    let err = ServeError::Sampling(SamplingError::TopP(2.0));
    assert_cause_once(&err, "top_p 2 is outside (0, 1]");
    assert_eq!(error_chain(&err), "top_p: top_p 2 is outside (0, 1]");
    let err = ServeError::Body(serde_json::from_str::<u32>("x").unwrap_err());
    assert_cause_once(&err, "expected value");
}

#[test]
fn plot_and_advantage_errors() {
    use treegrpo::advantage::AdvantageError;
    use treegrpo::view::plot::PlotError;

    let err = PlotError(plotters::drawing::DrawingAreaErrorKind::LayoutError);
    assert_cause_once(&err, "Bad layout");
    let err = "tree2norm"
        .parse::<treegrpo::advantage::AdvantageMode>()
        .unwrap_err();
    assert_eq!(
        err,
        AdvantageError::UnknownMode {
            given: "tree2norm".into()
        }
    );
}

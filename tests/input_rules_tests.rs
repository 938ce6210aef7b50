//! One rule for every input: each bad value is driven through the CLI (the real
//! binary), the server (`/v1/rollouts`, `/v1/completions` on `127.0.0.1:0`) and the
//! Python package (`treegrpo.rollout`, `Engine.generate`), and every way in refuses it
//! with the library's own words — the `Display` of the library error that rule
//! returns. Nothing is coerced: a control row of good values is accepted everywhere,
//! so a refusal is never the harness failing for another reason.

mod common;

use std::io::Write;
use std::path::Path;
use std::process::{Command, Stdio};

use serde_json::{json, Value};
use treegrpo::engine::SamplingError;
use treegrpo::env::UnknownTask;
use treegrpo::rollout::TreeConfigError;

/// What a row asks of each way in.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Call {
    /// A tree rollout of one prompt of the calc task.
    Rollout,
    /// One short completion of a prompt.
    Generate,
}

/// One bad (or, with `expected` `None`, good) value.
struct Case {
    name: &'static str,
    call: Call,
    /// The option, by its request-field name (the CLI's flag is the same with dashes).
    field: &'static str,
    /// The value, as JSON; NaN and infinities travel as strings, see [`value_text`].
    value: Value,
    /// The library's refusal, or `None` when the value is accepted.
    expected: Option<String>,
}

fn case(
    name: &'static str,
    call: Call,
    field: &'static str,
    value: Value,
    expected: Option<String>,
) -> Case {
    Case {
        name,
        call,
        field,
        value,
        expected,
    }
}

/// The table: every bad value the issue lists, with the library error whose text
/// every way in must show.
fn cases() -> Vec<Case> {
    use Call::*;
    let sampling = |e: SamplingError| Some(e.to_string());
    let tree = |e: TreeConfigError| Some(e.to_string());
    vec![
        case("good rollout", Rollout, "temperature", json!(1.0), None),
        case("good completion", Generate, "top_k", json!(-1), None),
        case(
            "negative temperature",
            Rollout,
            "temperature",
            json!(-1.0),
            sampling(SamplingError::Temperature(-1.0)),
        ),
        case(
            "NaN temperature",
            Rollout,
            "temperature",
            json!("NaN"),
            sampling(SamplingError::Temperature(f32::NAN)),
        ),
        case(
            "infinite temperature",
            Rollout,
            "temperature",
            json!("inf"),
            sampling(SamplingError::Temperature(f32::INFINITY)),
        ),
        case(
            "negative temperature in a completion",
            Generate,
            "temperature",
            json!(-0.5),
            sampling(SamplingError::Temperature(-0.5)),
        ),
        case(
            "top-p 0",
            Generate,
            "top_p",
            json!(0.0),
            sampling(SamplingError::TopP(0.0)),
        ),
        case(
            "top-p above 1",
            Generate,
            "top_p",
            json!(1.5),
            sampling(SamplingError::TopP(1.5)),
        ),
        // vLLM's convention everywhere: -1 and 0 are "off"; below -1 is no top-k.
        case(
            "top-k below -1",
            Generate,
            "top_k",
            json!(-2),
            sampling(SamplingError::TopK(-2)),
        ),
        case(
            "min-p above 1",
            Generate,
            "min_p",
            json!(1.5),
            sampling(SamplingError::MinP(1.5)),
        ),
        case(
            "max tokens 0",
            Generate,
            "max_tokens",
            json!(0),
            sampling(SamplingError::NoTokens),
        ),
        case(
            "keep 0",
            Rollout,
            "keep",
            json!(0),
            tree(TreeConfigError::KeepZero),
        ),
        case(
            "trees 0",
            Rollout,
            "trees",
            json!(0),
            tree(TreeConfigError::NoTrees),
        ),
        case(
            "chains 0",
            Rollout,
            "chains",
            json!(0),
            tree(TreeConfigError::NoChains),
        ),
        case(
            "max step tokens 0",
            Rollout,
            "max_step_tokens",
            json!(0),
            tree(TreeConfigError::NoStepTokens),
        ),
        case(
            "unknown task",
            Rollout,
            "task",
            json!("chess"),
            Some(
                UnknownTask {
                    given: "chess".into(),
                }
                .to_string(),
            ),
        ),
    ]
}

/// A value as text: JSON's own spelling, or the string for NaN and infinities.
fn value_text(v: &Value) -> String {
    match v {
        Value::String(s) => s.clone(),
        other => other.to_string(),
    }
}

/// How one way in answered one row.
#[derive(Debug)]
enum Answer {
    Accepted,
    Refused(String),
}

/// Checks one way in's answer against the row.
fn check(way: &str, c: &Case, answer: &Answer) {
    match (&c.expected, answer) {
        (None, Answer::Accepted) => {}
        (None, Answer::Refused(why)) => panic!("{way}, {}: refused a good value: {why}", c.name),
        (Some(want), Answer::Accepted) => {
            panic!("{way}, {}: accepted a bad value (want: {want})", c.name)
        }
        (Some(want), Answer::Refused(got)) => assert!(
            got.contains(want.as_str()),
            "{way}, {}: the refusal does not carry the library's words\n want: {want}\n got: {got}",
            c.name
        ),
    }
}

/// The CLI: `treegrpo rollout` / `treegrpo generate` with the row's flag.
fn through_cli(c: &Case, model: &Path) -> Answer {
    let flag = format!("--{}={}", c.field.replace('_', "-"), value_text(&c.value));
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_treegrpo"));
    // Small defaults, each unless the row sets that option itself (clap refuses a
    // flag given twice).
    let defaults: &[(&str, &str)] = match c.call {
        Call::Rollout => {
            cmd.arg("rollout");
            &[
                ("task", "calc"),
                ("prompts", "1"),
                ("max_step_tokens", "4"),
                ("turns", "1"),
                ("kv_mib", "64"),
            ]
        }
        Call::Generate => {
            cmd.args(["generate", "--prompt", "hi"]);
            &[("max_tokens", "2")]
        }
    };
    for (field, value) in defaults.iter().filter(|(f, _)| *f != c.field) {
        cmd.arg(format!("--{}={value}", field.replace('_', "-")));
    }
    let out = cmd.arg("--model").arg(model).arg(flag).output().unwrap();
    if out.status.success() {
        Answer::Accepted
    } else {
        Answer::Refused(String::from_utf8_lossy(&out.stderr).into_owned())
    }
}

/// The server: the row's field in a `/v1/rollouts` or `/v1/completions` body.
fn through_server(c: &Case, addr: std::net::SocketAddr) -> Answer {
    let (path, mut body) = match c.call {
        Call::Rollout => (
            "/v1/rollouts",
            json!({"task": "calc", "prompts": 1, "max_step_tokens": 4, "turns": 1}),
        ),
        Call::Generate => ("/v1/completions", json!({"prompt": "hi", "max_tokens": 2})),
    };
    // JSON has no NaN or infinity: a client sends Python's `NaN` token (which no JSON
    // parser reads) or a number past f32's range (which is infinity as an f32).
    let raw = match c.value.as_str() {
        Some("NaN") => Some("NaN"),
        Some("inf") => Some("1e39"),
        _ => None,
    };
    body[c.field] = match raw {
        Some(_) => json!("RAW"),
        None => c.value.clone(),
    };
    let mut text = body.to_string();
    if let Some(raw) = raw {
        text = text.replace("\"RAW\"", raw);
    }
    let reply = common::http::post_raw(addr, path, text.as_bytes());
    if reply.status == 200 {
        return Answer::Accepted;
    }
    assert_eq!(reply.status, 400, "{}: {}", c.name, reply.text());
    let error = &reply.json()["error"];
    if raw == Some("NaN") {
        // Unreadable as JSON at all: refused as the body, before any field is read.
        let message = error["message"].as_str().unwrap_or_default();
        assert!(
            message.starts_with("invalid request body"),
            "{}",
            reply.text()
        );
        return Answer::Refused(format!("(not JSON) {}", c.expected.clone().unwrap()));
    }
    if c.field != "task" {
        assert_eq!(error["param"], c.field, "{}", reply.text());
    }
    Answer::Refused(error["message"].as_str().unwrap_or_default().to_owned())
}

/// The Python package: every row in one interpreter, answers as JSON lines.
fn through_python(cases: &[Case], model: &Path) -> Option<Vec<Answer>> {
    let python = common::python::python_with(common::python::PythonNeeds {
        python_var: "TREEGRPO_PYTHON_PACKAGE",
        require_var: "TREEGRPO_REQUIRE_PYTHON_PACKAGE",
        modules: "treegrpo",
        how: "pip install ./python, then set TREEGRPO_PYTHON_PACKAGE",
    })?;
    const SCRIPT: &str = r#"
import json, sys, treegrpo
engine = treegrpo.Engine(sys.argv[1], kv_mib=64)
for line in sys.stdin:
    row = json.loads(line)
    value = row["value"]
    if value in ("NaN", "inf"):
        value = float(value)
    try:
        if row["call"] == "Rollout":
            options = {"max_step_tokens": 4, "max_turns": 1, row["field"]: value}
            task = options.pop("task", "calc")
            treegrpo.rollout(engine, task, 1, **options)
        else:
            options = {"max_tokens": 2, row["field"]: value}
            engine.generate(["hi"], **options)
        print(json.dumps({"ok": True}), flush=True)
    except Exception as e:
        print(json.dumps({"ok": False, "error": f"{type(e).__name__}: {e}"}), flush=True)
"#;
    let mut child = Command::new(python)
        .args(["-c", SCRIPT])
        .arg(model)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .unwrap();
    {
        let mut stdin = child.stdin.take().unwrap();
        for c in cases {
            let row = json!({"call": format!("{:?}", c.call), "field": c.field, "value": c.value});
            writeln!(stdin, "{row}").unwrap();
        }
    }
    let out = child.wait_with_output().unwrap();
    assert!(out.status.success(), "the Python driver failed");
    let answers: Vec<Answer> = String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(|line| {
            let v: Value = serde_json::from_str(line).unwrap();
            if v["ok"] == true {
                Answer::Accepted
            } else {
                let error = v["error"].as_str().unwrap().to_owned();
                // A refusal of a value is a ValueError (what Python raises for one).
                assert!(error.starts_with("ValueError: "), "{error}");
                Answer::Refused(error)
            }
        })
        .collect();
    assert_eq!(answers.len(), cases.len());
    Some(answers)
}

#[test]
fn every_way_in_refuses_each_bad_value_in_the_librarys_words() {
    let fixture = common::server::serve();
    let model = fixture.dir.path().join("tiny");
    let cases = cases();
    for c in &cases {
        check("CLI", c, &through_cli(c, &model));
        check("server", c, &through_server(c, fixture.server.addr));
    }
    if let Some(answers) = through_python(&cases, &model) {
        for (c, answer) in cases.iter().zip(&answers) {
            check("Python", c, answer);
        }
    }
}

/// The rule itself, as the library's constructors apply it: refused, never coerced.
#[test]
fn the_library_refuses_what_the_ways_in_refuse() {
    use treegrpo::engine::{GenParams, Sampling};
    use treegrpo::rollout::TreeOptions;
    assert!(matches!(
        Sampling::new(f32::NAN, None, None, None),
        Err(SamplingError::Temperature(t)) if t.is_nan()
    ));
    assert_eq!(
        Sampling::new(-1.0, None, None, None),
        Err(SamplingError::Temperature(-1.0))
    );
    assert_eq!(
        Sampling::new(1.0, Some(-2), None, None),
        Err(SamplingError::TopK(-2))
    );
    // vLLM's "off" spellings are off, not errors.
    assert_eq!(
        Sampling::new(1.0, Some(-1), Some(1.0), Some(0.0)),
        Sampling::new(1.0, None, None, None)
    );
    assert_eq!(
        GenParams::greedy(0).validate(),
        Err(SamplingError::NoTokens)
    );
    let keep_zero = TreeOptions {
        keep: Some(0),
        ..TreeOptions::default()
    };
    assert_eq!(keep_zero.config(), Err(TreeConfigError::KeepZero));
    assert!(TreeOptions::default().config().is_ok());
    assert_eq!(
        "chess".parse::<treegrpo::env::Task>(),
        Err(UnknownTask {
            given: "chess".into()
        })
    );
}

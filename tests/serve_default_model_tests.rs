//! `treegrpo serve` as a user runs it — the binary, the default model, `--port 0` —
//! driven by plain HTTP and by the real `openai` package: greedy completions on token
//! ids give what `treegrpo generate --raw` gives, chat answers the capital of France,
//! and a fork generates exactly what a fresh session does without recomputing its
//! prefix.
//!
//! The Python check needs a python with `openai` (`TREEGRPO_PYTHON`, else `python3`);
//! `.ci/run` installs one in a venv and sets `TREEGRPO_REQUIRE_PYTHON=1`, so in CI a
//! missing client fails the test instead of skipping it.

mod common;

use std::io::{BufRead, BufReader};
use std::net::SocketAddr;
use std::process::{Child, Command, Stdio};

use common::http;
use common::single_sequence::{generate, GenerateRequest};
use serde_json::{json, Value};
use treegrpo::engine::Sampling;
use treegrpo::model::LoadedModel;

const PROMPT: &str = "The capital of France is";
const NEW_TOKENS: usize = 16;

/// The binary serving the default model, stopped (SIGINT) when dropped.
struct CliServer {
    child: Child,
    addr: SocketAddr,
}

impl CliServer {
    fn start() -> Self {
        common::default_model();
        let mut child = Command::new(env!("CARGO_BIN_EXE_treegrpo"))
            .args(["serve", "--port", "0", "--kv-mib", "512"])
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let mut lines = BufReader::new(child.stderr.take().unwrap()).lines();
        let addr = loop {
            let line = lines
                .next()
                .expect("the server exited before listening")
                .unwrap();
            if let Some(rest) = line.split("listening on http://").nth(1) {
                break rest.split_whitespace().next().unwrap().parse().unwrap();
            }
        };
        // Keep draining stderr so the server never blocks on a full pipe.
        std::thread::spawn(move || for _ in lines {});
        CliServer { child, addr }
    }

    fn metric(&self, series: &str) -> f64 {
        http::metric(&http::get(self.addr, "/metrics").text(), series)
    }
}

impl Drop for CliServer {
    fn drop(&mut self) {
        common::interrupt(&self.child);
        let _ = self.child.wait();
    }
}

/// What `treegrpo generate --raw` prints, and the token ids the same generation has
/// through the library (the CLI prints text only).
fn cli_generation(model: &LoadedModel) -> (String, Vec<u32>, Vec<u32>) {
    let out = Command::new(env!("CARGO_BIN_EXE_treegrpo"))
        .args(["generate", "--raw", "--prompt", PROMPT, "--max-tokens"])
        .arg(NEW_TOKENS.to_string())
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = String::from_utf8(out.stdout).unwrap();
    let text = text.strip_suffix('\n').unwrap_or(&text).to_string();
    let prompt = model.tokenizer.encode_prompt(PROMPT).unwrap();
    let tokens = generate(
        &model.model,
        &GenerateRequest {
            penalties: treegrpo::engine::Penalties::NONE,
            prompt: prompt.clone(),
            max_new_tokens: NEW_TOKENS,
            sampling: Sampling::Greedy,
            seed: 0,
            stop_tokens: model.tokenizer.eos_ids().to_vec(),
            prefill_chunk: 512,
        },
    )
    .unwrap()
    .tokens
    .iter()
    .map(|t| t.token)
    .collect();
    (text, prompt, tokens)
}

fn ok(reply: http::Reply) -> Value {
    assert_eq!(reply.status, 200, "{}", reply.text());
    reply.json()
}

fn ids(v: &Value) -> Vec<u32> {
    serde_json::from_value(v.clone()).unwrap()
}

#[test]
fn completions_equal_generate_raw_chat_says_paris_and_forks_reuse_their_prefix() {
    let model = LoadedModel::load(&common::default_model()).unwrap();
    let (text, prompt, tokens) = cli_generation(&model);
    let server = CliServer::start();
    let a = server.addr;
    let done = ok(http::post(
        a,
        "/v1/completions",
        &json!({"prompt": prompt, "max_tokens": NEW_TOKENS, "temperature": 0,
                "return_token_ids": true}),
    ));
    assert_eq!(ids(&done["choices"][0]["token_ids"]), tokens);
    assert_eq!(done["choices"][0]["text"], text);

    let chat = ok(http::post(
        a,
        "/v1/chat/completions",
        &json!({"messages": [{"role": "user", "content": "What is the capital of France?"}],
                "temperature": 0, "max_tokens": 32}),
    ));
    let reply = chat["choices"][0]["message"]["content"].as_str().unwrap();
    assert!(reply.contains("Paris"), "{reply}");

    // A tree step by hand: prompt, a step, an observation, two branches.
    let session = ok(http::post(
        a,
        "/v1/sessions",
        &json!({"messages": [{"role": "user", "content": "Name three rivers of Europe."}]}),
    ));
    let id = session["session_id"].as_str().unwrap().to_string();
    let step = json!({"sampling_params": {"max_new_tokens": 12, "temperature": 0}});
    ok(http::post(a, &format!("/v1/sessions/{id}/generate"), &step));
    ok(http::post(
        a,
        &format!("/v1/sessions/{id}/append"),
        &json!({"text": "<|im_end|>\n<|im_start|>user\nAnd one more?<|im_end|>\n<|im_start|>assistant\n"}),
    ));
    let forks = ok(http::post(
        a,
        &format!("/v1/sessions/{id}/fork"),
        &json!({"n": 2}),
    ));
    let child = forks["session_ids"][0].as_str().unwrap().to_string();
    let prefilled = server.metric("treegrpo_tokens_prefilled_total");
    let from_fork = ok(http::post(
        a,
        &format!("/v1/sessions/{child}/generate"),
        &step,
    ));
    assert_eq!(
        server.metric("treegrpo_tokens_prefilled_total"),
        prefilled,
        "the fork's generation computes no prefix token"
    );
    let shown = ok(http::get(a, &format!("/v1/sessions/{id}")));
    let fresh = ok(http::post(
        a,
        "/v1/sessions",
        &json!({"input_ids": shown["input_ids"]}),
    ));
    let fresh_id = fresh["session_id"].as_str().unwrap();
    let from_fresh = ok(http::post(
        a,
        &format!("/v1/sessions/{fresh_id}/generate"),
        &step,
    ));
    assert_eq!(from_fork["output_ids"], from_fresh["output_ids"]);
    assert_eq!(from_fork["logprobs"], from_fresh["logprobs"]);
}

/// The python to run the client check with, if one with `openai` is there.
fn python_with_openai() -> Option<String> {
    common::python::python_with(common::python::PythonNeeds {
        python_var: "TREEGRPO_PYTHON",
        require_var: "TREEGRPO_REQUIRE_PYTHON",
        modules: "openai",
        how: "pip install openai, then set TREEGRPO_PYTHON",
    })
}

#[test]
fn the_openai_package_drives_the_server() {
    let Some(python) = python_with_openai() else {
        return;
    };
    let model = LoadedModel::load(&common::default_model()).unwrap();
    let (text, prompt, tokens) = cli_generation(&model);
    let server = CliServer::start();
    let script = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/tests/python/openai_client_check.py"
    );
    let out = Command::new(python)
        .arg(script)
        .arg(format!("http://{}", server.addr))
        .arg(serde_json::to_string(&prompt).unwrap())
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    let report: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(report["model"], "SmolLM2-135M-Instruct.Q4_1");
    assert_eq!(ids(&report["completion_token_ids"]), tokens);
    assert_eq!(report["completion_text"], text);
    assert!(
        report["chat"].as_str().unwrap().contains("Paris"),
        "{report}"
    );
    // The long prompt's whole blocks, less its last token (computed again for its logits).
    let block = treegrpo::kv::DEFAULT_BLOCK_SIZE as u64;
    let long_prompt = report["long_prompt_tokens"].as_u64().unwrap();
    assert!(long_prompt > block, "{report}");
    assert_eq!(
        report["cached_tokens"].as_u64().unwrap(),
        (long_prompt / block * block).min(long_prompt - 1),
        "{report}"
    );
    assert_eq!(report["bad_request"], 400);
    // The standard-library client's example: an agent loop forking at step boundaries.
    let example = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/clients/python/fork_agent_example.py"
    );
    let python = std::env::var("TREEGRPO_PYTHON").unwrap_or_else(|_| "python3".into());
    let out = Command::new(python)
        .arg(example)
        .arg(format!("http://{}", server.addr))
        .output()
        .unwrap();
    let printed = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{printed}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        printed.contains("prefix tokens reused by forks"),
        "{printed}"
    );
    // Every request's sequences were freed, the example's sessions closed.
    assert_eq!(server.metric("treegrpo_sequences"), 0.0);
    assert_eq!(server.metric("treegrpo_sessions"), 0.0);
}

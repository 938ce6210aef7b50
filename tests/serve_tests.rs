//! `treegrpo serve` on `127.0.0.1:0`, driven over plain HTTP: every endpoint's shape
//! and its numbers against an oracle (the single-sequence `engine::generate`, a fresh
//! session, the new weights' own output, the engine's counters).
//!
//! The model is a tiny seeded one written by the test (fast, and a second seed is a
//! checkpoint of the same shape with other weights); bad input, limits and
//! disconnects are in `serve_limits_tests.rs`, the default model's checks in
//! `serve_default_model_tests.rs`.

mod common;

use common::http::{self, Reply};
use common::server::{floats, greedy_oracle, ids, ok, serve, tiny, wait_until_idle};
use serde_json::{json, Value};
use treegrpo::model::LoadedModel;

const PROMPT: [u32; 6] = [40, 41, 42, 100, 101, 7];

#[test]
fn greedy_completion_on_token_ids_equals_the_single_sequence_generate() {
    let f = serve();
    let got = ok(http::post(
        f.server.addr,
        "/v1/completions",
        &json!({"model": "tiny", "prompt": PROMPT, "max_tokens": 20, "temperature": 0,
                "logprobs": 1, "return_token_ids": true}),
    ));
    let (want, want_lp) = greedy_oracle(&f.model.model, &PROMPT, 20, f.model.tokenizer.eos_ids());
    let choice = &got["choices"][0];
    assert_eq!(ids(&choice["token_ids"]), want);
    assert_eq!(ids(&choice["prompt_token_ids"]), PROMPT.to_vec());
    assert_eq!(floats(&choice["logprobs"]["token_logprobs"]), want_lp);
    assert_eq!(
        choice["text"].as_str().unwrap(),
        f.model.tokenizer.decode(&want).unwrap()
    );
    assert_eq!(
        choice["logprobs"]["tokens"].as_array().unwrap().len(),
        want.len()
    );
    let finish = if want.len() == 20 { "length" } else { "stop" };
    assert_eq!(choice["finish_reason"], finish);
    assert_eq!(got["object"], "text_completion");
    assert_eq!(got["usage"]["prompt_tokens"], PROMPT.len());
    assert_eq!(got["usage"]["completion_tokens"], want.len());
    assert_eq!(got["usage"]["total_tokens"], PROMPT.len() + want.len());
    // The same prompt again: its full blocks come from the prefix cache (the tiny
    // prompt is shorter than a block, so one of two and a half blocks is used).
    let block = treegrpo::kv::DEFAULT_BLOCK_SIZE;
    let long: Vec<u32> = (0..(2 * block + block / 2) as u32)
        .map(|i| 10 + i)
        .collect();
    let body = json!({"prompt": long, "max_tokens": 2, "temperature": 0});
    let first = ok(http::post(f.server.addr, "/v1/completions", &body));
    let again = ok(http::post(f.server.addr, "/v1/completions", &body));
    assert_eq!(first["usage"]["prompt_tokens_details"]["cached_tokens"], 0);
    assert_eq!(
        again["usage"]["prompt_tokens_details"]["cached_tokens"],
        2 * block
    );
    assert_eq!(first["choices"][0]["text"], again["choices"][0]["text"]);
}

/// Each choice's text and token ids, from a streamed body, by index.
fn streamed_choices(
    reply: &Reply,
    n: usize,
    field: &str,
) -> (Vec<String>, Vec<Vec<u32>>, Vec<Value>) {
    assert_eq!(reply.status, 200, "{}", reply.text());
    assert!(reply
        .header("content-type")
        .unwrap()
        .starts_with("text/event-stream"));
    let data = reply.sse_data();
    assert_eq!(data.last().unwrap(), "[DONE]", "{data:?}");
    let mut text = vec![String::new(); n];
    let mut tokens = vec![Vec::new(); n];
    let mut chunks = Vec::new();
    for d in &data[..data.len() - 1] {
        let chunk: Value = serde_json::from_str(d).unwrap();
        for c in chunk["choices"].as_array().unwrap() {
            let i = c["index"].as_u64().unwrap() as usize;
            let piece = if field == "text" {
                &c["text"]
            } else {
                &c["delta"]["content"]
            };
            text[i].push_str(piece.as_str().unwrap_or(""));
            if let Some(t) = c.get("token_ids") {
                tokens[i].extend(ids(t));
            }
        }
        chunks.push(chunk);
    }
    (text, tokens, chunks)
}

/// A stop string taken from the middle of the greedy reply: both the whole and the
/// streamed answer end just before it (the stream holds back text that could begin
/// a stop until it is ruled out).
#[test]
fn a_stop_string_cuts_the_streamed_text_where_it_cuts_the_whole() {
    let f = serve();
    let greedy = json!({"prompt": "hello the world", "max_tokens": 40, "temperature": 0,
                        "ignore_eos": true});
    let free = ok(http::post(f.server.addr, "/v1/completions", &greedy));
    let text = free["choices"][0]["text"].as_str().unwrap().to_string();
    let chars: Vec<char> = text.chars().collect();
    let at = (3..chars.len().saturating_sub(2))
        .find(|&i| chars[i..i + 2].iter().all(|c| c.is_ascii_graphic()))
        .expect("the greedy reply has two printable ASCII characters in a row");
    let stop: String = chars[at..at + 2].iter().collect();
    let cut = &text[..text.find(&stop).unwrap()];
    for stream in [false, true] {
        let mut body = greedy.clone();
        body["stop"] = json!([stop]);
        body["stream"] = json!(stream);
        let reply = http::post(f.server.addr, "/v1/completions", &body);
        let got = if stream {
            streamed_choices(&reply, 1, "text").0.remove(0)
        } else {
            reply.json()["choices"][0]["text"]
                .as_str()
                .unwrap()
                .to_string()
        };
        assert_eq!(got, cut, "stream: {stream}, stop {stop:?} in {text:?}");
    }
}

#[test]
fn a_streamed_completion_equals_the_whole_one() {
    let f = serve();
    let body = |stream: bool| {
        json!({"prompt": "hello the world", "max_tokens": 24, "temperature": 1.0, "n": 2,
               "seed": 3, "stop": ["ll"], "return_token_ids": true, "stream": stream,
               "stream_options": {"include_usage": true}})
    };
    let whole = ok(http::post(f.server.addr, "/v1/completions", &body(false)));
    let reply = http::post(f.server.addr, "/v1/completions", &body(true));
    let (text, tokens, chunks) = streamed_choices(&reply, 2, "text");
    for i in 0..2 {
        let choice = &whole["choices"][i];
        assert_eq!(text[i], choice["text"].as_str().unwrap(), "choice {i}");
        assert!(!text[i].contains("ll"), "text ends before the stop string");
        assert_eq!(tokens[i], ids(&choice["token_ids"]), "choice {i}");
        let last = chunks
            .iter()
            .rev()
            .find(|c| {
                c["choices"]
                    .as_array()
                    .is_some_and(|a| a.iter().any(|x| x["index"] == i))
            })
            .unwrap();
        let finish = last["choices"][0]["finish_reason"].clone();
        assert_eq!(finish, choice["finish_reason"]);
    }
    let usage = &chunks.last().unwrap()["usage"];
    assert_eq!(
        usage["completion_tokens"],
        whole["usage"]["completion_tokens"]
    );
    assert_eq!(usage["prompt_tokens"], whole["usage"]["prompt_tokens"]);
    assert_ne!(
        whole["choices"][0]["token_ids"], whole["choices"][1]["token_ids"],
        "two choices are seeded apart"
    );
}

#[test]
fn chat_renders_the_template_and_streams_the_role_first() {
    let f = serve();
    let body = |stream: bool| {
        json!({"messages": [{"role": "user", "content": [{"type": "text", "text": "hi there"}]}],
               "max_tokens": 12, "temperature": 0, "logprobs": true, "return_token_ids": true,
               "stream": stream})
    };
    let whole = ok(http::post(
        f.server.addr,
        "/v1/chat/completions",
        &body(false),
    ));
    let prompt = f
        .model
        .chat_prompt(&[treegrpo::model::ChatMessage::new("user", "hi there")])
        .unwrap();
    assert_eq!(ids(&whole["prompt_token_ids"]), prompt);
    assert_eq!(whole["object"], "chat.completion");
    let choice = &whole["choices"][0];
    assert_eq!(choice["message"]["role"], "assistant");
    let n = ids(&choice["token_ids"]).len();
    assert_eq!(choice["logprobs"]["content"].as_array().unwrap().len(), n);
    let reply = http::post(f.server.addr, "/v1/chat/completions", &body(true));
    let (text, tokens, chunks) = streamed_choices(&reply, 1, "delta");
    assert_eq!(chunks[0]["choices"][0]["delta"]["role"], "assistant");
    assert_eq!(chunks[0]["object"], "chat.completion.chunk");
    assert_eq!(text[0], choice["message"]["content"].as_str().unwrap());
    assert_eq!(tokens[0], ids(&choice["token_ids"]));
}

#[test]
fn choices_of_one_prompt_compute_it_once() {
    let f = serve();
    let before = f.server.metric("treegrpo_tokens_prefilled_total");
    let prompt: Vec<u32> = (0..30).map(|i| 50 + i).collect();
    let got = ok(http::post(
        f.server.addr,
        "/v1/completions",
        &json!({"prompt": prompt, "max_tokens": 5, "n": 4, "seed": 1, "ignore_eos": true,
                "return_token_ids": true}),
    ));
    assert_eq!(got["choices"].as_array().unwrap().len(), 4);
    let prefilled = f.server.metric("treegrpo_tokens_prefilled_total") - before;
    assert_eq!(
        prefilled, 30.0,
        "the prompt is prefilled once for 4 choices"
    );
    assert_eq!(
        f.server.metric("treegrpo_tokens_reused_fork_total"),
        3.0 * 30.0
    );
    for c in got["choices"].as_array().unwrap() {
        assert_eq!(ids(&c["token_ids"]).len(), 5);
    }
}

#[test]
fn sglang_generate_answers_in_its_shape() {
    let f = serve();
    let got = ok(http::post(
        f.server.addr,
        "/generate",
        &json!({"input_ids": PROMPT, "sampling_params": {"max_new_tokens": 8, "temperature": 0},
                "return_logprob": true, "rid": "r1"}),
    ));
    let out = ids(&got["output_ids"]);
    let meta = &got["meta_info"];
    assert_eq!(meta["id"], "r1");
    assert_eq!(meta["prompt_tokens"], PROMPT.len());
    assert_eq!(meta["completion_tokens"], out.len());
    assert_eq!(meta["weight_version"], 0);
    let lps = meta["output_token_logprobs"].as_array().unwrap();
    assert_eq!(lps.len(), out.len());
    for (entry, &t) in lps.iter().zip(&out) {
        assert_eq!(entry[1], t);
        assert!(entry[0].as_f64().unwrap() <= 0.0);
        assert!(entry[2].is_null());
    }
    assert!(["stop", "length"].contains(&meta["finish_reason"]["type"].as_str().unwrap()));
    // The same greedy request on /v1/completions gives the same tokens.
    let oa = ok(http::post(
        f.server.addr,
        "/v1/completions",
        &json!({"prompt": PROMPT, "max_tokens": 8, "temperature": 0, "return_token_ids": true}),
    ));
    assert_eq!(ids(&oa["choices"][0]["token_ids"]), out);
    // A batch answers with a list.
    let batch = ok(http::post(
        f.server.addr,
        "/generate",
        &json!({"text": ["hello", "the world"], "sampling_params": {"max_new_tokens": 3}}),
    ));
    assert_eq!(batch.as_array().unwrap().len(), 2);
}

#[test]
fn a_fork_shares_the_prefix_and_generates_as_a_fresh_session_would() {
    let f = serve();
    let a = f.server.addr;
    let s = ok(http::post(
        a,
        "/v1/sessions",
        &json!({"input_ids": (10..60).collect::<Vec<u32>>()}),
    ));
    let id = s["session_id"].as_str().unwrap().to_string();
    assert_eq!(s["length"], 50);
    let step = ok(http::post(
        a,
        &format!("/v1/sessions/{id}/generate"),
        &json!({"sampling_params": {"max_new_tokens": 6, "temperature": 0, "ignore_eos": true}}),
    ));
    let first = ids(&step["output_ids"]);
    assert_eq!(step["length"], 56);
    let appended = ok(http::post(
        a,
        &format!("/v1/sessions/{id}/append"),
        &json!({"input_ids": [3, 4, 5, 6]}),
    ));
    assert_eq!(appended["length"], 60);
    let forks = ok(http::post(
        a,
        &format!("/v1/sessions/{id}/fork"),
        &json!({"n": 2}),
    ));
    let children: Vec<String> = forks["session_ids"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_str().unwrap().to_string())
        .collect();
    assert_eq!(children.len(), 2);
    let prefilled = f.server.metric("treegrpo_tokens_prefilled_total");
    let reused = f.server.metric("treegrpo_tokens_reused_fork_total");
    assert_eq!(reused, 2.0 * 60.0, "each fork inherits all 60 tokens");
    let greedy =
        json!({"sampling_params": {"max_new_tokens": 10, "temperature": 0, "ignore_eos": true}});
    let from_fork = ok(http::post(
        a,
        &format!("/v1/sessions/{}/generate", children[0]),
        &greedy,
    ));
    assert_eq!(
        f.server.metric("treegrpo_tokens_prefilled_total"),
        prefilled,
        "the fork's generation computes no prefix token"
    );
    let shown = ok(http::get(a, &format!("/v1/sessions/{}", children[0])));
    assert_eq!(shown["length"], 70);
    let mut tokens: Vec<u32> = (10..60).collect();
    tokens.extend(&first);
    tokens.extend([3, 4, 5, 6]);
    assert_eq!(ids(&shown["input_ids"])[..60], tokens[..]);
    // The oracle: a fresh session on the same 60 tokens (its full blocks may come
    // from the prefix cache; every row's arithmetic is fixed, so that changes
    // nothing).
    let fresh = ok(http::post(a, "/v1/sessions", &json!({"input_ids": tokens})));
    let fresh_id = fresh["session_id"].as_str().unwrap();
    let from_fresh = ok(http::post(
        a,
        &format!("/v1/sessions/{fresh_id}/generate"),
        &greedy,
    ));
    assert_eq!(from_fork["output_ids"], from_fresh["output_ids"]);
    assert_eq!(from_fork["logprobs"], from_fresh["logprobs"]);
    for s in [
        id.as_str(),
        children[0].as_str(),
        children[1].as_str(),
        fresh_id,
    ] {
        ok(http::delete(a, &format!("/v1/sessions/{s}")));
    }
    assert_eq!(f.server.metric("treegrpo_sessions"), 0.0);
    assert_eq!(f.server.metric("treegrpo_sequences"), 0.0);
    assert_eq!(f.server.metric("treegrpo_kv_blocks{state=\"in_use\"}"), 0.0);
    assert_eq!(http::get(a, &format!("/v1/sessions/{id}")).status, 404);
}

#[test]
fn a_weight_update_changes_the_output_and_recomputes_cached_prefixes() {
    let f = serve();
    let a = f.server.addr;
    let other = f.dir.path().join("tiny-8");
    tiny(&other, 8);
    let long: Vec<u32> = (0..40).map(|i| 20 + i).collect();
    let body = json!({"prompt": long, "max_tokens": 8, "temperature": 0, "logprobs": 0,
                      "return_token_ids": true});
    let before = ok(http::post(a, "/v1/completions", &body));
    // A session computed under the old weights.
    let s = ok(http::post(a, "/v1/sessions", &json!({"input_ids": long})));
    let sid = s["session_id"].as_str().unwrap();
    let greedy =
        json!({"sampling_params": {"max_new_tokens": 4, "temperature": 0, "ignore_eos": true}});
    let old_step = ok(http::post(
        a,
        &format!("/v1/sessions/{sid}/generate"),
        &greedy,
    ));
    let recomputed = f.server.metric("treegrpo_tokens_recomputed_total");
    let update = ok(http::post(
        a,
        "/update_weights_from_disk",
        &json!({"model_path": other}),
    ));
    assert_eq!(update["success"], true);
    assert_eq!(update["weight_version"], 1);
    assert_eq!(f.server.metric("treegrpo_weight_version"), 1.0);
    let after = ok(http::post(a, "/v1/completions", &body));
    assert_eq!(after["weight_version"], 1);
    assert_eq!(
        after["usage"]["prompt_tokens_details"]["cached_tokens"], 0,
        "the prefix cached under the old weights is not reused"
    );
    assert_ne!(
        after["choices"][0]["logprobs"]["token_logprobs"],
        before["choices"][0]["logprobs"]["token_logprobs"]
    );
    // The oracle: the new weights' own greedy output.
    let new_model = LoadedModel::load(&other).unwrap();
    let (want, _) = greedy_oracle(&new_model.model, &long, 8, new_model.tokenizer.eos_ids());
    assert_eq!(ids(&after["choices"][0]["token_ids"]), want);
    // The old session's KV is recomputed under the new weights on its next use
    // (its first blocks from the prefix the request above cached under them).
    let step = ok(http::post(
        a,
        &format!("/v1/sessions/{sid}/generate"),
        &greedy,
    ));
    assert_eq!(step["weight_version"], 1);
    assert!(f.server.metric("treegrpo_tokens_recomputed_total") > recomputed);
    let mut session_tokens = long.clone();
    session_tokens.extend(ids(&old_step["output_ids"]));
    assert_eq!(
        ids(&step["output_ids"]),
        greedy_oracle(&new_model.model, &session_tokens, 4, &[]).0
    );
    // A path in the weights folder that is not a model fails and changes nothing.
    std::fs::create_dir(f.dir.path().join("empty")).unwrap();
    let bad = http::post(
        a,
        "/update_weights_from_disk",
        &json!({"model_path": "empty"}),
    );
    assert_eq!(bad.status, 400, "{}", bad.text());
    assert_eq!(bad.json()["success"], false);
    assert_eq!(bad.json()["weight_version"], 1);
}

#[test]
fn rollouts_answer_in_the_export_schema() {
    let f = serve();
    let got = ok(http::post(
        f.server.addr,
        "/v1/rollouts",
        &json!({"task": "calc", "prompts": 2, "trees": 2, "expand": 2, "rounds": 1,
                "max_step_tokens": 12, "turns": 1, "seed": 5}),
    ));
    let forests = got["forests"].as_array().unwrap();
    assert_eq!(forests.len(), 4, "2 prompts × 2 trees");
    let trajectories = got["trajectories"].as_array().unwrap();
    assert_eq!(trajectories.len(), 12, "each tree has 1 + N·L = 3 leaves");
    for t in trajectories {
        for field in [
            "prompt_ids",
            "response_ids",
            "response_mask",
            "reward",
            "advantage",
            "tree_id",
            "prompt_uid",
        ] {
            assert!(t.get(field).is_some(), "trajectory lacks {field}: {t}");
        }
        assert_eq!(
            t["response_ids"].as_array().unwrap().len(),
            t["response_mask"].as_array().unwrap().len()
        );
    }
    assert_eq!(got["summary"]["rollouts"], 12);
    // The same seed gives the same trajectories.
    let again = ok(http::post(
        f.server.addr,
        "/v1/rollouts",
        &json!({"task": "calc", "prompts": 2, "max_step_tokens": 12, "turns": 1, "seed": 5}),
    ));
    assert_eq!(again["trajectories"], got["trajectories"]);
    // Every search field left out is the library's default (`TreeOptions::default`),
    // as the CLI's flags and Python's keywords are.
    let defaults = treegrpo::rollout::TreeOptions {
        max_step_tokens: 12,
        seed: 5,
        ..Default::default()
    }
    .config()
    .unwrap();
    assert_eq!(
        again["summary"]["config"],
        serde_json::to_value(&defaults).unwrap()
    );
    wait_until_idle(&f.server);
}

#[test]
fn health_metrics_and_flush() {
    let f = serve();
    let health = ok(http::get(f.server.addr, "/health"));
    assert_eq!(health["status"], "ok");
    ok(http::post(
        f.server.addr,
        "/v1/completions",
        &json!({"prompt": (0..(2 * treegrpo::kv::DEFAULT_BLOCK_SIZE + 8) as u32).collect::<Vec<u32>>(),
                "max_tokens": 2}),
    ));
    let m = f.server.metrics();
    assert_eq!(
        http::metric(
            &m,
            "treegrpo_requests_total{endpoint=\"/v1/completions\",status=\"200\"}"
        ),
        1.0
    );
    assert!(http::metric(&m, "treegrpo_kv_blocks{state=\"cached\"}") >= 2.0);
    assert!(http::metric(&m, "treegrpo_step_duration_seconds_count") >= 1.0);
    assert!(m.contains("# TYPE treegrpo_request_duration_seconds histogram"));
    ok(http::post(f.server.addr, "/flush_cache", &json!({})));
    let m = f.server.metrics();
    assert_eq!(
        http::metric(&m, "treegrpo_kv_blocks{state=\"cached\"}"),
        0.0
    );
    assert_eq!(
        http::metric(&m, "treegrpo_kv_blocks{state=\"free\"}"),
        http::metric(&m, "treegrpo_kv_blocks{state=\"total\"}")
    );
}

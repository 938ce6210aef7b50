//! vLLM's sampling extensions through `treegrpo serve` on `127.0.0.1:0`, over plain
//! HTTP: `logprobs: N` alternatives against the full distribution recomputed from the
//! model, the repetition penalty against the single-sequence path run with the same
//! penalty, min-p at its limit against greedy, token ids spelt `"token_id:N"`, and
//! unknown or out-of-range fields refused with a 400 naming them.

mod common;

use common::http;
use common::server::{floats, greedy_oracle, ids, ok, serve};
use common::single_sequence::{generate, GenerateRequest};
use common::tiny::logits_all;
use serde_json::{json, Value};
use treegrpo::engine::{Penalties, Sampling};
use treegrpo::model::LoadedModel;

const PROMPT: [u32; 6] = [40, 41, 42, 100, 101, 7];

/// The log-softmax of `logits / t`, in f64.
fn log_softmax(logits: &[f32], t: f64) -> Vec<f64> {
    let max = logits.iter().fold(f64::MIN, |m, &l| m.max(l as f64 / t));
    let lse = max
        + logits
            .iter()
            .map(|&l| (l as f64 / t - max).exp())
            .sum::<f64>()
            .ln();
    logits.iter().map(|&l| l as f64 / t - lse).collect()
}

/// The model's `n` most likely next tokens after `context` at temperature `t`.
fn top_n(m: &LoadedModel, context: &[u32], t: f64, n: usize) -> Vec<(u32, f64)> {
    let rows = logits_all(m, context);
    let lp = log_softmax(rows.last().unwrap(), t);
    let mut idx: Vec<usize> = (0..lp.len()).collect();
    idx.sort_by(|&a, &b| lp[b].total_cmp(&lp[a]).then(a.cmp(&b)));
    idx.into_iter().take(n).map(|i| (i as u32, lp[i])).collect()
}

fn token_id(spelt: &str) -> u32 {
    spelt
        .strip_prefix("token_id:")
        .unwrap_or_else(|| panic!("not a token_id:N string: {spelt}"))
        .parse()
        .unwrap()
}

#[test]
fn logprobs_n_are_the_top_n_of_the_full_distribution() {
    let f = serve();
    for temperature in [0.0, 0.7] {
        let got = ok(http::post(
            f.server.addr,
            "/v1/completions",
            &json!({"prompt": PROMPT, "max_tokens": 5, "temperature": temperature,
                    "seed": 3, "logprobs": 3, "return_token_ids": true,
                    "return_tokens_as_token_ids": true}),
        ));
        let choice = &got["choices"][0];
        let tokens = ids(&choice["token_ids"]);
        let logprobs = &choice["logprobs"];
        let t = if temperature == 0.0 { 1.0 } else { temperature };
        let spelt: Vec<u32> = logprobs["tokens"]
            .as_array()
            .unwrap()
            .iter()
            .map(|s| token_id(s.as_str().unwrap()))
            .collect();
        assert_eq!(spelt, tokens, "tokens spelt token_id:N");
        let top = logprobs["top_logprobs"].as_array().unwrap();
        assert_eq!(top.len(), tokens.len());
        for (i, alternatives) in top.iter().enumerate() {
            let mut context = PROMPT.to_vec();
            context.extend(&tokens[..i]);
            let want = top_n(&f.model, &context, t, 3);
            let alternatives = alternatives.as_object().unwrap();
            assert_eq!(alternatives.len(), 3, "position {i}");
            for (token, logprob) in want {
                let got = alternatives[&format!("token_id:{token}")].as_f64().unwrap();
                assert!(
                    (got - logprob).abs() < 1e-4,
                    "T {t}, position {i}, token {token}: {got} vs {logprob}"
                );
            }
            // The sampled token's own logprob is under the same distribution.
            let all = log_softmax(logits_all(&f.model, &context).last().unwrap(), t);
            let sampled = floats(&logprobs["token_logprobs"])[i] as f64;
            assert!((sampled - all[tokens[i] as usize]).abs() < 1e-4);
        }
    }
    // Chat: `logprobs: true, top_logprobs: 2` gives two entries per token.
    let got = ok(http::post(
        f.server.addr,
        "/v1/chat/completions",
        &json!({"messages": [{"role": "user", "content": "hi"}], "max_tokens": 3,
                "temperature": 0, "logprobs": true, "top_logprobs": 2}),
    ));
    for entry in got["choices"][0]["logprobs"]["content"].as_array().unwrap() {
        let alts = entry["top_logprobs"].as_array().unwrap();
        assert_eq!(alts.len(), 2);
        assert!(alts[0]["logprob"].as_f64() >= alts[1]["logprob"].as_f64());
    }
}

#[test]
fn repetition_penalty_changes_a_greedy_continuation_as_the_single_sequence_path_does() {
    let f = serve();
    let repetitive: Vec<u32> = [40u32, 41, 42, 43].repeat(6);
    let body = |penalty: f64| {
        json!({"prompt": repetitive, "max_tokens": 16, "temperature": 0, "logprobs": 0,
               "repetition_penalty": penalty, "return_token_ids": true, "ignore_eos": true})
    };
    let plain = ok(http::post(f.server.addr, "/v1/completions", &body(1.0)));
    let penalised = ok(http::post(f.server.addr, "/v1/completions", &body(1.8)));
    let plain_tokens = ids(&plain["choices"][0]["token_ids"]);
    let penalised_tokens = ids(&penalised["choices"][0]["token_ids"]);
    let (oracle, _) = greedy_oracle(&f.model.model, &repetitive, 16, &[]);
    assert_eq!(plain_tokens, oracle);
    assert_ne!(
        penalised_tokens, plain_tokens,
        "the penalty must change the choice"
    );
    // The batched engine and the single-sequence path apply the same penalty.
    let single = generate(
        &f.model.model,
        &GenerateRequest {
            prompt: repetitive.clone(),
            max_new_tokens: 16,
            sampling: Sampling::Greedy,
            seed: 0,
            stop_tokens: Vec::new(),
            prefill_chunk: 512,
            penalties: Penalties::new(1.8, 0.0, 0.0).unwrap(),
        },
    )
    .unwrap();
    let single_tokens: Vec<u32> = single.tokens.iter().map(|t| t.token).collect();
    assert_eq!(penalised_tokens, single_tokens);
    // The logprobs reported are the model's own, unpenalised.
    let lps = floats(&penalised["choices"][0]["logprobs"]["token_logprobs"]);
    for (i, &t) in penalised_tokens.iter().enumerate() {
        let mut context = repetitive.clone();
        context.extend(&penalised_tokens[..i]);
        let all = log_softmax(logits_all(&f.model, &context).last().unwrap(), 1.0);
        assert!(
            (lps[i] as f64 - all[t as usize]).abs() < 1e-4,
            "position {i}"
        );
    }
    // Presence and frequency penalties are served too (and change the choice).
    let both = ok(http::post(
        f.server.addr,
        "/v1/completions",
        &json!({"prompt": repetitive, "max_tokens": 16, "temperature": 0,
                "presence_penalty": 2.0, "frequency_penalty": 2.0,
                "return_token_ids": true, "ignore_eos": true}),
    ));
    assert_ne!(ids(&both["choices"][0]["token_ids"]), plain_tokens);
}

#[test]
fn min_p_one_is_greedy_at_any_temperature() {
    let f = serve();
    let got = ok(http::post(
        f.server.addr,
        "/v1/completions",
        &json!({"prompt": PROMPT, "max_tokens": 12, "temperature": 3.0, "min_p": 1.0,
                "n": 4, "seed": 11, "return_token_ids": true, "ignore_eos": true}),
    ));
    let (greedy, _) = greedy_oracle(&f.model.model, &PROMPT, 12, &[]);
    for choice in got["choices"].as_array().unwrap() {
        assert_eq!(ids(&choice["token_ids"]), greedy);
    }
    // Without min-p the same request leaves the greedy path.
    let free = ok(http::post(
        f.server.addr,
        "/v1/completions",
        &json!({"prompt": PROMPT, "max_tokens": 12, "temperature": 3.0,
                "n": 4, "seed": 11, "return_token_ids": true, "ignore_eos": true}),
    ));
    assert!(free["choices"]
        .as_array()
        .unwrap()
        .iter()
        .any(|c| ids(&c["token_ids"]) != greedy));
}

fn refused(reply: http::Reply, param: &str) -> Value {
    assert_eq!(reply.status, 400, "{}", reply.text());
    let body = reply.json();
    assert_eq!(body["error"]["param"], param, "{body}");
    body
}

#[test]
fn unknown_and_out_of_range_fields_are_400_naming_them() {
    let f = serve();
    let a = f.server.addr;
    let body = refused(
        http::post(
            a,
            "/v1/completions",
            &json!({"prompt": PROMPT, "mirostat": 1}),
        ),
        "mirostat",
    );
    assert!(body["error"]["message"]
        .as_str()
        .unwrap()
        .contains("unknown field `mirostat`"));
    refused(
        http::post(
            a,
            "/v1/chat/completions",
            &json!({"messages": [{"role": "user", "content": "hi"}], "repetition_penallty": 1.2}),
        ),
        "repetition_penallty",
    );
    refused(
        http::post(
            a,
            "/generate",
            &json!({"input_ids": PROMPT, "sampling_params": {"max_new_tokens": 2, "typo": 1}}),
        ),
        "sampling_params.typo",
    );
    for (field, value) in [
        ("repetition_penalty", json!(0.0)),
        ("presence_penalty", json!(3.0)),
        ("frequency_penalty", json!(-2.5)),
        ("min_p", json!(1.5)),
        ("temperature", json!(-1.0)),
        ("top_p", json!(0.0)),
    ] {
        let mut req = json!({"prompt": PROMPT, "max_tokens": 2});
        req[field] = value;
        refused(http::post(a, "/v1/completions", &req), field);
    }
    refused(
        http::post(
            a,
            "/v1/completions",
            &json!({"prompt": PROMPT, "max_tokens": 2, "logprobs": 21}),
        ),
        "top_logprobs",
    );
    refused(
        http::post(
            a,
            "/v1/completions",
            &json!({"prompt": PROMPT, "max_tokens": 2, "logprobs": 2, "stream": true}),
        ),
        "top_logprobs",
    );
    // OpenAI fields documented as accepted and ignored.
    ok(http::post(
        a,
        "/v1/completions",
        &json!({"model": "tiny", "user": "me", "prompt": PROMPT, "max_tokens": 2}),
    ));
}

/// One rule for a search's options: the server answers `keep: 0` and a negative
/// temperature with the library's own words (`TreeConfig::validate`,
/// `Sampling::new`), naming the field, before any rollout starts.
#[test]
fn rollout_options_are_refused_with_the_librarys_words() {
    let f = serve();
    let want_keep = treegrpo::rollout::TreeConfigError::KeepZero.to_string();
    let body = refused(
        http::post(
            f.server.addr,
            "/v1/rollouts",
            &json!({"task": "calc", "prompts": 1, "keep": 0}),
        ),
        "keep",
    );
    assert!(body["error"]["message"]
        .as_str()
        .unwrap()
        .contains(&want_keep));
    for t in [-1.0, -0.5] {
        let body = refused(
            http::post(
                f.server.addr,
                "/v1/rollouts",
                &json!({"task": "calc", "prompts": 1, "temperature": t}),
            ),
            "temperature",
        );
        let want = treegrpo::engine::SamplingError::Temperature(t as f32).to_string();
        assert!(body["error"]["message"].as_str().unwrap().contains(&want));
    }
}

/// vLLM's `min_tokens` on each generating endpoint: with the greedy first token as a
/// stop token the choice ends at once; with `min_tokens: 5` that token is kept out of
/// the first five, and `min_tokens` above the limit is a 400 naming it.
#[test]
fn min_tokens_holds_off_the_stop_tokens_on_every_endpoint() {
    let f = serve();
    let prompt: Vec<u32> = [40u32, 41, 42, 43].repeat(3);
    let (greedy, _) = greedy_oracle(&f.model.model, &prompt, 8, &[]);
    let first = greedy[0];
    let completion = |min_tokens: u64| {
        ok(http::post(
            f.server.addr,
            "/v1/completions",
            &json!({"prompt": prompt, "max_tokens": 8, "temperature": 0,
                    "stop_token_ids": [first], "min_tokens": min_tokens,
                    "return_token_ids": true}),
        ))
    };
    let at_once = completion(0);
    assert_eq!(ids(&at_once["choices"][0]["token_ids"]), Vec::<u32>::new());
    assert_eq!(at_once["choices"][0]["finish_reason"], "stop");
    let held = ids(&completion(5)["choices"][0]["token_ids"]);
    assert!(held.len() >= 5 && !held[..5].contains(&first), "{held:?}");

    // SGLang's /generate reads it from sampling_params, the same rule.
    let native = ok(http::post(
        f.server.addr,
        "/generate",
        &json!({"input_ids": prompt, "sampling_params": {"max_new_tokens": 8,
                "temperature": 0, "stop_token_ids": [first], "min_tokens": 5}}),
    ));
    let native_ids = ids(&native["output_ids"]);
    assert_eq!(
        native_ids, held,
        "the same generation through both endpoints"
    );

    let too_many = http::post(
        f.server.addr,
        "/v1/completions",
        &json!({"prompt": prompt, "max_tokens": 4, "min_tokens": 5}),
    );
    refused(too_many, "min_tokens");
}

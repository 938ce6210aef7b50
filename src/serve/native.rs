//! `POST /generate`: token-in/token-out in SGLang's native shape (`input_ids` or
//! `text`, `sampling_params`, `return_logprob`; `output_ids` and `meta_info`), the
//! convention slime, AReaL and verl's SGLang rollouts speak.

use axum::extract::State;
use axum::Json;
use futures_util::future::try_join_all;
use serde::Deserialize;
use serde_json::{json, Value};

use crate::model::TokenId;

use super::blocking::off_the_workers;
use super::body::{token_ids, ApiJson};
use super::error::ServeError;
use super::known_fields::{first_unknown, KnownFields};
use super::limits;
use super::run::complete;
use super::sampling::{finish_reason, visible_text, SamplingFields};
use super::state::AppState;

/// SGLang's default `max_new_tokens`.
const DEFAULT_NEW_TOKENS: usize = 128;

/// One input or a batch of them.
#[derive(Debug, Deserialize)]
#[serde(untagged)]
enum Many<T> {
    One(T),
    Batch(Vec<T>),
}

#[derive(Debug, Default, Deserialize)]
#[serde(default)]
struct SamplingParams {
    #[serde(flatten)]
    fields: SamplingFields,
    /// Choices per input.
    n: Option<usize>,
}

/// The JSON body of `POST /generate` in SGLang's shape: `text` or `input_ids` (one
/// input or a batch), `sampling_params`, `return_logprob`, `stream`, `rid`. A field
/// it does not know is a 400 naming it.
#[derive(Debug, Deserialize)]
pub struct GenerateRequest {
    #[serde(default)]
    text: Option<Many<String>>,
    #[serde(default)]
    input_ids: Option<Many<Vec<i64>>>,
    #[serde(default)]
    sampling_params: SamplingParams,
    #[serde(default)]
    return_logprob: bool,
    #[serde(default)]
    stream: bool,
    /// The caller's request id, echoed in `meta_info.id`.
    #[serde(default)]
    rid: Option<String>,
}

/// How many inputs the request holds (before any is tokenised).
fn input_count(req: &GenerateRequest) -> usize {
    fn count<T>(m: &Many<T>) -> usize {
        match m {
            Many::One(_) => 1,
            Many::Batch(b) => b.len(),
        }
    }
    req.text
        .as_ref()
        .map(count)
        .or(req.input_ids.as_ref().map(count))
        .unwrap_or(1)
}

/// Inputs as token ids, and whether the request was a batch.
fn inputs(
    state: &AppState,
    text: Option<Many<String>>,
    input_ids: Option<Many<Vec<i64>>>,
) -> Result<(Vec<Vec<TokenId>>, bool), ServeError> {
    let vocab = state.vocab();
    let (inputs, batch) = match (&text, &input_ids) {
        (Some(_), Some(_)) => {
            return Err(ServeError::invalid(
                "input_ids",
                "give either `text` or `input_ids`, not both",
            ))
        }
        (None, None) => {
            return Err(ServeError::invalid(
                "input_ids",
                "`text` or `input_ids` is needed",
            ))
        }
        (Some(Many::One(t)), None) => (vec![state.model.tokenizer.encode(t, true)?], false),
        (Some(Many::Batch(ts)), None) => (
            ts.iter()
                .map(|t| state.model.tokenizer.encode(t, true))
                .collect::<Result<_, _>>()?,
            true,
        ),
        (None, Some(Many::One(ids))) => (vec![token_ids("input_ids", ids, vocab)?], false),
        (None, Some(Many::Batch(b))) => (
            b.iter()
                .map(|ids| token_ids("input_ids", ids, vocab))
                .collect::<Result<_, _>>()?,
            true,
        ),
    };
    if inputs.is_empty() || inputs.iter().any(Vec::is_empty) {
        return Err(ServeError::invalid(
            "input_ids",
            "every input needs at least one token",
        ));
    }
    Ok((inputs, batch))
}

/// `POST /generate`: one output object per input and choice; a single input with one
/// choice answers with the object itself, anything else with a list.
pub async fn generate(
    State(state): State<AppState>,
    ApiJson(mut req): ApiJson<GenerateRequest>,
) -> Result<Json<Value>, ServeError> {
    if req.stream {
        return Err(ServeError::invalid(
            "stream",
            "streaming is served on /v1/completions and /v1/chat/completions",
        ));
    }
    let choices = match req.sampling_params.n.unwrap_or(1) {
        0 => return Err(ServeError::invalid("n", "at least 1 choice is needed")),
        n => n,
    };
    limits::check_rid(req.rid.as_deref())?;
    // Before any input is tokenised and any choice's params built: a request that
    // could never run is refused.
    let sequences = limits::request_sequences(&state, input_count(&req), "input_ids", choices)?;
    let (text, input_ids) = (req.text.take(), req.input_ids.take());
    let (prompts, batch) = off_the_workers(&state, move |s| inputs(s, text, input_ids)).await?;
    let mut fields = req.sampling_params.fields.clone();
    fields.max_new_tokens = Some(fields.max_new_tokens.unwrap_or(DEFAULT_NEW_TOKENS));
    let seed = fields.seed_or_fresh(&state);
    let params = prompts
        .iter()
        .enumerate()
        .map(|(p, prompt)| {
            (0..choices)
                .map(|j| fields.gen_params(&state, prompt.len(), seed, p * choices + j))
                .collect::<Result<Vec<_>, _>>()
        })
        .collect::<Result<Vec<_>, _>>()?;
    let permit = state.admission.admit(sequences).await?;
    let done = try_join_all(
        prompts
            .iter()
            .zip(params)
            .map(|(prompt, params)| complete(&state, prompt, params)),
    )
    .await?;
    drop(permit);
    let stops = fields.stop_strings();
    let rid = req.rid.clone().unwrap_or_else(|| state.request_id("gen"));
    let mut outputs = Vec::new();
    for (p, completed) in done.iter().enumerate() {
        for g in &completed.generations {
            let text = visible_text(&state.model.tokenizer.decode(&g.tokens)?, &stops);
            let mut meta = json!({
                "id": rid,
                "finish_reason": { "type": finish_reason(g.stop) },
                "prompt_tokens": prompts[p].len(),
                "completion_tokens": g.tokens.len(),
                "cached_tokens": completed.cached_tokens,
                "weight_version": g.weight_version,
            });
            if req.return_logprob {
                meta["output_token_logprobs"] = g
                    .tokens
                    .iter()
                    .zip(&g.logprobs)
                    .map(|(&t, &lp)| json!([lp, t, Value::Null]))
                    .collect();
            }
            outputs.push(json!({
                "text": text,
                "output_ids": g.tokens,
                "meta_info": meta,
            }));
        }
    }
    Ok(Json(if batch || choices > 1 {
        Value::Array(outputs)
    } else {
        outputs.pop().expect("one input gives one output")
    }))
}

impl KnownFields for GenerateRequest {
    fn unknown_field(body: &serde_json::Value) -> Option<String> {
        let own = [
            "text",
            "input_ids",
            "sampling_params",
            "return_logprob",
            "stream",
            "rid",
        ];
        first_unknown(body, "", &[&own]).or_else(|| {
            first_unknown(
                body.get("sampling_params")?,
                "sampling_params.",
                &[SamplingFields::fields(), &["n"]],
            )
        })
    }
}

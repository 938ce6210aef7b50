//! OpenAI-compatible endpoints, what TRL's async GRPO worker, prime-rl and verifiers
//! call through the `openai` package: `GET /v1/models`, `POST /v1/completions` and
//! `POST /v1/chat/completions`, with vLLM's `return_token_ids` extension (the token
//! ids a trainer needs, so it never re-tokenises text).
//!
//! Logprobs are natural-log probabilities of the sampled tokens under the sampling
//! temperature, over the whole vocabulary (see `engine::sampling`); alternatives
//! (`top_logprobs`) are not computed: completions give `null`, chat an empty list.

use axum::extract::State;
use axum::response::{IntoResponse, Response};
use axum::Json;
use futures_util::future::try_join_all;
use serde::Deserialize;
use serde_json::{json, Value};

use crate::engine::Generation;
use crate::model::TokenId;

use super::body::{chat_prompt, token_ids, ApiJson, MessageInput, OneOrMany, PromptInput};
use super::error::ServeError;
use super::run::complete;
use super::sampling::{finish_reason, visible_text, SamplingFields};
use super::state::{unix_now, AppState};
use super::stream::{stream_chat, stream_completion};

/// OpenAI's default `max_tokens` of a completion.
const DEFAULT_COMPLETION_TOKENS: usize = 16;
/// Most choices per prompt (`n`).
const MAX_CHOICES: usize = 128;

/// `GET /v1/models`: the one model served.
pub async fn models(State(state): State<AppState>) -> Json<Value> {
    Json(json!({
        "object": "list",
        "data": [{
            "id": state.config.model_name,
            "object": "model",
            "created": unix_now(),
            "owned_by": "treegrpo",
            "max_model_len": state.max_positions(),
        }]
    }))
}

/// Fields both OpenAI endpoints take.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(default)]
struct CommonFields {
    temperature: Option<f32>,
    top_p: Option<f32>,
    top_k: Option<i64>,
    n: Option<usize>,
    seed: Option<u64>,
    stop: Option<OneOrMany>,
    stream: bool,
    stream_options: Option<StreamOptions>,
    /// vLLM's extension: the prompt's and each choice's token ids.
    return_token_ids: bool,
    stop_token_ids: Vec<i64>,
    ignore_eos: bool,
    presence_penalty: Option<f32>,
    frequency_penalty: Option<f32>,
    logit_bias: Option<serde_json::Map<String, Value>>,
}

#[derive(Debug, Clone, Default, Deserialize)]
pub struct StreamOptions {
    #[serde(default)]
    pub include_usage: bool,
}

impl CommonFields {
    fn choices(&self) -> Result<usize, ServeError> {
        match self.n.unwrap_or(1) {
            0 => Err(ServeError::invalid("n", "at least 1 choice is needed")),
            n if n > MAX_CHOICES => Err(ServeError::invalid(
                "n",
                format!("at most {MAX_CHOICES} choices per prompt"),
            )),
            n => Ok(n),
        }
    }

    /// Options that would change the distribution in ways this engine does not
    /// implement are refused, never silently ignored.
    fn refuse_unsupported(&self) -> Result<(), ServeError> {
        if self.presence_penalty.is_some_and(|p| p != 0.0) {
            return Err(ServeError::invalid(
                "presence_penalty",
                "not supported (use 0)",
            ));
        }
        if self.frequency_penalty.is_some_and(|p| p != 0.0) {
            return Err(ServeError::invalid(
                "frequency_penalty",
                "not supported (use 0)",
            ));
        }
        if self.logit_bias.as_ref().is_some_and(|b| !b.is_empty()) {
            return Err(ServeError::invalid("logit_bias", "not supported"));
        }
        Ok(())
    }

    fn sampling(&self, max_tokens: Option<usize>) -> SamplingFields {
        SamplingFields {
            max_new_tokens: max_tokens,
            temperature: self.temperature,
            top_p: self.top_p,
            top_k: self.top_k,
            stop: self.stop.clone(),
            stop_token_ids: self.stop_token_ids.clone(),
            ignore_eos: self.ignore_eos,
            seed: self.seed,
        }
    }

    pub fn include_usage(&self) -> bool {
        self.stream_options
            .as_ref()
            .is_some_and(|o| o.include_usage)
    }
}

#[derive(Debug, Deserialize)]
pub struct CompletionRequest {
    prompt: PromptInput,
    #[serde(default)]
    max_tokens: Option<usize>,
    /// Return each sampled token's logprob (any value ≥ 0; alternatives are not
    /// computed).
    #[serde(default)]
    logprobs: Option<u32>,
    #[serde(default)]
    echo: bool,
    #[serde(default)]
    best_of: Option<usize>,
    #[serde(default)]
    suffix: Option<String>,
    #[serde(flatten)]
    common: CommonFields,
}

/// A prepared request: prompts as token ids, the sampling fields, the seed.
pub struct Prepared {
    pub prompts: Vec<Vec<TokenId>>,
    pub choices: usize,
    pub sampling: SamplingFields,
    pub seed: u64,
    pub logprobs: bool,
    pub return_token_ids: bool,
    pub include_usage: bool,
    pub id: String,
    pub created: u64,
}

impl Prepared {
    /// Engine params of every choice of prompt `p`, choices seeded apart.
    pub fn params(
        &self,
        state: &AppState,
        p: usize,
    ) -> Result<Vec<crate::engine::GenParams>, ServeError> {
        (0..self.choices)
            .map(|j| {
                self.sampling.gen_params(
                    state,
                    self.prompts[p].len(),
                    self.seed,
                    p * self.choices + j,
                )
            })
            .collect()
    }
}

fn completion_prompts(
    state: &AppState,
    prompt: &PromptInput,
) -> Result<Vec<Vec<TokenId>>, ServeError> {
    let vocab = state.vocab();
    let encode = |t: &str| state.model.tokenizer.encode_prompt(t);
    let prompts = match prompt {
        PromptInput::Text(t) => vec![encode(t)?],
        PromptInput::Texts(ts) => ts.iter().map(|t| encode(t)).collect::<Result<_, _>>()?,
        PromptInput::Ids(ids) => vec![token_ids("prompt", ids, vocab)?],
        PromptInput::Batch(b) => b
            .iter()
            .map(|ids| token_ids("prompt", ids, vocab))
            .collect::<Result<_, _>>()?,
    };
    if prompts.is_empty() {
        return Err(ServeError::invalid(
            "prompt",
            "at least one prompt is needed",
        ));
    }
    if prompts.iter().any(Vec::is_empty) {
        return Err(ServeError::invalid(
            "prompt",
            "a prompt needs at least one token",
        ));
    }
    Ok(prompts)
}

/// `POST /v1/completions`.
pub async fn completions(
    State(state): State<AppState>,
    ApiJson(req): ApiJson<CompletionRequest>,
) -> Result<Response, ServeError> {
    req.common.refuse_unsupported()?;
    if req.echo {
        return Err(ServeError::invalid(
            "echo",
            "not supported (the prompt's ids are in `prompt_token_ids` with `return_token_ids`)",
        ));
    }
    if req.suffix.as_deref().is_some_and(|s| !s.is_empty()) {
        return Err(ServeError::invalid("suffix", "not supported"));
    }
    let choices = req.common.choices()?;
    if req.best_of.is_some_and(|b| b != choices) {
        return Err(ServeError::invalid(
            "best_of",
            "only best_of = n is supported",
        ));
    }
    let sampling = req
        .common
        .sampling(Some(req.max_tokens.unwrap_or(DEFAULT_COMPLETION_TOKENS)));
    let prepared = Prepared {
        prompts: completion_prompts(&state, &req.prompt)?,
        choices,
        seed: sampling.seed_or_fresh(&state),
        sampling,
        logprobs: req.logprobs.is_some(),
        return_token_ids: req.common.return_token_ids,
        include_usage: req.common.include_usage(),
        id: state.request_id("cmpl"),
        created: unix_now(),
    };
    // Every prompt's params are checked before any work starts.
    let params = (0..prepared.prompts.len())
        .map(|p| prepared.params(&state, p))
        .collect::<Result<Vec<_>, _>>()?;
    if req.common.stream {
        return stream_completion(state, prepared, params).await;
    }
    let done = try_join_all(
        prepared
            .prompts
            .iter()
            .zip(params)
            .map(|(prompt, params)| complete(&state, prompt, params)),
    )
    .await?;
    let stops = prepared.sampling.stop_strings();
    let mut choices_out = Vec::new();
    let mut usage = Usage::default();
    for (p, completed) in done.iter().enumerate() {
        usage.add_prompt(prepared.prompts[p].len(), completed.cached_tokens);
        for (j, g) in completed.generations.iter().enumerate() {
            usage.completion_tokens += g.tokens.len();
            let text = visible_text(&decode(&state, &g.tokens)?, &stops);
            let mut choice = json!({
                "index": p * prepared.choices + j,
                "text": text,
                "logprobs": if prepared.logprobs {
                    completion_logprobs(&state, g)?
                } else {
                    Value::Null
                },
                "finish_reason": finish_reason(g.stop),
                "stop_reason": Value::Null,
            });
            if prepared.return_token_ids {
                choice["token_ids"] = json!(g.tokens);
                choice["prompt_token_ids"] = json!(prepared.prompts[p]);
            }
            choices_out.push(choice);
        }
    }
    Ok(Json(json!({
        "id": prepared.id,
        "object": "text_completion",
        "created": prepared.created,
        "model": state.config.model_name,
        "choices": choices_out,
        "usage": usage.to_json(),
        "weight_version": weight_version(&done),
    }))
    .into_response())
}

#[derive(Debug, Deserialize)]
pub struct ChatRequest {
    messages: Vec<MessageInput>,
    #[serde(default)]
    max_tokens: Option<usize>,
    #[serde(default)]
    max_completion_tokens: Option<usize>,
    #[serde(default)]
    logprobs: bool,
    /// Accepted for compatibility; alternatives are not computed (empty lists).
    #[serde(default)]
    #[allow(dead_code)]
    top_logprobs: Option<u32>,
    #[serde(flatten)]
    common: CommonFields,
}

/// `POST /v1/chat/completions`: the messages rendered with the model's own chat
/// template, the reply up to its end-of-turn token.
pub async fn chat_completions(
    State(state): State<AppState>,
    ApiJson(req): ApiJson<ChatRequest>,
) -> Result<Response, ServeError> {
    req.common.refuse_unsupported()?;
    let prompt = chat_prompt(&state, &req.messages)?;
    let sampling = req
        .common
        .sampling(req.max_completion_tokens.or(req.max_tokens));
    let prepared = Prepared {
        prompts: vec![prompt],
        choices: req.common.choices()?,
        seed: sampling.seed_or_fresh(&state),
        sampling,
        logprobs: req.logprobs,
        return_token_ids: req.common.return_token_ids,
        include_usage: req.common.include_usage(),
        id: state.request_id("chatcmpl"),
        created: unix_now(),
    };
    let params = prepared.params(&state, 0)?;
    if req.common.stream {
        return stream_chat(state, prepared, params).await;
    }
    let done = complete(&state, &prepared.prompts[0], params).await?;
    let stops = prepared.sampling.stop_strings();
    let mut usage = Usage::default();
    usage.add_prompt(prepared.prompts[0].len(), done.cached_tokens);
    let mut choices_out = Vec::new();
    for (j, g) in done.generations.iter().enumerate() {
        usage.completion_tokens += g.tokens.len();
        let mut choice = json!({
            "index": j,
            "message": {
                "role": "assistant",
                "content": visible_text(&decode(&state, &g.tokens)?, &stops),
            },
            "logprobs": if prepared.logprobs {
                json!({ "content": chat_logprobs(&state, &g.tokens, &g.logprobs)? })
            } else {
                Value::Null
            },
            "finish_reason": finish_reason(g.stop),
            "stop_reason": Value::Null,
        });
        if prepared.return_token_ids {
            choice["token_ids"] = json!(g.tokens);
        }
        choices_out.push(choice);
    }
    let mut body = json!({
        "id": prepared.id,
        "object": "chat.completion",
        "created": prepared.created,
        "model": state.config.model_name,
        "choices": choices_out,
        "usage": usage.to_json(),
        "weight_version": weight_version(std::slice::from_ref(&done)),
    });
    if prepared.return_token_ids {
        body["prompt_token_ids"] = json!(prepared.prompts[0]);
    }
    Ok(Json(body).into_response())
}

/// The highest weight version any choice was sampled under.
fn weight_version(done: &[super::run::Completed]) -> u64 {
    done.iter()
        .flat_map(|c| c.generations.iter().map(|g| g.weight_version))
        .max()
        .unwrap_or(0)
}

/// Token counts of a response (OpenAI's `usage`).
#[derive(Debug, Default, Clone, Copy)]
pub struct Usage {
    pub prompt_tokens: usize,
    pub completion_tokens: usize,
    pub cached_tokens: u64,
}

impl Usage {
    pub fn add_prompt(&mut self, tokens: usize, cached: u64) {
        self.prompt_tokens += tokens;
        self.cached_tokens += cached;
    }

    pub fn to_json(self) -> Value {
        json!({
            "prompt_tokens": self.prompt_tokens,
            "completion_tokens": self.completion_tokens,
            "total_tokens": self.prompt_tokens + self.completion_tokens,
            "prompt_tokens_details": { "cached_tokens": self.cached_tokens },
        })
    }
}

pub fn decode(state: &AppState, tokens: &[TokenId]) -> Result<String, ServeError> {
    Ok(state.model.tokenizer.decode(tokens)?)
}

/// Completions' `logprobs`: token strings, their logprobs and text offsets.
pub fn completion_logprobs(state: &AppState, g: &Generation) -> Result<Value, ServeError> {
    completion_logprobs_from(state, &g.tokens, &g.logprobs, 0)
}

/// [`completion_logprobs`] of a slice of a generation whose text so far is
/// `offset` bytes long (streaming).
pub fn completion_logprobs_from(
    state: &AppState,
    tokens: &[TokenId],
    logprobs: &[f32],
    offset: usize,
) -> Result<Value, ServeError> {
    let mut strings = Vec::with_capacity(tokens.len());
    let mut offsets = Vec::with_capacity(tokens.len());
    let mut at = offset;
    for &t in tokens {
        let s = decode(state, &[t])?;
        offsets.push(at);
        at += s.len();
        strings.push(s);
    }
    Ok(json!({
        "tokens": strings,
        "token_logprobs": logprobs,
        "top_logprobs": Value::Null,
        "text_offset": offsets,
    }))
}

/// Chat's `logprobs.content`: one entry per token.
pub fn chat_logprobs(
    state: &AppState,
    tokens: &[TokenId],
    logprobs: &[f32],
) -> Result<Vec<Value>, ServeError> {
    tokens
        .iter()
        .zip(logprobs)
        .map(|(&t, &lp)| {
            let s = decode(state, &[t])?;
            Ok(json!({
                "token": s,
                "logprob": lp,
                "bytes": s.as_bytes(),
                "top_logprobs": [],
            }))
        })
        .collect()
}

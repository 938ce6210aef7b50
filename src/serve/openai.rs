//! OpenAI-compatible endpoints, what TRL's async GRPO worker, prime-rl and verifiers
//! call through the `openai` package: `GET /v1/models`, `POST /v1/completions` and
//! `POST /v1/chat/completions`, with vLLM's `return_token_ids` extension (the token
//! ids a trainer needs, so it never re-tokenises text).
//!
//! Logprobs are natural-log probabilities of the sampled tokens under the sampling
//! temperature, over the whole vocabulary (see `engine::sampling`); alternatives
//! (completions' `logprobs: N`, chat's `top_logprobs: N`) are the N most likely
//! tokens of that distribution. vLLM's sampling extensions are served: `min_p`,
//! `repetition_penalty`, `presence_penalty`, `frequency_penalty`, `top_k`,
//! `return_token_ids`, `return_tokens_as_token_ids`. A field neither endpoint reads is
//! a 400 naming it (see `known_fields`).

use axum::extract::State;
use axum::response::{IntoResponse, Response};
use axum::Json;
use futures_util::future::try_join_all;
use serde::Deserialize;
use serde_json::{json, Value};

use crate::engine::sampling_error::MAX_TOP_LOGPROBS;
use crate::engine::{Generation, SamplingError};
use crate::model::TokenId;

use super::blocking::off_the_workers;
use super::body::{chat_prompt, token_ids, ApiJson, MessageInput, OneOrMany, PromptInput};
use super::error::ServeError;
use super::known_fields::{self, first_unknown, KnownFields, ACCEPTED_IGNORED};
use super::limits::request_sequences;
use super::logprobs::{self, LoggedTokens, TokenSpelling};
use super::prepared::{decode, Prepared, Usage};
use super::run::complete;
use super::sampling::{finish_reason, sampling_error, visible_text, SamplingFields};
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
    repetition_penalty: Option<f32>,
    min_p: Option<f32>,
    /// vLLM's extension: fewest tokens before the choice may stop.
    min_tokens: Option<usize>,
    /// vLLM's extension: tokens in `logprobs` spelt `"token_id:N"`.
    return_tokens_as_token_ids: bool,
    logit_bias: Option<serde_json::Map<String, Value>>,
}

impl CommonFields {
    /// The fields this struct deserialises (its own list, see `known_fields`).
    fn fields() -> &'static [&'static str] {
        static FIELDS: std::sync::OnceLock<&'static [&'static str]> = std::sync::OnceLock::new();
        FIELDS.get_or_init(known_fields::fields_of::<CommonFields>)
    }
}

/// `stream_options` of a streamed request.
#[derive(Debug, Clone, Default, Deserialize)]
pub struct StreamOptions {
    /// `include_usage`: send a last chunk with the request's token `usage` before
    /// `[DONE]`.
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
        if self.logit_bias.as_ref().is_some_and(|b| !b.is_empty()) {
            return Err(ServeError::invalid("logit_bias", "not supported"));
        }
        Ok(())
    }

    /// The sampling fields, with `alternatives` most likely tokens reported per
    /// token (refused above the engine's limit, and when streaming).
    fn sampling(
        &self,
        max_tokens: Option<usize>,
        alternatives: usize,
    ) -> Result<SamplingFields, ServeError> {
        if alternatives > MAX_TOP_LOGPROBS {
            return Err(sampling_error(SamplingError::TopLogprobs(alternatives)));
        }
        if alternatives > 0 && self.stream {
            return Err(ServeError::invalid(
                "top_logprobs",
                "alternatives are not streamed: ask without `stream`, or for logprobs only",
            ));
        }
        Ok(SamplingFields {
            max_new_tokens: max_tokens,
            temperature: self.temperature,
            top_p: self.top_p,
            top_k: self.top_k,
            stop: self.stop.clone(),
            stop_token_ids: self.stop_token_ids.clone(),
            ignore_eos: self.ignore_eos,
            seed: self.seed,
            min_p: self.min_p,
            min_tokens: self.min_tokens,
            repetition_penalty: self.repetition_penalty,
            presence_penalty: self.presence_penalty,
            frequency_penalty: self.frequency_penalty,
            top_logprobs: alternatives,
        })
    }

    fn spelling(&self) -> TokenSpelling {
        TokenSpelling {
            as_token_ids: self.return_tokens_as_token_ids,
        }
    }

    pub fn include_usage(&self) -> bool {
        self.stream_options
            .as_ref()
            .is_some_and(|o| o.include_usage)
    }
}

/// The JSON body of `POST /v1/completions` (OpenAI's fields, vLLM's extensions);
/// a field it does not know is a 400 naming it.
#[derive(Debug, Deserialize)]
pub struct CompletionRequest {
    prompt: PromptInput,
    #[serde(default)]
    max_tokens: Option<usize>,
    /// Return each sampled token's logprob and its N most likely alternatives.
    #[serde(default)]
    logprobs: Option<usize>,
    #[serde(default)]
    echo: bool,
    #[serde(default)]
    best_of: Option<usize>,
    #[serde(default)]
    suffix: Option<String>,
    #[serde(flatten)]
    common: CommonFields,
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
    // Before any prompt is tokenised: a request that could never run is refused.
    let sequences = request_sequences(&state, req.prompt.count(), "prompt", choices)?;
    let sampling = req.common.sampling(
        Some(req.max_tokens.unwrap_or(DEFAULT_COMPLETION_TOKENS)),
        req.logprobs.unwrap_or(0),
    )?;
    let prepared = Prepared {
        prompts: {
            let prompt = req.prompt.clone();
            off_the_workers(&state, move |s| completion_prompts(s, &prompt)).await?
        },
        choices,
        seed: sampling.seed_or_fresh(&state),
        sampling,
        logprobs: req.logprobs.is_some(),
        spelling: req.common.spelling(),
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
    let permit = state.admission.admit(sequences).await?;
    let done = try_join_all(
        prepared
            .prompts
            .iter()
            .zip(params)
            .map(|(prompt, params)| complete(&state, prompt, params)),
    )
    .await?;
    drop(permit);
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
                    logprobs::completion(&state, logged(g), 0, prepared.spelling)?
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

/// The JSON body of `POST /v1/chat/completions` (OpenAI's fields, vLLM's
/// extensions); a field it does not know is a 400 naming it.
#[derive(Debug, Deserialize)]
pub struct ChatRequest {
    messages: Vec<MessageInput>,
    #[serde(default)]
    max_tokens: Option<usize>,
    #[serde(default)]
    max_completion_tokens: Option<usize>,
    #[serde(default)]
    logprobs: bool,
    /// With `logprobs`, each token's N most likely alternatives.
    #[serde(default)]
    top_logprobs: Option<usize>,
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
    let choices = req.common.choices()?;
    let sequences = request_sequences(&state, 1, "messages", choices)?;
    let messages = req.messages.clone();
    let prompt = off_the_workers(&state, move |s| chat_prompt(s, &messages)).await?;
    let alternatives = if req.logprobs {
        req.top_logprobs.unwrap_or(0)
    } else {
        0
    };
    let sampling = req
        .common
        .sampling(req.max_completion_tokens.or(req.max_tokens), alternatives)?;
    let prepared = Prepared {
        prompts: vec![prompt],
        choices,
        seed: sampling.seed_or_fresh(&state),
        sampling,
        logprobs: req.logprobs,
        spelling: req.common.spelling(),
        return_token_ids: req.common.return_token_ids,
        include_usage: req.common.include_usage(),
        id: state.request_id("chatcmpl"),
        created: unix_now(),
    };
    let params = prepared.params(&state, 0)?;
    if req.common.stream {
        return stream_chat(state, prepared, params).await;
    }
    let permit = state.admission.admit(sequences).await?;
    let done = complete(&state, &prepared.prompts[0], params).await?;
    drop(permit);
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
                json!({ "content": logprobs::chat(&state, logged(g), prepared.spelling)? })
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

/// A whole generation's tokens, logprobs and alternatives.
pub fn logged(g: &Generation) -> LoggedTokens<'_> {
    LoggedTokens {
        tokens: &g.tokens,
        logprobs: &g.logprobs,
        alternatives: &g.top_logprobs,
    }
}

impl KnownFields for CompletionRequest {
    fn unknown_field(body: &Value) -> Option<String> {
        let own = [
            "prompt",
            "max_tokens",
            "logprobs",
            "echo",
            "best_of",
            "suffix",
        ];
        first_unknown(body, "", &[&own, CommonFields::fields(), ACCEPTED_IGNORED])
    }
}

impl KnownFields for ChatRequest {
    fn unknown_field(body: &Value) -> Option<String> {
        let own = [
            "messages",
            "max_tokens",
            "max_completion_tokens",
            "logprobs",
            "top_logprobs",
        ];
        first_unknown(body, "", &[&own, CommonFields::fields(), ACCEPTED_IGNORED])
    }
}

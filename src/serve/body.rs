//! Reading request bodies: JSON of any content type into the endpoint's struct, with
//! a 400 naming the problem (line, column, field) or a 413 over the size limit; and
//! the input shapes several endpoints share (prompts as text or token ids, stop
//! strings as one or many, chat messages).

use axum::body::Bytes;
use axum::extract::{FromRequest, Request};
use axum::http::StatusCode;
use serde::de::DeserializeOwned;
use serde::Deserialize;

use crate::model::{ChatMessage, TokenId};

use super::error::ServeError;
use super::known_fields::KnownFields;
use super::state::AppState;

/// A JSON body. Unlike axum's `Json` it takes any content type (`curl -d` sends a
/// form type) and reports a bad body as a 400 in the API's error shape.
pub struct ApiJson<T>(pub T);

impl<T: DeserializeOwned + KnownFields> FromRequest<AppState> for ApiJson<T> {
    type Rejection = ServeError;

    async fn from_request(req: Request, state: &AppState) -> Result<Self, ServeError> {
        // A body sent a byte a minute must not hold the connection and its handler.
        let limit = state.config.request_timeout;
        let bytes = tokio::time::timeout(limit, Bytes::from_request(req, state))
            .await
            .map_err(|_| ServeError::BodyTimeout {
                seconds: limit.as_secs(),
            })?
            .map_err(|e| {
                if e.status() == StatusCode::PAYLOAD_TOO_LARGE {
                    ServeError::BodyTooLarge {
                        limit: state.config.max_body_bytes,
                    }
                } else {
                    ServeError::invalid("body", e.body_text())
                }
            })?;
        // An empty body reads as `{}`: endpoints whose fields all have defaults then
        // need none (`curl -X POST …/fork`).
        let bytes: &[u8] = if bytes.iter().all(u8::is_ascii_whitespace) {
            b"{}"
        } else {
            &bytes
        };
        let body: serde_json::Value = serde_json::from_slice(bytes).map_err(ServeError::Body)?;
        if let Some(field) = T::unknown_field(&body) {
            return Err(ServeError::UnknownField(field));
        }
        serde_json::from_value(body)
            .map(ApiJson)
            .map_err(ServeError::Body)
    }
}

/// A prompt as OpenAI's completions take it: text, token ids, or a batch of either.
/// Ids are read as signed integers so a negative id is a 400 naming the vocabulary,
/// not a type error.
#[derive(Debug, Clone, Deserialize)]
#[serde(untagged)]
pub enum PromptInput {
    /// One prompt as text, encoded with the model's tokenizer.
    Text(String),
    /// One prompt as token ids.
    Ids(Vec<i64>),
    /// Several prompts as text: one completion (or `n`) per prompt.
    Texts(Vec<String>),
    /// Several prompts as token ids.
    Batch(Vec<Vec<i64>>),
}

impl PromptInput {
    /// How many prompts it holds (known before any is tokenised).
    pub fn count(&self) -> usize {
        match self {
            PromptInput::Text(_) | PromptInput::Ids(_) => 1,
            PromptInput::Texts(ts) => ts.len(),
            PromptInput::Batch(b) => b.len(),
        }
    }
}

/// One string or a list of them (OpenAI's `stop`).
#[derive(Debug, Clone, Deserialize)]
#[serde(untagged)]
pub enum OneOrMany {
    /// A single stop string.
    One(String),
    /// Several stop strings; generation stops at the first one produced.
    Many(Vec<String>),
}

impl OneOrMany {
    /// The strings as a list, one or many alike.
    pub fn into_vec(self) -> Vec<String> {
        match self {
            OneOrMany::One(s) => vec![s],
            OneOrMany::Many(v) => v,
        }
    }
}

/// A chat message: `content` as a string or as OpenAI's list of parts (only text
/// parts: the model reads text).
#[derive(Debug, Clone, Deserialize)]
pub struct MessageInput {
    /// `role`: `system`, `user`, `assistant`, or whatever role the model's chat
    /// template knows.
    pub role: String,
    /// `content`: the message's text, as a string or a list of text parts.
    pub content: ContentInput,
}

/// A chat message's `content` field.
#[derive(Debug, Clone, Deserialize)]
#[serde(untagged)]
pub enum ContentInput {
    /// The whole text as one string.
    Text(String),
    /// A list of parts (`[{"type": "text", "text": "..."}]`), joined in order.
    Parts(Vec<ContentPart>),
}

/// One element of a `content` list: only `{"type": "text", "text": ...}` parts
/// are accepted; any other type is a 400.
#[derive(Debug, Clone, Deserialize)]
pub struct ContentPart {
    /// `type`: the part's kind; only `text` is supported.
    #[serde(rename = "type")]
    pub kind: String,
    /// `text`: the part's text (required for a `text` part).
    #[serde(default)]
    pub text: Option<String>,
}

impl MessageInput {
    /// The message with its parts joined into one text; a non-text part is a 400
    /// naming `messages`.
    pub fn to_message(&self) -> Result<ChatMessage, ServeError> {
        let content = match &self.content {
            ContentInput::Text(t) => t.clone(),
            ContentInput::Parts(parts) => {
                let mut text = String::new();
                for p in parts {
                    match (p.kind.as_str(), &p.text) {
                        ("text", Some(t)) => text.push_str(t),
                        (kind, _) => {
                            return Err(ServeError::invalid(
                                "messages",
                                format!(
                                    "content parts of type '{kind}' are not supported (text only)"
                                ),
                            ))
                        }
                    }
                }
                text
            }
        };
        Ok(ChatMessage::new(self.role.clone(), content))
    }
}

/// Chat messages rendered with the model's own template, ready for the reply.
pub fn chat_prompt(
    state: &AppState,
    messages: &[MessageInput],
) -> Result<Vec<TokenId>, ServeError> {
    if messages.is_empty() {
        return Err(ServeError::invalid(
            "messages",
            "at least one message is needed",
        ));
    }
    let messages = messages
        .iter()
        .map(MessageInput::to_message)
        .collect::<Result<Vec<_>, _>>()?;
    Ok(state.model.chat_prompt(&messages)?)
}

/// Token ids from a request, each checked against the vocabulary.
pub fn token_ids(
    param: &'static str,
    ids: &[i64],
    vocab: usize,
) -> Result<Vec<TokenId>, ServeError> {
    ids.iter()
        .map(|&id| {
            u32::try_from(id)
                .ok()
                .filter(|&t| (t as usize) < vocab)
                .ok_or_else(|| {
                    ServeError::invalid(
                        param,
                        format!("token id {id} is outside the model's vocabulary of {vocab}"),
                    )
                })
        })
        .collect()
}

/// Text or token ids (SGLang's `text` / `input_ids`, the sessions' inputs): exactly
/// one of them. Text is encoded with special tokens parsed, so `<|im_start|>` in it
/// is the template's token, as a trainer writing chat turns by hand means it.
pub fn text_or_ids(
    state: &AppState,
    text: Option<&str>,
    ids: Option<&[i64]>,
) -> Result<Vec<TokenId>, ServeError> {
    match (text, ids) {
        (Some(t), None) => Ok(state.model.tokenizer.encode(t, true)?),
        (None, Some(ids)) => token_ids("input_ids", ids, state.vocab()),
        (Some(_), Some(_)) => Err(ServeError::invalid(
            "input_ids",
            "give either `text` or `input_ids`, not both",
        )),
        (None, None) => Err(ServeError::invalid(
            "input_ids",
            "`text` or `input_ids` is needed",
        )),
    }
}

//! `stream: true` on the OpenAI endpoints: server-sent events, one chunk per piece of
//! new text as tokens are sampled, the finish reason last, then `data: [DONE]`.
//!
//! Text goes out only once it is final: a token that ends inside a multi-byte
//! character waits for the rest of it, and the last bytes that could begin a stop
//! string wait until the stop is ruled out (OpenAI's text ends before the stop).
//! A client that disconnects drops the body stream, and with it the request's
//! sequences (see [`super::run::Owned`]).

use std::convert::Infallible;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use axum::response::sse::{Event, Sse};
use axum::response::{IntoResponse, Response};
use futures_util::stream::{self, select_all, BoxStream, StreamExt};
use serde_json::{json, Value};

use crate::engine::{GenParams, StopReason, TokenStream};
use crate::model::TokenId;

use super::error::{error_chain, ServeError};
use super::logprobs::{self, LoggedTokens, TokenSpelling};
use super::prepared::{decode, Prepared, Usage};
use super::run::{stream as start_streams, Started};
use super::sampling::{finish_reason, visible_text};
use super::state::AppState;

#[derive(Clone, Copy, PartialEq, Eq)]
enum Api {
    Completion,
    Chat,
}

/// `POST /v1/completions` with `stream: true`.
pub async fn stream_completion(
    state: AppState,
    prepared: Prepared,
    params: Vec<Vec<GenParams>>,
) -> Result<Response, ServeError> {
    respond(state, prepared, params, Api::Completion).await
}

/// `POST /v1/chat/completions` with `stream: true`.
pub async fn stream_chat(
    state: AppState,
    prepared: Prepared,
    params: Vec<GenParams>,
) -> Result<Response, ServeError> {
    respond(state, prepared, vec![params], Api::Chat).await
}

/// What every chunk of a response shares.
struct Frame {
    api: Api,
    id: String,
    created: u64,
    model: String,
    logprobs: bool,
    spelling: TokenSpelling,
    return_token_ids: bool,
    stops: Vec<String>,
}

impl Frame {
    fn chunk(&self, choice: Value) -> Event {
        let object = match self.api {
            Api::Completion => "text_completion",
            Api::Chat => "chat.completion.chunk",
        };
        let body = json!({
            "id": self.id,
            "object": object,
            "created": self.created,
            "model": self.model,
            "choices": [choice],
        });
        Event::default().data(body.to_string())
    }

    /// The chunk of one [`Piece`].
    fn piece(&self, state: &AppState, piece: Piece<'_>) -> Result<Event, ServeError> {
        let Piece {
            index,
            text,
            tokens,
            logprobs,
            text_offset,
            finish,
        } = piece;
        let finish = finish.map(finish_reason);
        // Alternatives are not streamed (such requests are refused).
        let logged = LoggedTokens {
            tokens,
            logprobs,
            alternatives: &[],
        };
        let mut choice = match self.api {
            Api::Completion => json!({
                "index": index,
                "text": text,
                "logprobs": if self.logprobs {
                    logprobs::completion(state, logged, text_offset, self.spelling)?
                } else {
                    Value::Null
                },
                "finish_reason": finish,
            }),
            Api::Chat => json!({
                "index": index,
                "delta": if text.is_empty() && finish.is_some() { json!({}) } else { json!({ "content": text }) },
                "logprobs": if self.logprobs {
                    json!({ "content": logprobs::chat(state, logged, self.spelling)? })
                } else {
                    Value::Null
                },
                "finish_reason": finish,
            }),
        };
        if self.return_token_ids {
            choice["token_ids"] = json!(tokens);
        }
        Ok(self.chunk(choice))
    }
}

/// New text of choice `index`, carrying `tokens` (those sampled since the last
/// chunk) and, at the end, the finish reason.
struct Piece<'a> {
    index: usize,
    text: &'a str,
    tokens: &'a [TokenId],
    logprobs: &'a [f32],
    /// Bytes of the choice's text before this piece.
    text_offset: usize,
    finish: Option<StopReason>,
}

async fn respond(
    state: AppState,
    prepared: Prepared,
    params: Vec<Vec<GenParams>>,
    api: Api,
) -> Result<Response, ServeError> {
    // Every prompt is admitted (all at once: a stream never waits on itself) and
    // started before the response begins, so a request the server cannot take still
    // gets its error status. The permit is held until the stream's end, or until it
    // is dropped with a client that went away.
    let permit = state
        .admission
        .admit(prepared.prompts.len() * prepared.choices)
        .await?;
    let mut started: Vec<Started> = Vec::new();
    let mut choice_streams: Vec<BoxStream<'static, Event>> = Vec::new();
    let frame = Arc::new(Frame {
        api,
        id: prepared.id.clone(),
        created: prepared.created,
        model: state.config.model_name.clone(),
        logprobs: prepared.logprobs,
        spelling: prepared.spelling,
        return_token_ids: prepared.return_token_ids,
        stops: prepared.sampling.stop_strings(),
    });
    let completion_tokens = Arc::new(AtomicUsize::new(0));
    for (p, (prompt, params)) in prepared.prompts.iter().zip(params).enumerate() {
        let (s, streams) = start_streams(&state, prompt, params).await?;
        started.push(s);
        for (j, tokens) in streams.into_iter().enumerate() {
            let choice = ChoiceStream {
                state: state.clone(),
                frame: frame.clone(),
                index: p * prepared.choices + j,
                stream: Some(tokens),
                tokens: Vec::new(),
                logprobs: Vec::new(),
                reported: 0,
                emitted: 0,
                text: String::new(),
                prefix_offset: 0,
                read_offset: 0,
                started: false,
                completion_tokens: completion_tokens.clone(),
            };
            choice_streams.push(stream::unfold(choice, ChoiceStream::next_event).boxed());
        }
    }
    let prompt_tokens: usize = prepared.prompts.iter().map(Vec::len).sum();
    let include_usage = prepared.include_usage;
    // After every choice: free the sequences (their usage gives the cached tokens),
    // the usage chunk if asked for, then `[DONE]`.
    let tail = stream::once(async move {
        let mut events = Vec::new();
        let mut cached = 0;
        for s in started {
            match s.owned.free_all().await {
                Ok(c) => cached += c,
                Err(e) => events.push(error_event(&e)),
            }
        }
        if include_usage {
            let usage = Usage {
                prompt_tokens,
                completion_tokens: completion_tokens.load(Ordering::SeqCst),
                cached_tokens: cached,
            };
            let body = json!({
                "id": frame.id,
                "object": match frame.api { Api::Completion => "text_completion", Api::Chat => "chat.completion.chunk" },
                "created": frame.created,
                "model": frame.model,
                "choices": [],
                "usage": usage.to_json(),
            });
            events.push(Event::default().data(body.to_string()));
        }
        events.push(Event::default().data("[DONE]"));
        drop(permit);
        stream::iter(events)
    })
    .flatten();
    let body = select_all(choice_streams)
        .chain(tail)
        .map(Ok::<Event, Infallible>);
    Ok(Sse::new(body).into_response())
}

fn error_event(e: &ServeError) -> Event {
    let body = json!({
        "error": { "message": error_chain(e), "type": "server_error", "code": e.status().as_u16() }
    });
    Event::default().data(body.to_string())
}

/// One choice's tokens becoming chunks.
struct ChoiceStream {
    state: AppState,
    frame: Arc<Frame>,
    index: usize,
    /// `None` once the generation has ended.
    stream: Option<TokenStream>,
    tokens: Vec<TokenId>,
    logprobs: Vec<f32>,
    /// Tokens already carried by a chunk.
    reported: usize,
    /// Bytes of text already sent.
    emitted: usize,
    /// The text of the tokens up to `read_offset`, decoded incrementally.
    text: String,
    /// Incremental detokenisation (vLLM's scheme): each new token is decoded with
    /// the tokens from `prefix_offset` on, and what goes past the decoded text of
    /// `prefix_offset..read_offset` is new. A window of a few tokens per step instead
    /// of the whole generation, and right for tokenizers whose decode of a suffix
    /// differs from the suffix of a decode (leading spaces, half characters).
    prefix_offset: usize,
    read_offset: usize,
    /// The chat role chunk was sent.
    started: bool,
    completion_tokens: Arc<AtomicUsize>,
}

impl ChoiceStream {
    async fn next_event(mut self) -> Option<(Event, Self)> {
        let frame = self.frame.clone();
        if frame.api == Api::Chat && !self.started {
            self.started = true;
            let role = json!({
                "index": self.index,
                "delta": { "role": "assistant", "content": "" },
                "logprobs": Value::Null,
                "finish_reason": Value::Null,
            });
            return Some((frame.chunk(role), self));
        }
        loop {
            let stream = self.stream.as_mut()?;
            match stream.next().await {
                Some(t) => {
                    self.tokens.push(t.token);
                    self.logprobs.push(t.logprob);
                    match self.piece(None) {
                        Ok(Some(event)) => return Some((event, self)),
                        Ok(None) => continue,
                        Err(e) => return Some((error_event(&e), self.ended())),
                    }
                }
                None => {
                    let stream = self.stream.take()?;
                    let event = match stream.finish().await {
                        Ok(g) => {
                            // The stream delivered every kept token; the result is
                            // the authority on them.
                            self.tokens = g.tokens;
                            self.logprobs = g.logprobs;
                            self.completion_tokens
                                .fetch_add(self.tokens.len(), Ordering::SeqCst);
                            match self.piece(Some(g.stop)) {
                                Ok(event) => event.expect("a final piece is always sent"),
                                Err(e) => error_event(&e),
                            }
                        }
                        Err(e) => error_event(&ServeError::Engine(e)),
                    };
                    return Some((event, self));
                }
            }
        }
    }

    fn ended(mut self) -> Self {
        self.stream = None;
        self
    }

    /// The chunk of text that became final, if any; at the end (`finish`), always
    /// one, carrying the rest and the finish reason.
    /// Extends `text` with what the tokens since `read_offset` add, once that is
    /// whole characters.
    fn decode_new(&mut self) -> Result<(), ServeError> {
        let window = &self.tokens[self.prefix_offset..];
        let before = decode(
            &self.state,
            &self.tokens[self.prefix_offset..self.read_offset],
        )?;
        let now = decode(&self.state, window)?;
        if now.ends_with('\u{FFFD}') {
            return Ok(()); // the last token ends inside a character: wait for more
        }
        if let Some(new) = now.strip_prefix(before.as_str()) {
            self.text.push_str(new);
            self.prefix_offset = self.read_offset;
            self.read_offset = self.tokens.len();
        }
        Ok(())
    }

    fn piece(&mut self, finish: Option<StopReason>) -> Result<Option<Event>, ServeError> {
        let ready = if finish.is_some() {
            // The whole decode, once, is the authority on the final text.
            visible_text(&decode(&self.state, &self.tokens)?, &self.frame.stops)
        } else {
            self.decode_new()?;
            settled_prefix(&self.text, &self.frame.stops).to_string()
        };
        let from = self.emitted.min(ready.len());
        if ready.len() <= self.emitted && finish.is_none() {
            return Ok(None);
        }
        let new_text = ready.get(from..).unwrap_or("");
        let event = self.frame.piece(
            &self.state,
            Piece {
                index: self.index,
                text: new_text,
                tokens: &self.tokens[self.reported..],
                logprobs: &self.logprobs[self.reported..],
                text_offset: from,
                finish,
            },
        )?;
        self.emitted = ready.len().max(self.emitted);
        self.reported = self.tokens.len();
        Ok(Some(event))
    }
}

/// The part of `text` no later token can change: without its last bytes that could
/// begin a stop string, and without a trailing replacement character (a token that
/// ended inside a multi-byte character).
fn settled_prefix<'a>(text: &'a str, stops: &[String]) -> &'a str {
    let text = text.trim_end_matches('\u{FFFD}');
    let hold = stops.iter().map(String::len).max().unwrap_or(0);
    let mut end = text.len().saturating_sub(hold);
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    &text[..end]
}

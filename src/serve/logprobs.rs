//! The `logprobs` of OpenAI's two response shapes: each sampled token's logprob and,
//! when asked for, its most likely alternatives (computed by the engine's sampler
//! from the distribution the logprob is taken under), with tokens as text or, with
//! vLLM's `return_tokens_as_token_ids`, as `"token_id:N"` strings (what TRL parses:
//! a token that is not valid UTF-8 alone survives the round trip).

use serde_json::{json, Map, Value};

use crate::engine::SampledToken;
use crate::model::TokenId;

use super::error::ServeError;
use super::state::AppState;

/// How a response spells its tokens.
#[derive(Debug, Clone, Copy, Default)]
pub struct TokenSpelling {
    /// `"token_id:N"` instead of the token's text.
    pub as_token_ids: bool,
}

impl TokenSpelling {
    fn spell(&self, state: &AppState, token: TokenId) -> Result<String, ServeError> {
        if self.as_token_ids {
            Ok(format!("token_id:{token}"))
        } else {
            Ok(state.model.tokenizer.decode(&[token])?)
        }
    }
}

/// The tokens of one piece of a generation with their logprobs and (one list per
/// token, or none) their alternatives.
#[derive(Debug, Clone, Copy)]
pub struct LoggedTokens<'a> {
    /// The sampled tokens, in order.
    pub tokens: &'a [TokenId],
    /// Each token's natural-log probability under the sampling temperature, one per
    /// token.
    pub logprobs: &'a [f32],
    /// Per token, its most likely alternatives with their logprobs; empty when none
    /// were asked for.
    pub alternatives: &'a [Vec<SampledToken>],
}

/// Completions' `logprobs`: token strings, their logprobs, the alternatives as one
/// `{token: logprob}` object per position (`null` when none were asked for) and text
/// offsets, the piece's text starting `offset` bytes into the choice's.
pub fn completion(
    state: &AppState,
    logged: LoggedTokens<'_>,
    offset: usize,
    spelling: TokenSpelling,
) -> Result<Value, ServeError> {
    let mut strings = Vec::with_capacity(logged.tokens.len());
    let mut offsets = Vec::with_capacity(logged.tokens.len());
    let mut at = offset;
    for &t in logged.tokens {
        let text = state.model.tokenizer.decode(&[t])?;
        offsets.push(at);
        at += text.len();
        strings.push(spelling.spell(state, t)?);
    }
    let top = if logged.alternatives.is_empty() {
        Value::Null
    } else {
        let per_token = logged
            .alternatives
            .iter()
            .map(|alts| {
                let mut o = Map::new();
                for a in alts {
                    o.insert(spelling.spell(state, a.token)?, json!(a.logprob));
                }
                Ok(Value::Object(o))
            })
            .collect::<Result<Vec<_>, ServeError>>()?;
        Value::Array(per_token)
    };
    Ok(json!({
        "tokens": strings,
        "token_logprobs": logged.logprobs,
        "top_logprobs": top,
        "text_offset": offsets,
    }))
}

/// Chat's `logprobs.content`: one entry per token, each with its alternatives.
pub fn chat(
    state: &AppState,
    logged: LoggedTokens<'_>,
    spelling: TokenSpelling,
) -> Result<Vec<Value>, ServeError> {
    let entry = |token: TokenId, logprob: f32| -> Result<Value, ServeError> {
        let text = state.model.tokenizer.decode(&[token])?;
        Ok(json!({
            "token": spelling.spell(state, token)?,
            "logprob": logprob,
            "bytes": text.as_bytes(),
        }))
    };
    logged
        .tokens
        .iter()
        .zip(logged.logprobs)
        .enumerate()
        .map(|(i, (&t, &lp))| {
            let mut e = entry(t, lp)?;
            let alternatives = logged
                .alternatives
                .get(i)
                .map(|alts| alts.iter().map(|a| entry(a.token, a.logprob)).collect())
                .transpose()?
                .unwrap_or_default();
            e["top_logprobs"] = Value::Array(alternatives);
            Ok(e)
        })
        .collect()
}

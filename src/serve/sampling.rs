//! Sampling fields of a request (OpenAI's, SGLang's `sampling_params`, a session's)
//! turned into the engine's [`GenParams`], each value checked, and the engine's stop
//! reasons in each API's words.

use serde::Deserialize;

use crate::engine::{GenParams, Penalties, Sampling, SamplingError, StopReason};
use crate::model::TokenId;

use super::body::OneOrMany;
use super::error::ServeError;
use super::state::AppState;

/// The sampling fields every generating endpoint takes, under SGLang's names
/// (`max_new_tokens`); the OpenAI endpoints fill it from their own names.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(default)]
pub struct SamplingFields {
    /// Most tokens to generate per choice; absent: up to the end of the context.
    pub max_new_tokens: Option<usize>,
    /// Softmax temperature, ≥ 0; 0 is greedy, absent is 1.
    pub temperature: Option<f32>,
    /// Nucleus sampling: keep the most likely tokens whose probabilities sum to `p`
    /// (in `(0, 1]`; 1 or absent: off).
    pub top_p: Option<f32>,
    /// Off when absent, 0 or -1 (vLLM's and SGLang's "no top-k").
    pub top_k: Option<i64>,
    /// Strings that end the generation; the text returned stops before them.
    /// None may be empty.
    pub stop: Option<OneOrMany>,
    /// Tokens that end the generation besides the model's end-of-turn tokens.
    pub stop_token_ids: Vec<i64>,
    /// Do not stop at the model's end-of-turn tokens.
    pub ignore_eos: bool,
    /// The RNG seed (SGLang calls it `sampling_seed`).
    #[serde(alias = "sampling_seed")]
    pub seed: Option<u64>,
    /// vLLM's min-p (0 or absent: off).
    pub min_p: Option<f32>,
    /// vLLM's penalties (1, 0, 0 or absent: off).
    pub repetition_penalty: Option<f32>,
    /// Subtracted once from the logit of every token already generated (0 or absent:
    /// off).
    pub presence_penalty: Option<f32>,
    /// Subtracted from a token's logit per time it was already generated (0 or
    /// absent: off).
    pub frequency_penalty: Option<f32>,
    /// vLLM's `min_tokens`: fewest tokens before a stop token or string may end the
    /// generation (0 or absent: off; at most `max_new_tokens`).
    pub min_tokens: Option<usize>,
    /// Alternatives per token (the OpenAI endpoints set it from `logprobs` /
    /// `top_logprobs`).
    #[serde(skip)]
    pub top_logprobs: usize,
}

impl SamplingFields {
    /// The fields of every generating endpoint's sampling parameters, under SGLang's
    /// and vLLM's names: those this struct deserialises (aliases included), read from
    /// its derived `Deserialize`, so a field added here is known at once.
    pub fn fields() -> &'static [&'static str] {
        static FIELDS: std::sync::OnceLock<&'static [&'static str]> = std::sync::OnceLock::new();
        FIELDS.get_or_init(super::known_fields::fields_of::<SamplingFields>)
    }

    /// The engine's params for choice `choice` of a prompt of `prompt_len` tokens.
    /// Without `max_new_tokens` the generation may fill the context; with it, the
    /// prompt and the tokens asked for must fit the context (400 otherwise, as vLLM
    /// answers). `default_temperature` applies when the request names none (OpenAI:
    /// 1; SGLang: 1).
    pub fn gen_params(
        &self,
        state: &AppState,
        prompt_len: usize,
        seed: u64,
        choice: usize,
    ) -> Result<GenParams, ServeError> {
        let max = state.max_positions();
        let max_new_tokens = match self.max_new_tokens {
            Some(n) if prompt_len.checked_add(n).is_none_or(|total| total > max) => {
                return Err(ServeError::ContextLength {
                    prompt: prompt_len,
                    requested: n,
                    max,
                })
            }
            Some(n) => n,
            // No room for one token: the same 400 as asking for one too many.
            None if prompt_len >= max => {
                return Err(ServeError::ContextLength {
                    prompt: prompt_len,
                    requested: 1,
                    max,
                })
            }
            None => max - prompt_len,
        };
        let stop_strings = self.stop_strings();
        super::limits::check_stops(&stop_strings, &self.stop_token_ids)?;
        let mut stop_tokens: Vec<TokenId> = if self.ignore_eos {
            Vec::new()
        } else {
            state.model.tokenizer.eos_ids().to_vec()
        };
        stop_tokens.extend(super::body::token_ids(
            "stop_token_ids",
            &self.stop_token_ids,
            state.vocab(),
        )?);
        if stop_strings.iter().any(String::is_empty) {
            return Err(ServeError::invalid(
                "stop",
                "stop strings must not be empty",
            ));
        }
        let params = GenParams {
            sampling: self.sampling()?,
            max_new_tokens,
            min_tokens: self.min_tokens.unwrap_or(0),
            stop_tokens,
            stop_strings,
            seed: vec![seed, choice as u64],
            penalties: self.penalties()?,
            top_logprobs: self.top_logprobs,
            boost: None,
        };
        params.validate().map_err(sampling_error)?;
        Ok(params)
    }

    fn penalties(&self) -> Result<Penalties, ServeError> {
        Penalties::new(
            self.repetition_penalty.unwrap_or(1.0),
            self.presence_penalty.unwrap_or(0.0),
            self.frequency_penalty.unwrap_or(0.0),
        )
        .map_err(sampling_error)
    }

    fn sampling(&self) -> Result<Sampling, ServeError> {
        Sampling::new(
            self.temperature.unwrap_or(1.0),
            self.top_k,
            self.top_p,
            self.min_p,
        )
        .map_err(sampling_error)
    }

    /// The request's seed, or a fresh one.
    pub fn seed_or_fresh(&self, state: &AppState) -> u64 {
        self.seed.unwrap_or_else(|| state.fresh_seed())
    }

    /// The stop strings asked for.
    pub fn stop_strings(&self) -> Vec<String> {
        self.stop
            .clone()
            .map(OneOrMany::into_vec)
            .unwrap_or_default()
    }
}

/// A sampling option out of range, as a 400 naming its field.
pub fn sampling_error(e: SamplingError) -> ServeError {
    ServeError::Sampling(e)
}

/// OpenAI's `finish_reason` (and SGLang's `finish_reason.type`).
pub fn finish_reason(stop: StopReason) -> &'static str {
    match stop {
        StopReason::StopToken | StopReason::StopString => "stop",
        StopReason::MaxTokens | StopReason::ContextFull => "length",
    }
}

/// The text of generated tokens as an API returns it: cut before the first stop
/// string (the engine keeps the token that completed it; OpenAI's text ends before
/// the stop).
pub fn visible_text(text: &str, stops: &[String]) -> String {
    let cut = stops
        .iter()
        .filter_map(|s| text.find(s.as_str()))
        .min()
        .unwrap_or(text.len());
    text[..cut].to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_sampling_fields_are_the_structs_aliases_included() {
        let names = SamplingFields::fields();
        for field in [
            "max_new_tokens",
            "temperature",
            "min_tokens",
            "seed",
            "sampling_seed",
        ] {
            assert!(names.contains(&field), "{field} missing from {names:?}");
        }
        // `top_logprobs` is set by the OpenAI endpoints, never read from a body.
        assert!(!names.contains(&"top_logprobs"));
    }
}

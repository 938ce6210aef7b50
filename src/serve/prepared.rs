//! What an OpenAI request becomes before it runs ([`Prepared`]: prompts as token ids,
//! the sampling fields, the seed) and what its response counts ([`Usage`]); shared
//! by the whole-response handlers (`openai.rs`) and the streams (`stream.rs`).

use serde_json::{json, Value};

use crate::model::TokenId;

use super::error::ServeError;
use super::logprobs::TokenSpelling;
use super::sampling::SamplingFields;
use super::state::AppState;

/// A prepared request: prompts as token ids, the sampling fields, the seed.
pub struct Prepared {
    /// Each prompt's token ids (checked against the vocabulary, none empty).
    pub prompts: Vec<Vec<TokenId>>,
    /// Choices per prompt (`n`, 1 to 128).
    pub choices: usize,
    /// The sampling fields of the request, as every choice shares them.
    pub sampling: SamplingFields,
    /// The request's `seed`, or a fresh one; choice `j` of prompt `p` samples from
    /// the stream `p · choices + j` of it, so choices differ.
    pub seed: u64,
    /// Whether the response reports each sampled token's logprob.
    pub logprobs: bool,
    /// How tokens are spelt in `logprobs` (text, or `token_id:N`).
    pub spelling: TokenSpelling,
    /// vLLM's `return_token_ids`: add the prompt's and each choice's token ids.
    pub return_token_ids: bool,
    /// A streamed response ends with a `usage` chunk (`stream_options.include_usage`).
    pub include_usage: bool,
    /// The response's `id` (`cmpl-…` or `chatcmpl-…`), shared by every chunk of a
    /// stream.
    pub id: String,
    /// The response's `created`: Unix time in seconds when the request was prepared.
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

/// Token counts of a response (OpenAI's `usage`).
#[derive(Debug, Default, Clone, Copy)]
pub struct Usage {
    /// Prompt tokens of every prompt of the request (each counted once, whatever `n`).
    pub prompt_tokens: usize,
    /// Tokens generated, over every choice.
    pub completion_tokens: usize,
    /// Prompt tokens served from the prefix cache instead of prefilled
    /// (`prompt_tokens_details.cached_tokens`).
    pub cached_tokens: u64,
}

impl Usage {
    /// Counts one prompt of `tokens` tokens, `cached` of them from the prefix cache.
    pub fn add_prompt(&mut self, tokens: usize, cached: u64) {
        self.prompt_tokens += tokens;
        self.cached_tokens += cached;
    }

    /// OpenAI's `usage` object, `total_tokens` and `prompt_tokens_details` included.
    pub fn to_json(self) -> Value {
        json!({
            "prompt_tokens": self.prompt_tokens,
            "completion_tokens": self.completion_tokens,
            "total_tokens": self.prompt_tokens + self.completion_tokens,
            "prompt_tokens_details": { "cached_tokens": self.cached_tokens },
        })
    }
}

/// `tokens` as text, with the served model's tokenizer; an id it cannot decode is
/// an error.
pub fn decode(state: &AppState, tokens: &[TokenId]) -> Result<String, ServeError> {
    Ok(state.model.tokenizer.decode(tokens)?)
}

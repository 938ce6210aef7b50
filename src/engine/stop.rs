//! When a generation ends: stop tokens, stop strings, token limits.

use serde::{Deserialize, Serialize};

use crate::model::{ModelError, TokenId};

use super::penalties::Penalties;
use super::sampling::{BoostedStart, Sampling};
use super::sampling_error::{SamplingError, MAX_TOP_LOGPROBS};

/// Why a generation ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum StopReason {
    /// A stop token was sampled (it is not part of the output).
    StopToken,
    /// The decoded text came to contain a stop string (the token completing it is
    /// part of the output).
    StopString,
    /// `max_new_tokens` tokens were generated (the last is part of the output).
    MaxTokens,
    /// The model's context window is full.
    ContextFull,
}

/// How to generate: sampling, limits and stop conditions, and the RNG seed.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct GenParams {
    /// How each token is chosen.
    pub sampling: Sampling,
    /// Most tokens to generate, the last one included; at least 1.
    pub max_new_tokens: usize,
    /// vLLM's `min_tokens`: fewest tokens before the generation may stop. While fewer
    /// are generated its stop tokens cannot be drawn (their logits are masked, which
    /// the behaviour logprob accounts for), and a stop string counts only once more
    /// than `min_tokens` are, as in vLLM. At most `max_new_tokens`; 0: off.
    #[serde(default)]
    pub min_tokens: usize,
    /// Token ids that end the generation when sampled (not part of the output).
    pub stop_tokens: Vec<TokenId>,
    /// Strings that end the generation once the decoded output contains one (the token
    /// completing it is part of the output).
    pub stop_strings: Vec<String>,
    /// Seed words of this generation's RNG, e.g. (run seed, prompt, tree, branch, step):
    /// the samples depend on these alone, never on the rest of the batch.
    pub seed: Vec<u64>,
    /// vLLM's repetition, presence and frequency penalties (none by default).
    #[serde(default)]
    pub penalties: Penalties,
    /// How many most likely alternatives to report with each token (0: none).
    #[serde(default)]
    pub top_logprobs: usize,
    /// The first tokens drawn from another distribution (a tree branch's boost);
    /// `None`: every token from `sampling`.
    #[serde(default)]
    pub boost: Option<BoostedStart>,
}

impl GenParams {
    /// Checks what a caller asked for by the rule every way in shares: a sampling
    /// [`Sampling::new`] could have made, at least one token, at most
    /// [`MAX_TOP_LOGPROBS`] alternatives, `min_tokens` no more than `max_new_tokens`. The server, the Python binding and the CLI
    /// call it on the params they built, so one value gets one answer everywhere.
    pub fn validate(&self) -> Result<(), SamplingError> {
        self.sampling.validate()?;
        if self.max_new_tokens == 0 {
            return Err(SamplingError::NoTokens);
        }
        if self.min_tokens > self.max_new_tokens {
            return Err(SamplingError::MinTokens {
                min: self.min_tokens,
                max: self.max_new_tokens,
            });
        }
        if self.top_logprobs > MAX_TOP_LOGPROBS {
            return Err(SamplingError::TopLogprobs(self.top_logprobs));
        }
        if let Some(boost) = &self.boost {
            boost.sampling.validate()?;
            if boost.tokens == 0 {
                return Err(SamplingError::NoBoostedTokens);
            }
        }
        Ok(())
    }

    /// Greedy generation of at most `max_new_tokens`, no stop condition.
    pub fn greedy(max_new_tokens: usize) -> Self {
        GenParams {
            sampling: Sampling::Greedy,
            max_new_tokens,
            min_tokens: 0,
            stop_tokens: Vec::new(),
            stop_strings: Vec::new(),
            seed: Vec::new(),
            penalties: Penalties::NONE,
            top_logprobs: 0,
            boost: None,
        }
    }
}

/// The one finish check of every generation path (the engine, and the tests'
/// single-sequence oracle): after `token` was sampled following `generated`,
/// whether the generation ends and whether `token` is part of its output.
///
/// In order: a stop token ends it (the token is not output); a stop string completed
/// by the token ends it (the token is output), once more than `min_tokens` tokens are
/// generated; the token limit; then the context
/// window, once `total_after` (the sequence's whole length with the token) reaches
/// `max_positions`. `decode` turns tokens into text, for stop strings only.
pub fn check_sampled(
    params: &GenParams,
    generated: &[TokenId],
    token: TokenId,
    total_after: usize,
    max_positions: usize,
    decode: impl Fn(&[TokenId]) -> Result<String, ModelError>,
) -> Result<Verdict, ModelError> {
    if params.stop_tokens.contains(&token) {
        return Ok(Verdict::end(StopReason::StopToken, false));
    }
    if !params.stop_strings.is_empty() && generated.len() >= params.min_tokens {
        // A new match must end in the last token, and every token decodes to at least
        // one byte, so decoding the last (longest stop + 1) tokens suffices: O(stop
        // length) per sampled token instead of re-decoding the generation.
        let longest = params
            .stop_strings
            .iter()
            .map(String::len)
            .max()
            .unwrap_or(0);
        let mut window = generated[generated.len().saturating_sub(longest)..].to_vec();
        window.push(token);
        let text = decode(&window)?;
        let last = decode(&[token])?;
        if find_stop(&text, &params.stop_strings, last.len()).is_some() {
            return Ok(Verdict::end(StopReason::StopString, true));
        }
    }
    if generated.len() + 1 >= params.max_new_tokens {
        return Ok(Verdict::end(StopReason::MaxTokens, true));
    }
    if total_after >= max_positions {
        return Ok(Verdict::end(StopReason::ContextFull, true));
    }
    Ok(Verdict {
        keep: true,
        stop: None,
    })
}

/// What [`check_sampled`] decided.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Verdict {
    /// The sampled token is part of the output.
    pub keep: bool,
    /// The generation ends here, for this reason.
    pub stop: Option<StopReason>,
}

impl Verdict {
    fn end(reason: StopReason, keep: bool) -> Self {
        Verdict {
            keep,
            stop: Some(reason),
        }
    }
}

/// Finds the first stop string in `text` that ends within its last `tail` bytes,
/// returning the byte offset just past it. Only the tail can hold a new match, so the
/// check per sampled token is O(tail · stops), not O(text).
pub fn find_stop(text: &str, stops: &[String], tail: usize) -> Option<usize> {
    let mut best: Option<usize> = None;
    for s in stops.iter().filter(|s| !s.is_empty()) {
        let from = text.len().saturating_sub(tail + s.len());
        let from = (0..=from)
            .rev()
            .find(|&i| text.is_char_boundary(i))
            .unwrap_or(0);
        if let Some(pos) = text[from..].find(s.as_str()) {
            let end = from + pos + s.len();
            best = Some(best.map_or(end, |b| b.min(end)));
        }
    }
    best
}

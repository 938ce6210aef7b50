//! [`SamplingError`]: a sampling option out of range, named by its request field,
//! and the most `top_logprobs` served. A leaf file: the sampler, the penalties and
//! the generation parameters all check against it.
//!
//! [`BoostedStart`]: super::sampling::BoostedStart

/// A sampling option out of range: refused, never coerced (the field names are the
/// OpenAI / vLLM request fields).
#[derive(Debug, Clone, Copy, PartialEq, thiserror::Error)]
pub enum SamplingError {
    /// The temperature given (negative or not finite).
    #[error("temperature {0} is not a temperature (0 = greedy, or above 0)")]
    Temperature(f32),
    /// The `top_p` given.
    #[error("top_p {0} is outside (0, 1]")]
    TopP(f32),
    /// The `top_k` given (below -1).
    #[error("top_k {0} is not a top-k (-1 or 0 = off, or at least 1)")]
    TopK(i64),
    /// The `min_p` given.
    #[error("min_p {0} is outside [0, 1]")]
    MinP(f32),
    /// The repetition penalty given (zero, negative or not finite).
    #[error("repetition_penalty {0} must be above 0 (1 = off)")]
    RepetitionPenalty(f32),
    /// The presence penalty given.
    #[error("presence_penalty {0} is outside [-2, 2]")]
    PresencePenalty(f32),
    /// The frequency penalty given.
    #[error("frequency_penalty {0} is outside [-2, 2]")]
    FrequencyPenalty(f32),
    /// The number of alternatives asked for.
    #[error("top_logprobs {0} is above the most alternatives served ({MAX_TOP_LOGPROBS})")]
    TopLogprobs(usize),
    /// A generation was asked for zero new tokens.
    #[error("max_tokens must be at least 1")]
    NoTokens,
    /// `min_tokens` above the most tokens the generation may make.
    #[error("min_tokens {min} is above max_tokens {max}")]
    MinTokens {
        /// The `min_tokens` given.
        min: usize,
        /// The generation's token limit.
        max: usize,
    },
    /// A boosted start ([`BoostedStart`]) of zero tokens.
    #[error("a branch's boosted start must cover at least 1 token")]
    NoBoostedTokens,
}

impl SamplingError {
    /// The request field at fault.
    pub fn field(&self) -> &'static str {
        match self {
            SamplingError::Temperature(_) => "temperature",
            SamplingError::TopP(_) => "top_p",
            SamplingError::TopK(_) => "top_k",
            SamplingError::MinP(_) => "min_p",
            SamplingError::RepetitionPenalty(_) => "repetition_penalty",
            SamplingError::PresencePenalty(_) => "presence_penalty",
            SamplingError::FrequencyPenalty(_) => "frequency_penalty",
            SamplingError::TopLogprobs(_) => "top_logprobs",
            SamplingError::NoTokens => "max_tokens",
            SamplingError::MinTokens { .. } => "min_tokens",
            SamplingError::NoBoostedTokens => "branch_sampling",
        }
    }
}

/// Most `top_logprobs` alternatives per token (vLLM's default limit is 20).
pub const MAX_TOP_LOGPROBS: usize = 20;

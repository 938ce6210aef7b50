//! Python sampling arguments → the engine's `GenParams`, checked: a bad value is a
//! `ValueError` naming the argument, never a silently different generation.

use pyo3::prelude::*;
use pyo3::types::{PyDict, PyList, PyString};
use treegrpo::engine::{GenParams, Penalties, SampledToken, Sampling, StopReason};
use treegrpo::model::TokenId;

use treegrpo::engine::SamplingError;

use crate::errors::value_error;

/// Sampling arguments as Python passes them.
#[derive(Debug, Clone)]
pub struct SamplingArgs {
    pub max_tokens: usize,
    pub temperature: f64,
    pub top_p: Option<f64>,
    /// vLLM's spelling: -1 or 0 is off.
    pub top_k: Option<i64>,
    pub stop: Vec<String>,
    pub seed: Option<u64>,
    pub extensions: Extensions,
}

/// vLLM's sampling extensions: min-p, the three penalties, and how many most likely
/// alternatives to return with each token.
#[derive(Debug, Clone)]
pub struct Extensions {
    pub min_p: Option<f64>,
    pub repetition_penalty: f64,
    pub presence_penalty: f64,
    pub frequency_penalty: f64,
    pub logprobs: usize,
    /// vLLM's `min_tokens` (0: off).
    pub min_tokens: usize,
}

impl Default for Extensions {
    fn default() -> Self {
        Extensions {
            min_p: None,
            repetition_penalty: 1.0,
            presence_penalty: 0.0,
            frequency_penalty: 0.0,
            logprobs: 0,
            min_tokens: 0,
        }
    }
}

impl SamplingArgs {
    /// The keyword arguments of `generate` (the engine's and a session's).
    pub fn from_args(
        max_tokens: usize,
        temperature: f64,
        top_p: Option<f64>,
        top_k: Option<i64>,
        stop: Option<&Bound<'_, PyAny>>,
        seed: Option<u64>,
    ) -> PyResult<Self> {
        Ok(SamplingArgs {
            max_tokens,
            temperature,
            top_p,
            top_k,
            stop: stop.map(stop_strings).transpose()?.unwrap_or_default(),
            seed,
            extensions: Extensions::default(),
        })
    }

    /// The same arguments with vLLM's extensions.
    pub fn with_extensions(mut self, extensions: Extensions) -> Self {
        self.extensions = extensions;
        self
    }

    /// The engine's parameters: `temperature` 0 is greedy; generation also ends at
    /// the model's end-of-sequence tokens; the RNG seed words are `[seed, index]`
    /// (`seed` defaulting to the engine's), so each prompt of a call samples on its
    /// own stream, independent of the rest of the batch.
    pub fn params(&self, default_seed: u64, index: u64, eos: &[TokenId]) -> PyResult<GenParams> {
        if self.stop.iter().any(String::is_empty) {
            return Err(value_error("stop strings must not be empty"));
        }
        // The engine's own checked constructors: one rule, one message everywhere.
        let x = &self.extensions;
        let sampling = Sampling::new(
            narrow("temperature", self.temperature)?,
            self.top_k,
            self.top_p.map(|p| narrow("top_p", p)).transpose()?,
            x.min_p.map(|p| narrow("min_p", p)).transpose()?,
        )
        .map_err(|e| value_error(e.to_string()))?;
        let penalties = Penalties::new(
            narrow("repetition_penalty", x.repetition_penalty)?,
            narrow("presence_penalty", x.presence_penalty)?,
            narrow("frequency_penalty", x.frequency_penalty)?,
        )
        .map_err(|e| value_error(e.to_string()))?;
        let params = GenParams {
            sampling,
            max_new_tokens: self.max_tokens,
            min_tokens: x.min_tokens,
            stop_tokens: eos.to_vec(),
            stop_strings: self.stop.clone(),
            seed: vec![self.seed.unwrap_or(default_seed), index],
            penalties,
            top_logprobs: x.logprobs,
            boost: None,
        };
        // The library's rule for what the constructors above do not see (at least
        // one token, at most 20 alternatives): the server's words exactly.
        params
            .validate()
            .map_err(|e: SamplingError| value_error(e.to_string()))?;
        Ok(params)
    }

    /// Reads verl's `sampling_params` dict. Keys this engine cannot honour are a
    /// `ValueError`, not ignored.
    pub fn from_dict(
        dict: Option<&Bound<'_, PyDict>>,
        default_max_tokens: usize,
    ) -> PyResult<Self> {
        let mut args = SamplingArgs {
            max_tokens: default_max_tokens,
            temperature: 1.0,
            top_p: None,
            top_k: None,
            stop: Vec::new(),
            seed: None,
            extensions: Extensions::default(),
        };
        let Some(dict) = dict else { return Ok(args) };
        for (key, value) in dict.iter() {
            let key: String = key.extract()?;
            let bad = |e: PyErr| value_error(format!("sampling_params[{key:?}]: {e}"));
            match key.as_str() {
                "max_tokens" | "max_new_tokens" => {
                    args.max_tokens = value.extract().map_err(bad)?
                }
                "temperature" => args.temperature = value.extract().map_err(bad)?,
                // verl and vLLM spell "no truncation" as top_p 1 and top_k -1 (or 0):
                // the engine's constructor reads those spellings itself and refuses
                // anything out of range (nothing is coerced here).
                "top_p" => args.top_p = Some(value.extract().map_err(bad)?),
                "top_k" => args.top_k = Some(value.extract().map_err(bad)?),
                "stop" => args.stop = stop_strings(&value).map_err(bad)?,
                "seed" => args.seed = value.extract().map_err(bad)?,
                // Logprobs of the sampled tokens are always returned (verl sends
                // `logprobs` to ask for them).
                "logprobs" => {}
                "min_p" => args.extensions.min_p = Some(value.extract().map_err(bad)?),
                "repetition_penalty" => {
                    args.extensions.repetition_penalty = value.extract().map_err(bad)?
                }
                "presence_penalty" => {
                    args.extensions.presence_penalty = value.extract().map_err(bad)?
                }
                "frequency_penalty" => {
                    args.extensions.frequency_penalty = value.extract().map_err(bad)?
                }
                "min_tokens" => args.extensions.min_tokens = value.extract().map_err(bad)?,
                _ => {
                    return Err(value_error(format!(
                        "sampling_params: unsupported key {key:?} (supported: max_tokens, \
                         temperature, top_p, top_k, min_p, min_tokens, stop, seed, logprobs, \
                         repetition_penalty, presence_penalty, frequency_penalty)"
                    )))
                }
            }
        }
        Ok(args)
    }
}

/// A Python float as the engine's f32, refused when narrowing would change what it
/// means: a finite value that overflows to infinity, or a non-zero one that rounds
/// to zero (`temperature=1e-50` would otherwise silently become greedy).
pub fn narrow(name: &str, value: f64) -> PyResult<f32> {
    let narrowed = value as f32;
    if (value.is_finite() && !narrowed.is_finite()) || (value != 0.0 && narrowed == 0.0) {
        return Err(value_error(format!(
            "{name} {value:e} is outside what a 32-bit float holds ({:e} to {:e})",
            f32::MIN_POSITIVE,
            f32::MAX
        )));
    }
    Ok(narrowed)
}

/// `stop` as a string or a list of strings.
pub fn stop_strings(value: &Bound<'_, PyAny>) -> PyResult<Vec<String>> {
    if value.is_none() {
        return Ok(Vec::new());
    }
    if let Ok(s) = value.cast::<PyString>() {
        return Ok(vec![s.to_cow()?.into_owned()]);
    }
    if let Ok(list) = value.cast::<PyList>() {
        return list.iter().map(|s| s.extract::<String>()).collect();
    }
    Err(value_error("stop must be a string or a list of strings"))
}

/// The finish reason in vLLM's and OpenAI's words: `stop` or `length`.
pub fn finish_reason(stop: StopReason) -> &'static str {
    match stop {
        StopReason::StopToken | StopReason::StopString => "stop",
        StopReason::MaxTokens | StopReason::ContextFull => "length",
    }
}

/// The stop reason in verl's `TokenOutput` words: verl's vLLM server maps vLLM's
/// `stop` and `length` to `"completed"` (and an aborted request to `"aborted"`,
/// which no generation of ours is: a weight swap lets it finish on the old
/// weights). One arm per reason, so a new reason must be placed here.
pub fn verl_stop_reason(stop: StopReason) -> &'static str {
    match stop {
        StopReason::StopToken
        | StopReason::StopString
        | StopReason::MaxTokens
        | StopReason::ContextFull => "completed",
    }
}

/// The engine's own name of a stop reason.
pub fn stop_reason_name(stop: StopReason) -> &'static str {
    match stop {
        StopReason::StopToken => "stop_token",
        StopReason::StopString => "stop_string",
        StopReason::MaxTokens => "max_tokens",
        StopReason::ContextFull => "context_full",
    }
}

/// Each token's alternatives as `[(token_id, logprob), ...]` lists.
pub fn alternatives(top: &[Vec<SampledToken>]) -> Vec<Vec<(TokenId, f32)>> {
    top.iter()
        .map(|alts| alts.iter().map(|a| (a.token, a.logprob)).collect())
        .collect()
}

//! The fields each endpoint reads, checked before its body is: a field an endpoint
//! does not know is a 400 naming it, never silently ignored (a client that sends
//! `mirostat` or a misspelt `repetition_penallty` must learn it had no effect).
//!
//! Types without `#[serde(flatten)]` refuse unknown fields through serde's own
//! `deny_unknown_fields`; serde cannot do that across a flatten, so the endpoints
//! whose bodies share fields (OpenAI's two, the sampling parameters) list theirs here.

use serde_json::Value;

/// OpenAI request fields accepted and ignored: they change nothing a client could
/// observe here (one model is served; no storage, no tiers, no user tracking).
pub const ACCEPTED_IGNORED: &[&str] = &["model", "user", "metadata", "store", "service_tier"];

/// The sampling fields of every generating endpoint, under SGLang's and vLLM's names
/// (`serve::sampling::SamplingFields`).
pub const SAMPLING: &[&str] = &[
    "max_new_tokens",
    "temperature",
    "top_p",
    "top_k",
    "min_p",
    "stop",
    "stop_token_ids",
    "ignore_eos",
    "seed",
    "sampling_seed",
    "repetition_penalty",
    "presence_penalty",
    "frequency_penalty",
];

/// A request body whose unknown fields are found before it is read.
pub trait KnownFields {
    /// The first field of `body` this endpoint does not read (its path, dotted for
    /// nested objects); `None` when all are known or serde refuses them itself.
    fn unknown_field(_body: &Value) -> Option<String> {
        None
    }
}

/// The first key of the object `body` in none of `lists`, prefixed by `at`.
pub fn first_unknown(body: &Value, at: &str, lists: &[&[&str]]) -> Option<String> {
    body.as_object()?
        .keys()
        .find(|k| !lists.iter().any(|l| l.contains(&k.as_str())))
        .map(|k| format!("{at}{k}"))
}

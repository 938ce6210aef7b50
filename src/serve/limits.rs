//! What one request may ask for: the bounds on everything a client controls that
//! sizes the work or the response, each checked before any of the request's work
//! starts (tokenising, building its params, allocating), and each broken one a 400
//! naming the field and its limit. The bound a request's sequences share with every
//! other (`--max-running`) is the admission gate's ([`super::state::Admission`]);
//! rollout shapes have their own ([`super::rollouts`]).

use super::error::ServeError;
use super::state::AppState;

/// Most stop strings per request.
pub const MAX_STOP_STRINGS: usize = 16;
/// Longest stop string, in bytes.
pub const MAX_STOP_STRING_BYTES: usize = 1024;
/// Most `stop_token_ids` per request (each is checked at every sampled token).
pub const MAX_STOP_TOKEN_IDS: usize = 64;
/// Longest client-chosen request id (`rid`), in bytes: it is copied into every output.
pub const MAX_RID_BYTES: usize = 256;

/// The sequences of `prompts` prompts of `n` choices each, refused at once (400)
/// when they could never run as one request: naming `n` when one prompt's choices
/// are already too many, else `prompts_field`.
pub fn request_sequences(
    state: &AppState,
    prompts: usize,
    prompts_field: &'static str,
    n: usize,
) -> Result<usize, ServeError> {
    state.admission.check_fits(n, "n")?;
    let sequences = prompts.saturating_mul(n);
    state.admission.check_fits(sequences, prompts_field)?;
    Ok(sequences)
}

/// A request id of at most [`MAX_RID_BYTES`].
pub fn check_rid(rid: Option<&str>) -> Result<(), ServeError> {
    match rid {
        Some(r) if r.len() > MAX_RID_BYTES => Err(ServeError::invalid(
            "rid",
            format!("at most {MAX_RID_BYTES} bytes"),
        )),
        _ => Ok(()),
    }
}

/// Stop lists within [`MAX_STOP_STRINGS`], [`MAX_STOP_STRING_BYTES`] and
/// [`MAX_STOP_TOKEN_IDS`].
pub fn check_stops(stop_strings: &[String], stop_token_ids: &[i64]) -> Result<(), ServeError> {
    if stop_strings.len() > MAX_STOP_STRINGS {
        return Err(ServeError::invalid(
            "stop",
            format!("at most {MAX_STOP_STRINGS} stop strings"),
        ));
    }
    if stop_strings.iter().any(|s| s.len() > MAX_STOP_STRING_BYTES) {
        return Err(ServeError::invalid(
            "stop",
            format!("a stop string of at most {MAX_STOP_STRING_BYTES} bytes"),
        ));
    }
    if stop_token_ids.len() > MAX_STOP_TOKEN_IDS {
        return Err(ServeError::invalid(
            "stop_token_ids",
            format!("at most {MAX_STOP_TOKEN_IDS} ids"),
        ));
    }
    Ok(())
}

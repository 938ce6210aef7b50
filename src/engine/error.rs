//! The engine layer's error type.

use std::sync::Arc;

use crate::kv::{KvError, SeqId};
use crate::model::ModelError;

/// Errors of the engine layer: a request the engine refuses (an unknown or busy
/// sequence, a bad token, weights that do not fit), a model or KV failure met while
/// serving it, or the engine thread being gone. Running out of KV blocks is not an
/// error here (the scheduler preempts and retries) unless a sequence could never fit
/// ([`EngineError::NeverFits`]).
#[derive(Debug, thiserror::Error)]
pub enum EngineError {
    /// The model failed (a context overflow, a tokenizer or tensor error); shown as
    /// the model error itself.
    #[error(transparent)]
    Model(#[from] ModelError),
    /// The generation parameters are out of range (the rule of
    /// [`GenParams::validate`](super::GenParams::validate), which every way in
    /// applies first: the engine checks again what it is handed).
    #[error(transparent)]
    Sampling(#[from] super::sampling_error::SamplingError),
    /// A KV-cache operation failed outside the scheduler's own recovery (an unknown
    /// sequence or pin in the cache, a broken invariant); shown as the KV error itself.
    #[error(transparent)]
    Kv(#[from] KvError),
    /// The sequence id is not live in this engine: it was freed, or never created
    /// here. Ids are not reused, so this never reaches another caller's sequence.
    #[error("sequence {0:?} does not exist (freed, or never created)")]
    UnknownSequence(SeqId),
    /// The sequence is generating or prefilling already; wait for that request to
    /// finish before forking, extending or generating from it again.
    #[error("sequence {0:?} is already generating")]
    Busy(SeqId),
    /// A generation was asked of a sequence with no tokens and no computed logits to
    /// sample the first token from: extend it with a prompt first.
    #[error("sequence {0:?} has no tokens to continue from")]
    EmptySequence(SeqId),
    /// A sequence was started (or a generation asked) with an empty prompt.
    #[error("a sequence needs at least one prompt token")]
    EmptyPrompt,
    /// The sequence cannot fit the KV pool even with every other sequence preempted:
    /// literally true, never a guess made under pressure.
    #[error(
        "sequence {seq:?} of {tokens} tokens needs {needed} KV blocks but the pool has \
         {total}{}: raise the KV budget (--kv-mib) or shorten the sequence",
        if *pinned > 0 { format!(" ({pinned} held by pins)") } else { String::new() }
    )]
    NeverFits {
        /// The sequence that was failed.
        seq: SeqId,
        /// Its length in tokens when it asked for room.
        tokens: usize,
        /// The KV blocks that length takes.
        needed: usize,
        /// The blocks in the whole pool.
        total: usize,
        /// The blocks held by pins, which preemption cannot take back.
        pinned: usize,
    },
    /// The sequence was freed while a generation or prefill for it was still in
    /// flight; that request ends with this error.
    #[error("sequence {0:?} was freed before its work finished")]
    Freed(SeqId),
    /// A prompt token id the model's vocabulary has no entry for.
    #[error("token id {token} is outside the model's vocabulary of {vocab}")]
    BadToken {
        /// The offending token id.
        token: u32,
        /// The vocabulary size: valid ids are `0..vocab`.
        vocab: usize,
    },
    /// The forward of a batch failed; every sequence of the batch gets the same
    /// cause (shared, so each waiter receives it whole).
    #[error("forward failed")]
    Forward(#[source] Arc<ModelError>),
    /// An engine step failed outside the forward (a KV-cache invariant broke); every
    /// waiting caller gets it.
    #[error("engine step failed")]
    Step(#[source] Arc<EngineError>),
    /// The offered weights do not fit the served model's KV cache and tokenizer.
    #[error("the new weights' {field} differs from the served model's")]
    WeightShape {
        /// The first config field that differs (`vocab_size`, `hidden_size`,
        /// `num_layers`, `num_heads`, `num_kv_heads`, `head_dim` or
        /// `intermediate_size`).
        field: &'static str,
    },
    /// The offered weights keep K/V in a wider format than the engine's KV pool (an
    /// engine started at `--precision fast` keeps f16, exact weights need f32).
    #[error(
        "the new weights keep keys and values in {weights}, this engine's KV cache holds \
         {cache} (start it at the weights' precision)",
        weights = weights.name(),
        cache = cache.name()
    )]
    KvFormat {
        /// The format the engine's KV pool stores.
        cache: crate::model::KvFormat,
        /// The format the offered weights compute K/V in.
        weights: crate::model::KvFormat,
    },
    /// A swap was asked of the core while a generation or prefill runs (the engine
    /// thread waits for them instead).
    #[error("weights cannot be swapped while a generation or prefill is in flight")]
    SwapInFlight,
    /// Weights were offered under a version that is not newer than the one being
    /// served; versions must increase with every swap.
    #[error("weight version {offered} is not above the served version {serving}")]
    StaleWeightVersion {
        /// The version the new weights were offered as.
        offered: u64,
        /// The version currently served.
        serving: u64,
    },
    /// A weight swap while pins hold KV computed under the old weights (which would
    /// go stale); release the pins first.
    #[error("weights cannot be swapped while {pins} pins hold KV computed under the old ones")]
    SwapWithPins {
        /// The pins still held.
        pins: usize,
    },
    /// A task the engine's caller spawned (loading weights on a blocking thread,
    /// one of a benchmark's generations) panicked or was cancelled.
    #[error("the {task} task failed")]
    Task {
        /// What the task was doing (`"weight loading"`, `"decode"`).
        task: &'static str,
        /// tokio's join error (a panic or a cancellation).
        #[source]
        source: tokio::task::JoinError,
    },
    /// The same failure as another waiter on the same work got (see
    /// [`EngineError::replicate`]): it displays and chains exactly as the original.
    #[error(transparent)]
    Shared(Arc<EngineError>),
    /// The engine thread panicked: this call, every call waiting on it and every
    /// later one fail with its message. The engine's state cannot be trusted after a
    /// panic, so nothing more is computed; start a new engine (a server exits).
    #[error("the engine thread panicked ({message}); the engine must be restarted")]
    Died {
        /// The panic's message.
        message: String,
    },
    /// The engine thread is gone (it was shut down, or panicked), so the request
    /// could not be sent or its answer never came; start a new engine.
    #[error("the engine thread has stopped")]
    Stopped,
    /// The operating system would not start the engine thread.
    #[error("cannot start the engine thread")]
    Spawn(#[source] std::io::Error),
    /// `TREEGRPO_STEP_LOG` names a file that cannot be created.
    #[error("cannot create the step log {}", path.display())]
    StepLog {
        /// The path `TREEGRPO_STEP_LOG` gives.
        path: std::path::PathBuf,
        /// Why it cannot be created.
        #[source]
        source: std::io::Error,
    },
}

impl EngineError {
    /// The same error for a second waiter on the same work (several callers waiting
    /// on one prefill). Every variant the scheduler reports is reproduced exactly. One
    /// whose cause cannot be cloned (a model error other than a context overflow, an
    /// I/O or task failure) first moves behind an `Arc`, in `self` too, as
    /// [`EngineError::Shared`]: both then display and chain as the original did, and
    /// the cause stays whole (a `source`, never a copy of its text).
    pub fn replicate(&mut self) -> EngineError {
        if let Some(copy) = self.clone_exact() {
            return copy;
        }
        let original = std::mem::replace(self, EngineError::Stopped);
        let shared = Arc::new(original);
        *self = EngineError::Shared(Arc::clone(&shared));
        EngineError::Shared(shared)
    }

    /// An exact copy, where every field of the variant can be cloned.
    fn clone_exact(&self) -> Option<EngineError> {
        use EngineError::*;
        Some(match self {
            Model(ModelError::ContextOverflow { tokens, max }) => {
                Model(ModelError::ContextOverflow {
                    tokens: *tokens,
                    max: *max,
                })
            }
            Model(_) | Task { .. } | Spawn(_) | StepLog { .. } => return None,
            Kv(e) => Kv(e.clone()),
            Sampling(e) => Sampling(*e),
            UnknownSequence(s) => UnknownSequence(*s),
            Busy(s) => Busy(*s),
            EmptySequence(s) => EmptySequence(*s),
            EmptyPrompt => EmptyPrompt,
            NeverFits {
                seq,
                tokens,
                needed,
                total,
                pinned,
            } => NeverFits {
                seq: *seq,
                tokens: *tokens,
                needed: *needed,
                total: *total,
                pinned: *pinned,
            },
            Freed(s) => Freed(*s),
            Died { message } => Died {
                message: message.clone(),
            },
            BadToken { token, vocab } => BadToken {
                token: *token,
                vocab: *vocab,
            },
            Forward(e) => Forward(e.clone()),
            Step(e) => Step(e.clone()),
            WeightShape { field } => WeightShape { field },
            KvFormat { cache, weights } => KvFormat {
                cache: *cache,
                weights: *weights,
            },
            SwapInFlight => SwapInFlight,
            StaleWeightVersion { offered, serving } => StaleWeightVersion {
                offered: *offered,
                serving: *serving,
            },
            SwapWithPins { pins } => SwapWithPins { pins: *pins },
            Shared(e) => Shared(Arc::clone(e)),
            Stopped => Stopped,
        })
    }

    /// Whether this is a limit of one sequence (it cannot fit the KV pool or the
    /// context window): the caller's other sequences are unaffected, so a rollout
    /// records the branch as failed and goes on.
    pub fn is_sequence_limit(&self) -> bool {
        match self {
            EngineError::NeverFits { .. }
            | EngineError::Model(ModelError::ContextOverflow { .. }) => true,
            EngineError::Shared(e) => e.is_sequence_limit(),
            _ => false,
        }
    }
}

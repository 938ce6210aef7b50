//! Running one request's generations on the engine (admitted by its handler, for all
//! its prompts' choices at once): the prompt's sequence,
//! one fork per extra choice (the prompt is computed once however many choices), and
//! freeing every sequence when the request ends — also when its client went away
//! and the handler was dropped mid-generation.

use futures_util::future::join_all;

use crate::engine::{Engine, GenParams, Generation, OwnedSeq, TokenStream};
use crate::kv::SeqId;
use crate::model::TokenId;

use super::error::ServeError;
use super::state::AppState;

/// Sequences a request owns (each an [`OwnedSeq`]): whatever is still owned when this
/// is dropped is released without waiting, so a handler dropped because its client
/// disconnected frees its sequences, and the engine stops working on them.
pub struct Owned {
    engine: Engine,
    seqs: Vec<OwnedSeq>,
}

impl Owned {
    /// Owns nothing yet; sequences are released through `engine`.
    pub fn new(engine: &Engine) -> Self {
        Owned {
            engine: engine.clone(),
            seqs: Vec::new(),
        }
    }

    /// Takes ownership of `seq`: it is freed by [`Self::free_all`] or when this is
    /// dropped. The first pushed should be the prompt's own sequence.
    pub fn push(&mut self, seq: SeqId) {
        self.seqs.push(OwnedSeq::adopt(&self.engine, seq));
    }

    /// Frees every sequence, returning how many prompt tokens the first (the
    /// prompt's own) found in the prefix cache.
    pub async fn free_all(mut self) -> Result<u64, ServeError> {
        let mut cached = 0;
        for (i, seq) in std::mem::take(&mut self.seqs).into_iter().enumerate() {
            let usage = seq.free().await?;
            if i == 0 {
                cached = usage.reused_prefix_cache;
            }
        }
        Ok(cached)
    }
}

/// Finished generations of one prompt and what its prompt cost.
pub struct Completed {
    /// One generation per choice, in choice order.
    pub generations: Vec<Generation>,
    /// Prompt tokens served from the prefix cache.
    pub cached_tokens: u64,
}

/// The sequences of one prompt's choices, started: the prompt's sequence first,
/// then a fork per extra choice sharing its computed prompt.
pub struct Started {
    /// The sequences, owned: freed when the request ends or is dropped.
    pub owned: Owned,
    /// The prompt's sequence, then one fork per extra choice (`choices` in all).
    pub seqs: Vec<SeqId>,
}

/// Adds the prompt and forks it once per extra choice (the caller holds the
/// request's admission permit).
pub async fn start(
    state: &AppState,
    prompt: &[TokenId],
    choices: usize,
) -> Result<Started, ServeError> {
    let engine = &state.engine;
    // New work waits while the KV pool is under pressure (the same gate rollouts
    // use), up to the queue timeout.
    let blocks = prompt.len().div_ceil(engine.config().block_size.max(1));
    tokio::time::timeout(state.config.queue_timeout, engine.wait_for_kv_room(blocks))
        .await
        .map_err(|_| ServeError::Overloaded("the KV cache stayed full past the queue timeout"))??;
    let mut owned = Owned::new(engine);
    let root = engine.add_sequence(prompt.to_vec()).await?;
    owned.push(root);
    let mut seqs = vec![root];
    if choices > 1 {
        // Computed once, then shared: each fork samples its first token from the
        // prompt's last logits.
        engine.prefill(root).await?;
        for _ in 1..choices {
            let child = engine.fork(root).await?;
            owned.push(child);
            seqs.push(child);
        }
    }
    Ok(Started { owned, seqs })
}

/// Generates every choice of one prompt to the end; `params[i]` is choice `i`'s.
pub async fn complete(
    state: &AppState,
    prompt: &[TokenId],
    params: Vec<GenParams>,
) -> Result<Completed, ServeError> {
    let started = start(state, prompt, params.len()).await?;
    let engine = &state.engine;
    let results = join_all(
        started
            .seqs
            .iter()
            .zip(params)
            .map(|(&seq, p)| engine.generate(seq, p)),
    )
    .await;
    let generations = results.into_iter().collect::<Result<Vec<_>, _>>()?;
    let cached_tokens = started.owned.free_all().await?;
    Ok(Completed {
        generations,
        cached_tokens,
    })
}

/// Starts every choice of one prompt streaming; the caller frees `owned` at the end.
pub async fn stream(
    state: &AppState,
    prompt: &[TokenId],
    params: Vec<GenParams>,
) -> Result<(Started, Vec<TokenStream>), ServeError> {
    let started = start(state, prompt, params.len()).await?;
    let streams = started
        .seqs
        .iter()
        .zip(params)
        .map(|(&seq, p)| state.engine.generate_streaming(seq, p))
        .collect();
    Ok((started, streams))
}

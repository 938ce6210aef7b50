//! A sequence owned by one piece of work: freed when the work ends, and released
//! without waiting when the work is abandoned (its future dropped: a cancelled
//! Python call, an aborted task), so no abandoned sequence keeps KV blocks.

use crate::kv::SeqId;
use crate::model::TokenId;

use super::counters::SeqUsage;
use super::error::EngineError;
use super::handle::Engine;

/// A live sequence that is freed exactly once: by [`OwnedSeq::free`], or on drop.
pub struct OwnedSeq {
    engine: Engine,
    /// `None` once freed.
    seq: Option<SeqId>,
}

impl OwnedSeq {
    /// Starts a sequence from `prompt` (see [`Engine::add_sequence`]).
    pub async fn add(engine: &Engine, prompt: Vec<TokenId>) -> Result<Self, EngineError> {
        let seq = engine.add_sequence(prompt).await?;
        Ok(Self::adopt(engine, seq))
    }

    /// A fork of `parent` (see [`Engine::fork`]).
    pub async fn fork(engine: &Engine, parent: SeqId) -> Result<Self, EngineError> {
        let seq = engine.fork(parent).await?;
        Ok(Self::adopt(engine, seq))
    }

    /// Takes ownership of an existing sequence.
    pub fn adopt(engine: &Engine, seq: SeqId) -> Self {
        OwnedSeq {
            engine: engine.clone(),
            seq: Some(seq),
        }
    }

    /// The sequence's id.
    pub fn id(&self) -> SeqId {
        self.seq
            .expect("an OwnedSeq is only observable before it is freed")
    }

    /// Frees the sequence now and returns what it cost over its life.
    pub async fn free(mut self) -> Result<SeqUsage, EngineError> {
        let seq = self.id();
        self.seq = None;
        self.engine.free(seq).await
    }
}

impl Drop for OwnedSeq {
    fn drop(&mut self) {
        if let Some(seq) = self.seq.take() {
            self.engine.release(seq);
        }
    }
}

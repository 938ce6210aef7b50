//! What every task of a run shares: the engine, the environment, the tree
//! configuration, the token budget, and the set of sequences the run holds (so an
//! interrupted run can free what its dropped tasks left).

use std::collections::HashSet;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use crate::engine::{Engine, EngineError, SeqUsage};
use crate::env::Environment;
use crate::kv::SeqId;
use crate::model::TokenId;

use super::config::TreeConfig;
use super::error::RolloutError;

/// Shared by every task of a run.
pub struct SamplerContext {
    pub engine: Engine,
    pub env: Arc<dyn Environment>,
    pub config: TreeConfig,
    /// Stop starting branches once the engine has computed this many tokens since
    /// `computed_at_start` (`--token-budget`).
    pub token_budget: Option<u64>,
    pub computed_at_start: u64,
    /// Set once the budget is found spent; then no new branch starts anywhere.
    pub budget_spent: AtomicBool,
    /// KV blocks that must be free or evictable before a new prompt starts: under
    /// memory pressure the run finishes the forests it has before starting more.
    pub prompt_room_blocks: usize,
    /// Every sequence the run's forests hold now (branches, snapshots, roots): an
    /// interrupted run, whose tasks were dropped mid-way, frees what is left here.
    pub live: Mutex<HashSet<SeqId>>,
}

impl SamplerContext {
    fn track(&self, seq: SeqId, live: bool) {
        // A poisoned lock only means another task panicked; the set is still whole.
        let mut set = self.live.lock().unwrap_or_else(|p| p.into_inner());
        if live {
            set.insert(seq);
        } else {
            set.remove(&seq);
        }
    }

    /// [`Engine::add_sequence`], the sequence recorded as the run's.
    pub async fn add_sequence(&self, prompt: Vec<TokenId>) -> Result<SeqId, EngineError> {
        let seq = self.engine.add_sequence(prompt).await?;
        self.track(seq, true);
        Ok(seq)
    }

    /// [`Engine::fork`], the fork recorded as the run's.
    pub async fn fork(&self, seq: SeqId) -> Result<SeqId, EngineError> {
        let child = self.engine.fork(seq).await?;
        self.track(child, true);
        Ok(child)
    }

    /// [`Engine::free`] of one of the run's sequences.
    pub async fn free(&self, seq: SeqId) -> Result<SeqUsage, EngineError> {
        self.track(seq, false);
        self.engine.free(seq).await
    }

    /// Frees every sequence still recorded (after the run's tasks were dropped).
    pub async fn free_all_left(&self) {
        let left: Vec<SeqId> = {
            let mut set = self.live.lock().unwrap_or_else(|p| p.into_inner());
            set.drain().collect()
        };
        for seq in left {
            // Freed already by a task that finished its free but not its bookkeeping.
            let _ = self.engine.free(seq).await;
        }
    }

    /// Whether a new branch (or prompt) may start under the token budget. In-flight
    /// branches always finish: the budget can be overrun by what they compute.
    pub async fn may_start(&self) -> Result<bool, RolloutError> {
        let Some(budget) = self.token_budget else {
            return Ok(true);
        };
        if self.budget_spent.load(Ordering::Relaxed) {
            return Ok(false);
        }
        let computed = self.engine.stats().await?.counters.computed() - self.computed_at_start;
        if computed >= budget {
            self.budget_spent.store(true, Ordering::Relaxed);
            return Ok(false);
        }
        Ok(true)
    }
}

//! What the engine computed: every row of every forward is counted exactly once, so the
//! token budgets the product reports are measured, never estimated.

use serde::{Deserialize, Serialize};

use crate::kv::KvStats;

/// Token and step counters since the engine started.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct EngineCounters {
    /// Rows computed for prompt or appended (observation) tokens.
    pub prefilled: u64,
    /// Rows computed for sampled tokens fed back in.
    pub decoded: u64,
    /// Tokens sampled (a sampled stop token or a generation's last token is sampled
    /// but never fed back, so `sampled` ≥ `decoded`).
    pub sampled: u64,
    /// Prompt tokens served from the prefix cache instead of being prefilled.
    pub reused_prefix_cache: u64,
    /// Tokens a fork inherited from its parent without recomputing them.
    pub reused_fork: u64,
    /// Rows computed again for sequences whose KV was dropped, by a preemption under
    /// memory pressure or as stale after a weight swap, and later recomputed from
    /// their tokens.
    #[serde(default)]
    pub recomputed_preempted: u64,
    /// Times a sequence's KV was dropped to make room for another's.
    #[serde(default)]
    pub preemptions: u64,
    /// Times a live sequence's KV was dropped as stale by a weight swap (its rows
    /// are recomputed under the new weights, counted in `recomputed_preempted`).
    #[serde(default)]
    pub stale_drops: u64,
    /// Weight swaps applied.
    #[serde(default)]
    pub weight_swaps: u64,
    /// Forward passes run.
    pub steps: u64,
    /// Most bytes of KV blocks in use at once.
    pub peak_kv_bytes: u64,
}

impl EngineCounters {
    /// Rows the model computed.
    pub fn computed(&self) -> u64 {
        self.prefilled + self.decoded + self.recomputed_preempted
    }

    /// Tokens that were needed but not computed.
    pub fn reused(&self) -> u64 {
        self.reused_prefix_cache + self.reused_fork
    }
}

/// What one sequence cost over its life: the engine's counters split by sequence, so a
/// caller can account per tree or per forest. Summed over every sequence ever freed (and
/// those still live) they equal the engine's counters (test: `rollout_tests`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct SeqUsage {
    /// Rows computed for prompt, appended or scored tokens of this sequence.
    pub prefilled: u64,
    /// Rows computed for this sequence's sampled tokens fed back in.
    pub decoded: u64,
    /// Prompt tokens it found in the prefix cache.
    pub reused_prefix_cache: u64,
    /// Tokens it inherited from its parent when it was forked.
    pub reused_fork: u64,
    /// Rows computed again after it (or the parent it was forked from) was preempted.
    #[serde(default)]
    pub recomputed_preempted: u64,
    /// Times its KV was dropped under memory pressure.
    #[serde(default)]
    pub preemptions: u64,
}

impl SeqUsage {
    /// Rows the model computed for this sequence: prefilled, decoded and recomputed after
    /// preemption.
    pub fn computed(&self) -> u64 {
        self.prefilled + self.decoded + self.recomputed_preempted
    }

    /// Tokens it needed but did not compute: found in the prefix cache or inherited from a
    /// fork's parent.
    pub fn reused(&self) -> u64 {
        self.reused_prefix_cache + self.reused_fork
    }

    /// Adds `other` into `self`.
    pub fn add(&mut self, other: &SeqUsage) {
        self.prefilled += other.prefilled;
        self.decoded += other.decoded;
        self.reused_prefix_cache += other.reused_prefix_cache;
        self.reused_fork += other.reused_fork;
        self.recomputed_preempted += other.recomputed_preempted;
        self.preemptions += other.preemptions;
    }
}

/// Counters plus the KV pool's occupancy.
#[derive(Debug, Clone, Serialize)]
pub struct EngineStats {
    /// The engine's token and operation counters since it started.
    pub counters: EngineCounters,
    /// The KV pool's occupancy now.
    pub kv: KvStats,
    /// The version of the weights served now (0: those the engine started with).
    pub weight_version: super::WeightVersion,
    /// The arithmetic those weights are served with (`exact` unless they were loaded
    /// at `Precision::Fast`).
    pub precision: crate::model::Precision,
    /// Live sequences (created and not freed).
    pub sequences: usize,
    /// Sequences generating now (their callers wait for the result).
    pub generating: usize,
    /// How long each step (forward and sampling) took.
    pub step_latency: Histogram,
}

/// A latency histogram in Prometheus' cumulative-bucket shape: the engine's step
/// latencies, a server's request latencies.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Histogram {
    /// Upper bounds of the buckets, in seconds, ascending.
    pub bounds: Vec<f64>,
    /// Observations of at most `bounds[i]` seconds, per bound (cumulative: each
    /// count includes the ones below it).
    pub buckets: Vec<u64>,
    /// Observations recorded.
    pub count: u64,
    /// Sum of every observation, in seconds.
    pub sum_seconds: f64,
}

impl Histogram {
    /// Bounds for engine steps: a decode step of a small model takes milliseconds,
    /// a long prefill chunk a second or more.
    pub const STEP_BOUNDS: [f64; 12] = [
        0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0,
    ];

    /// An empty histogram over `bounds` (upper bounds in seconds, ascending).
    pub fn new(bounds: &[f64]) -> Self {
        Histogram {
            bounds: bounds.to_vec(),
            buckets: vec![0; bounds.len()],
            count: 0,
            sum_seconds: 0.0,
        }
    }

    /// Counts one observation of `seconds` in every bucket whose bound it does not exceed.
    pub fn record(&mut self, seconds: f64) {
        for (count, &bound) in self.buckets.iter_mut().zip(&self.bounds) {
            if seconds <= bound {
                *count += 1;
            }
        }
        self.count += 1;
        self.sum_seconds += seconds;
    }
}

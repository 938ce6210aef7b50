//! An optional per-step log: one JSON line per engine step, for finding where a run's
//! time goes (batch sizes over the run, the tail of few sequences, attention's share).
//!
//! Set `TREEGRPO_STEP_LOG=FILE` and every engine the process starts appends its steps
//! to FILE (created or truncated when the first engine starts). Each line:
//!
//! ```json
//! {"step":12,"t_ms":803.114,"seqs":14,"rows":14,"decode_seqs":14,"context":9120,
//!  "distinct_context":7016,"forward_ms":38.204,"sample_ms":0.411,"gap_ms":0.052}
//! ```
//!
//! `context` is the positions the step's attention reads (each sequence's cached
//! length plus its new rows, summed); `distinct_context` the positions in distinct KV
//! blocks among them (a block shared by several sequences, a prompt or a tree's
//! prefix, counted once: the K/V attention must at least bring in from memory);
//! `gap_ms` the time since the previous step ended
//! (requests, forks and frees handled between steps). Off by default: nothing is
//! written when the variable is unset (the step is timed either way, for its latency
//! histogram).

use std::collections::HashMap;
use std::fs::File;
use std::io::{BufWriter, Write};
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Instant;

use super::error::EngineError;
use crate::kv::{BlockId, KvCache, SeqId};
use crate::model::ForwardBatch;

/// The environment variable that names the log file.
pub const STEP_LOG_ENV: &str = "TREEGRPO_STEP_LOG";

/// The log file, written by whichever engine steps.
type SharedFile = Arc<Mutex<BufWriter<File>>>;

/// One file shared by every engine of the process (a server may start several).
static SHARED: Mutex<Option<(PathBuf, SharedFile)>> = Mutex::new(None);

/// What one step did and how long its parts took.
pub struct StepRecord {
    /// Sequences in the step's batch.
    pub seqs: usize,
    /// Token rows computed: every sequence's new tokens, summed.
    pub rows: usize,
    /// Sequences feeding exactly one token (decoding rather than prefilling).
    pub decode_seqs: usize,
    /// Positions the step's attention reads: each sequence's cached length plus its new
    /// rows, summed.
    pub context: usize,
    /// Positions in distinct KV blocks: `context` counts a block shared by several
    /// sequences once per sequence, this once (what attention must at least read).
    pub distinct_context: usize,
    /// Seconds the forward took.
    pub forward_s: f64,
    /// Seconds choosing the next tokens took.
    pub sample_s: f64,
}

impl StepRecord {
    /// The shape of `batch` (timings to be filled in).
    pub fn of_batch(batch: &ForwardBatch) -> Self {
        StepRecord {
            seqs: batch.seqs.len(),
            rows: batch.seqs.iter().map(|s| s.tokens.len()).sum(),
            decode_seqs: batch.seqs.iter().filter(|s| s.tokens.len() == 1).count(),
            context: batch.seqs.iter().map(|s| s.start + s.tokens.len()).sum(),
            distinct_context: 0,
            forward_s: 0.0,
            sample_s: 0.0,
        }
    }
}

/// Positions of `batch`'s attention in distinct KV blocks: each block the step reads
/// counted once, with the most positions any sequence reads from it. Walks every
/// sequence's block table, so it runs only while the log is on.
pub fn distinct_context(kv: &KvCache, batch: &ForwardBatch) -> usize {
    let bs = kv.block_size();
    let mut used: HashMap<BlockId, usize> = HashMap::new();
    for s in &batch.seqs {
        let len = s.start + s.tokens.len();
        // The step has reserved its rows, so the table covers `len` positions.
        let blocks = kv
            .table(SeqId::from_slot(s.slot))
            .map(|t| t.blocks)
            .unwrap_or_default();
        for (i, &block) in blocks.iter().take(len.div_ceil(bs)).enumerate() {
            let rows = (len - i * bs).min(bs);
            let most = used.entry(block).or_default();
            *most = (*most).max(rows);
        }
    }
    used.values().sum()
}

/// The log as one engine sees it: off, or the shared file and this engine's clock.
pub struct StepLog {
    file: Option<SharedFile>,
    started: Instant,
    last_end: Option<Instant>,
    steps: u64,
}

impl StepLog {
    /// Off unless [`STEP_LOG_ENV`] names a file; an error if it names one that
    /// cannot be created.
    pub fn from_env() -> Result<Self, EngineError> {
        let file = match std::env::var_os(STEP_LOG_ENV) {
            Some(path) if !path.is_empty() => Some(shared_file(PathBuf::from(path))?),
            _ => None,
        };
        Ok(StepLog {
            file,
            started: Instant::now(),
            last_end: None,
            steps: 0,
        })
    }

    /// Whether steps are written (their shapes need not be measured otherwise).
    pub fn is_on(&self) -> bool {
        self.file.is_some()
    }

    /// Appends one step that began at `began` and ends now. A failed write turns the
    /// log off with a warning rather than failing the step.
    pub fn record(&mut self, began: Instant, r: &StepRecord) {
        let Some(file) = &self.file else {
            return;
        };
        let now = Instant::now();
        let gap = self.last_end.map_or(0.0, |end| (began - end).as_secs_f64());
        self.last_end = Some(now);
        self.steps += 1;
        let line = format!(
            "{{\"step\":{},\"t_ms\":{:.3},\"seqs\":{},\"rows\":{},\"decode_seqs\":{},\"context\":{},\"distinct_context\":{},\"forward_ms\":{:.3},\"sample_ms\":{:.3},\"gap_ms\":{:.3}}}\n",
            self.steps,
            (began - self.started).as_secs_f64() * 1e3,
            r.seqs,
            r.rows,
            r.decode_seqs,
            r.context,
            r.distinct_context,
            r.forward_s * 1e3,
            r.sample_s * 1e3,
            gap * 1e3,
        );
        let mut w = file.lock().unwrap_or_else(|p| p.into_inner());
        // Flushed per line: a run stopped by a signal keeps every step it logged.
        if let Err(e) = w.write_all(line.as_bytes()).and_then(|_| w.flush()) {
            eprintln!("warning: {STEP_LOG_ENV}: {e}; step log off");
            drop(w);
            self.file = None;
        }
    }
}

/// The process's log file for `path`, created on first use.
fn shared_file(path: PathBuf) -> Result<SharedFile, EngineError> {
    let mut shared = SHARED.lock().unwrap_or_else(|p| p.into_inner());
    if let Some((open, file)) = shared.as_ref() {
        if *open == path {
            return Ok(file.clone());
        }
    }
    let file = File::create(&path).map_err(|source| EngineError::StepLog {
        path: path.clone(),
        source,
    })?;
    let file = Arc::new(Mutex::new(BufWriter::new(file)));
    *shared = Some((path, file.clone()));
    Ok(file)
}

//! A run folder's layout and the rules for starting in one: where the checkpoint and
//! the frozen reference live, whether a folder holds a run to resume (after putting
//! back a checkpoint an interrupted save left aside), and the rule that a fresh run
//! never replaces an existing one unless told to (`--overwrite`).

use std::path::{Path, PathBuf};

use super::error::LoopError;
use crate::durable;
use crate::train::recover_interrupted_save;

/// The checkpoint folder of a run folder.
pub fn checkpoint_dir(out: &Path) -> PathBuf {
    out.join("checkpoint")
}

/// Where a run folder keeps its frozen KL reference weights.
pub fn reference_dir(out: &Path) -> PathBuf {
    out.join("reference")
}

/// Whether the run folder `out` has a checkpoint to resume from, after putting back
/// one that a crash in the middle of a save left aside (see
/// [`recover_interrupted_save`]).
pub fn resumable(out: &Path) -> Result<bool, LoopError> {
    let dir = checkpoint_dir(out);
    if recover_interrupted_save(&dir)? {
        eprintln!(
            "warning: {}: a save was interrupted between its renames; the checkpoint \
             before it is back",
            dir.display()
        );
    }
    Ok(dir.join("loop_state.json").exists())
}

/// The rule for a fresh run's folder: one that holds a run (its log or checkpoint)
/// is refused ([`LoopError::RunExists`]) unless `overwrite`, which clears that run
/// away. Callers check it before expensive work (a warm-start); the run checks it
/// again as it starts.
pub fn prepare_fresh_folder(out: &Path, overwrite: bool) -> Result<(), LoopError> {
    match (holds_run(out), overwrite) {
        (false, _) => Ok(()),
        (true, true) => clear_run(out),
        (true, false) => Err(LoopError::RunExists(out.to_path_buf())),
    }
}

/// Whether `out` holds (part of) a training run a fresh start would destroy.
fn holds_run(out: &Path) -> bool {
    let dir = checkpoint_dir(out);
    out.join("log.jsonl").exists() || dir.exists() || durable::previous(&dir).exists()
}

/// Removes what a run left in `out` (log, checkpoints, reference weights) so a fresh
/// one starts there; other files (a warm-start's, plots) are left for it to replace.
fn clear_run(out: &Path) -> Result<(), LoopError> {
    let log = out.join("log.jsonl");
    if log.exists() {
        std::fs::remove_file(&log).map_err(|e| LoopError::Io(log.clone(), e))?;
    }
    for base in [checkpoint_dir(out), reference_dir(out)] {
        for dir in [durable::previous(&base), durable::partial(&base), base] {
            if dir.exists() {
                std::fs::remove_dir_all(&dir).map_err(|e| LoopError::Io(dir.clone(), e))?;
            }
        }
    }
    Ok(())
}

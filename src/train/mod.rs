//! The train layer: one policy-gradient update of the model the engine serves, in
//! Rust, from finished trajectories.
//!
//! - [`params`]: the decoder's weights as trainable candle `Var`s, named as in HF.
//! - [`layout`]: which rows of a packed batch attend to which (a forest of rows).
//! - [`attention`]: tree attention as a candle op with a backward of its own.
//! - [`native`]: **the** training decoder: the engine's own forward over a packed
//!   trie and hand-written backward kernels (f32).
//! - [`decoder`]: the candle-autodiff forward (f32, f64), kept as the oracle, built only from ops with a backward:
//!   log-probabilities and entropies of scored tokens.
//! - [`scoring`]: the target's log-probability and the entropy of each row of logits,
//!   one op with its own backward (no `[rows, vocab]` intermediates kept).
//! - [`loss`]: verl's dual-clip PPO loss, k3 KL, entropy bonus, TIS weights and loss
//!   aggregation, in plain Rust with its exact gradient.
//! - [`pack`]: trajectories as a trie of token prefixes (packed) or one chain each.
//! - [`optim`]: SGD, AdamW, grad-norm clipping, warm-up.
//! - [`input`]: `trajectories.jsonl` read and checked, errors naming file and line.
//! - [`checkpoint`]: HF-layout checkpoints (Q/K un-permuted), optimiser state
//!   beside them, swapped in whole.
//! - [`update`](mod@update): one update — micro-batches, accumulated gradients, one
//!   step, metrics.
//! - [`reference`](mod@reference): a frozen copy of the start weights scoring the
//!   KL's reference.
//! - [`job`]: one update of a model file into a new checkpoint (optimiser restored),
//!   as `treegrpo update` and the Python package run it.
//! - [`serving`]: the trainer's weights as a model the engine serves after a swap.
//!
//! Only `model`, `engine` and `train` touch tensors.

pub mod attention;
pub mod checkpoint;
pub mod decoder;
pub mod error;
pub mod input;
pub mod job;
pub mod layout;
pub mod loss;
pub mod native;
pub mod optim;
pub mod pack;
pub mod params;
pub mod reference;
pub mod scoring;
pub mod serving;
pub mod update;

pub use checkpoint::{
    load_optimizer, recover_interrupted_save, restore_weights, save_checkpoint, CheckpointExtras,
};
pub use decoder::{PackedBatch, Scored};
pub use error::TrainError;
pub use job::{update_checkpoint, UpdateReport};
pub use layout::TreeLayout;
pub use loss::{policy_loss, LossAgg, LossConfig, LossOutput, LossRow};
pub use optim::{Optimizer, OptimizerConfig, OptimizerKind};
pub use params::Params;
pub use reference::{fill_reference_logprobs, KlReference};
pub use update::{
    loss_and_gradients, loss_and_gradients_serving, loss_and_gradients_with_progress, update,
    update_serving, update_with_progress, Evaluated, Forwarded, TrainSample, UpdateConfig,
    UpdateMetrics, UpdateProgress,
};

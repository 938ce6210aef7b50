//! The train layer: one policy-gradient update of the model the engine serves, in
//! Rust, from finished trajectories.
//!
//! - [`params`]: the decoder's weights as trainable candle `Var`s, named as in HF.
//! - [`layout`]: which rows of a packed batch attend to which (a forest of rows).
//! - [`native`]: **the** training decoder: the engine's own forward over a packed
//!   trie and hand-written backward kernels (f32).
//! - [`decoder`]: what an update asks of a decoder (forward scores, backward into
//!   gradients); the native one implements it, and so does the oracle.
//! - `oracle` (tests only, feature `autodiff-oracle`): the candle-autodiff decoder in
//!   f32 and f64, built only from ops with a backward, that the native one is held to.
//! - [`loss`]: verl's dual-clip PPO loss, k3 KL, entropy bonus, TIS weights and loss
//!   aggregation, in plain Rust with its exact gradient.
//! - [`pack`]: trajectories as a trie of token prefixes (packed) or one chain each.
//! - [`optim`]: SGD, AdamW, grad-norm clipping, warm-up.
//! - [`input`]: `trajectories.jsonl` read and checked, errors naming file and line.
//! - [`checkpoint`]: HF-layout checkpoints (Q/K un-permuted), optimiser state
//!   beside them, swapped in whole.
//! - [`update`](mod@update): one update ([`Update`]) — micro-batches, accumulated
//!   gradients, one step, metrics.
//! - [`reference`](mod@reference): a frozen copy of the start weights scoring the
//!   KL's reference.
//! - [`checkpoint_update`]: one update of a model file into a new checkpoint (optimiser restored),
//!   as `treegrpo update` and the Python package run it.
//! - [`serving`]: the trainer's weights as a model the engine serves after a swap.
//!
//! Only `model`, `engine` and `train` touch tensors.

pub mod checkpoint;
pub mod checkpoint_update;
pub mod decoder;
pub mod error;
pub mod input;
pub mod layout;
pub mod loss;
pub mod native;
pub mod optim;
#[cfg(feature = "autodiff-oracle")]
pub mod oracle;
pub mod pack;
pub mod params;
pub mod reference;
pub mod serving;
pub mod update;

pub use checkpoint::{
    load_optimizer, recover_interrupted_save, restore_weights, save_checkpoint, CheckpointExtras,
};
pub use checkpoint_update::{update_checkpoint, UpdateReport};
pub use decoder::{Decoder, Scores};
pub use error::TrainError;
pub use layout::TreeLayout;
pub use loss::{policy_loss, LossAgg, LossConfig, LossOutput, LossRow};
pub use optim::{Optimizer, OptimizerConfig, OptimizerKind};
pub use pack::PackedBatch;
pub use params::Params;
pub use reference::{fill_reference_logprobs, KlReference};
pub use update::{
    Evaluated, Forwarded, TrainSample, Update, UpdateConfig, UpdateMetrics, UpdateProgress,
};

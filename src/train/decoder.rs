//! What an update asks of a decoder: the log-probability and entropy of each scored
//! target of a packed batch, and the gradient, for every weight, of a weighted sum of
//! those outputs (the loss's gradient with respect to them comes from `loss.rs`).
//!
//! The product has one decoder, [`NativeDecoder`](super::native::NativeDecoder): the
//! engine's own forward and hand-written backward kernels, in f32. The tests hold it
//! to a second one, the candle-autodiff decoder in f32 and f64 (`oracle/`, compiled
//! only with the `autodiff-oracle` feature that the test build turns on); both go
//! through the same update loop, so the oracle checks the loop as well.

use candle_core::Tensor;

use super::error::TrainError;
use super::pack::PackedBatch;

/// One forward's outputs, and what its backward needs.
pub struct Scores<S> {
    /// `log p` of each target under `logits / temperature`, in `score_rows` order.
    pub logp: Vec<f64>,
    /// Each scored row's entropy (nats) under the same temperature.
    pub entropy: Vec<f64>,
    /// What the decoder kept for [`Decoder::backward`].
    pub saved: S,
}

/// A differentiable decoder over a set of weights.
pub trait Decoder {
    /// What a forward keeps for its backward.
    type Saved;
    /// Where gradients accumulate across micro-batches.
    type Grads;

    /// The forward over `batch`; with `for_backward`, also what the backward reads.
    fn forward(
        &self,
        batch: &PackedBatch,
        temperature: f64,
        for_backward: bool,
    ) -> Result<Scores<Self::Saved>, TrainError>;

    /// Gradients of zero for every weight.
    fn zero_grads(&self) -> Result<Self::Grads, TrainError>;

    /// Adds to `grads` the gradient of `Σ g_logp·logp + Σ g_entropy·H` over the
    /// forward's targets.
    fn backward(
        &self,
        batch: &PackedBatch,
        saved: Self::Saved,
        g_logp: &[f64],
        g_entropy: &[f64],
        grads: &mut Self::Grads,
    ) -> Result<(), TrainError>;

    /// The accumulated gradients, one tensor per weight in
    /// [`Params::named`](super::params::Params::named) order.
    fn gradient_tensors(&self, grads: Self::Grads) -> Result<Vec<Tensor>, TrainError>;
}

//! The candle-autodiff decoder: the oracle the native trainer is held to, in f32 and
//! f64 (the finite-difference checks run in f64). Compiled only with the
//! `autodiff-oracle` feature, which the test build turns on (the dev-dependency on
//! this crate itself); the product trains on [`NativeDecoder`](super::native::NativeDecoder)
//! alone.
//!
//! - [`forward`]: the network built only from candle ops with a backward
//!   ([`Params::score`]).
//! - [`attention`]: tree attention as a candle op with a backward of its own.
//! - [`scoring`]: the target's log-probability and each row's entropy, one op with its
//!   own backward (no `[rows, vocab]` intermediates kept).
//!
//! [`AutodiffDecoder`] runs it through the update's loop: [`Update::by_autodiff`](super::update::Update::by_autodiff).

pub mod attention;
pub mod forward;
pub mod scoring;

use candle_core::{DType, Device, Tensor};

pub use forward::Scored;

use super::decoder::{Decoder, Scores};
use super::error::TrainError;
use super::pack::PackedBatch;
use super::params::Params;

/// [`Params::score`] as an update's decoder: gradients by candle's autodiff.
pub struct AutodiffDecoder<'p> {
    params: &'p Params,
}

impl<'p> AutodiffDecoder<'p> {
    /// A decoder over `params`, in their own dtype (f32 or f64).
    pub fn new(params: &'p Params) -> Self {
        AutodiffDecoder { params }
    }
}

fn to_f64(t: &Tensor) -> Result<Vec<f64>, TrainError> {
    Ok(t.to_dtype(DType::F64)?.to_vec1::<f64>()?)
}

impl Decoder for AutodiffDecoder<'_> {
    type Saved = Scored;
    type Grads = Vec<Tensor>;

    fn forward(
        &self,
        batch: &PackedBatch,
        temperature: f64,
        _for_backward: bool,
    ) -> Result<Scores<Scored>, TrainError> {
        let scored = self.params.score(batch, temperature, true)?;
        let entropy = scored.entropy.as_ref().expect("asked for entropy");
        Ok(Scores {
            logp: to_f64(&scored.logp)?,
            entropy: to_f64(entropy)?,
            saved: scored,
        })
    }

    fn zero_grads(&self) -> Result<Vec<Tensor>, TrainError> {
        self.params
            .named()
            .iter()
            .map(|(_, v)| Ok(v.as_tensor().zeros_like()?))
            .collect()
    }

    fn backward(
        &self,
        _batch: &PackedBatch,
        scored: Scored,
        g_logp: &[f64],
        g_entropy: &[f64],
        grads: &mut Vec<Tensor>,
    ) -> Result<(), TrainError> {
        let dtype = self.params.dtype();
        let weights = |g: &[f64]| -> Result<Tensor, TrainError> {
            Ok(Tensor::from_vec(g.to_vec(), g.len(), &Device::Cpu)?.to_dtype(dtype)?)
        };
        // Σ g_logp·logp + Σ g_entropy·H: its gradient is the loss's, by the chain rule.
        let mut surrogate = (&scored.logp * weights(g_logp)?)?.sum_all()?;
        if g_entropy.iter().any(|&g| g != 0.0) {
            let entropy = scored.entropy.as_ref().expect("asked for entropy");
            surrogate = (surrogate + (entropy * weights(g_entropy)?)?.sum_all()?)?;
        }
        let store = surrogate.backward()?;
        for ((_, var), acc) in self.params.named().iter().zip(grads.iter_mut()) {
            if let Some(g) = store.get(var.as_tensor()) {
                *acc = (&*acc + g)?;
            }
        }
        Ok(())
    }

    fn gradient_tensors(&self, grads: Vec<Tensor>) -> Result<Vec<Tensor>, TrainError> {
        Ok(grads)
    }
}

//! The rollout layer's error type.

use crate::engine::EngineError;
use crate::env::EnvError;
use crate::model::ModelError;

#[derive(Debug, thiserror::Error)]
pub enum RolloutError {
    #[error(transparent)]
    Engine(#[from] EngineError),
    #[error(transparent)]
    Env(#[from] EnvError),
    #[error(transparent)]
    Model(#[from] ModelError),
}

//! The rollout layer: agent trajectories (and, next, trees of them) driven through the
//! engine and an environment.
//!
//! - [`trajectory`]: one finished trajectory in the trainer's shape (token ids, loss
//!   mask, logprobs, reward).
//! - [`episode`]: runs one agent episode step by step: generate to a closing action tag,
//!   let the environment answer, append the observation as masked prompt tokens.

pub mod episode;
pub mod error;
pub mod trajectory;

pub use episode::{run_episode, EpisodeParams};
pub use error::RolloutError;
pub use trajectory::Trajectory;

//! The architecture description both loaders produce, so the forward pass never needs
//! to know which file format the weights came from.

use serde::{Deserialize, Serialize};

use super::rope::RopeScaling;

/// Decoder families the forward pass implements.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Architecture {
    /// Llama, SmolLM, Mistral: no attention biases.
    Llama,
    /// Qwen2: biases on the q/k/v projections.
    Qwen2,
}

/// How RoPE pairs the dimensions of a head.
///
/// llama.cpp's converter permutes the Q/K weights of `llama` models so that adjacent
/// dimensions form a rotation pair; HF checkpoints (and llama.cpp's `qwen2`, which it
/// runs in "neox" mode) rotate dimension `i` with `i + head_dim/2`. Using the wrong
/// one gives plausible-looking but wrong logits, so it is part of the config.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum RopeStyle {
    /// Pairs `(2i, 2i+1)`: GGUF files of the llama architecture.
    Interleaved,
    /// Pairs `(i, i + d/2)`: HF safetensors, and GGUF `qwen2`.
    HalfSplit,
}

/// Everything the forward pass needs to know about the network's shape.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ModelConfig {
    /// Which decoder family (and so which biases) the weights follow.
    pub architecture: Architecture,
    /// Tokens in the vocabulary: rows of the embedding and of the output head.
    pub vocab_size: usize,
    /// Width of the residual stream.
    pub hidden_size: usize,
    /// Width of the MLP's gate and up projections.
    pub intermediate_size: usize,
    /// Transformer blocks.
    pub num_layers: usize,
    /// Query heads per layer.
    pub num_heads: usize,
    /// Key/value heads per layer (fewer than `num_heads` under grouped-query attention;
    /// divides it).
    pub num_kv_heads: usize,
    /// Values per attention head.
    pub head_dim: usize,
    /// Epsilon added to the mean square in every RMSNorm.
    pub rms_norm_eps: f64,
    /// RoPE's base: dimension pair `i` of a head rotates at `rope_theta^(-2i/head_dim)`
    /// radians per position.
    pub rope_theta: f32,
    /// Long-context rescaling of RoPE's frequencies (absent in files written before
    /// it existed: none).
    #[serde(default)]
    pub rope_scaling: RopeScaling,
    /// Which dimensions RoPE rotates together (see [`RopeStyle`]).
    pub rope_style: RopeStyle,
    /// The context window, in tokens: positions `0..max_position_embeddings`.
    pub max_position_embeddings: usize,
    /// The output head reuses the token embedding matrix (no separate `lm_head`).
    pub tie_word_embeddings: bool,
}

impl ModelConfig {
    /// Width of one token's keys (or values) across all KV heads.
    pub fn kv_dim(&self) -> usize {
        self.num_kv_heads * self.head_dim
    }

    /// Width of one token's queries across all heads.
    pub fn q_dim(&self) -> usize {
        self.num_heads * self.head_dim
    }

    /// Bytes of KV cache one token occupies across all layers at f32.
    pub fn kv_bytes_per_token(&self) -> usize {
        2 * self.num_layers * self.kv_dim() * std::mem::size_of::<f32>()
    }

    /// Checks the relations the forward pass relies on; `what` names the source in errors.
    pub fn validate(&self) -> Result<(), String> {
        let positive = [
            ("vocab_size", self.vocab_size),
            ("hidden_size", self.hidden_size),
            ("intermediate_size", self.intermediate_size),
            ("num_layers", self.num_layers),
            ("num_heads", self.num_heads),
            ("num_kv_heads", self.num_kv_heads),
            ("head_dim", self.head_dim),
            ("max_position_embeddings", self.max_position_embeddings),
        ];
        for (name, v) in positive {
            if v == 0 {
                return Err(format!("{name} must be positive"));
            }
        }
        if !self.num_heads.is_multiple_of(self.num_kv_heads) {
            return Err(format!(
                "num_heads ({}) is not a multiple of num_kv_heads ({})",
                self.num_heads, self.num_kv_heads
            ));
        }
        if !self.head_dim.is_multiple_of(2) {
            return Err(format!(
                "head_dim ({}) must be even for RoPE",
                self.head_dim
            ));
        }
        if self.rope_theta.is_nan() || self.rope_theta <= 0.0 {
            return Err(format!("rope_theta ({}) must be positive", self.rope_theta));
        }
        Ok(())
    }
}

//! Assembles a [`Model`] from any tensor source, checking every shape against the config.
//!
//! The GGUF and safetensors loaders differ only in how tensors are named and stored;
//! they implement [`TensorSource`] and share this one builder, so a shape check or a
//! new weight is written once.

use std::path::Path;

use super::config::{Architecture, ModelConfig};
use super::error::ModelError;
use super::forward::Model;
use super::layer_forward::Layer;
use super::linear::Linear;
use super::ops::Rope;

/// A weight's place in the network, independent of the file format's naming.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Role {
    Embedding,
    FinalNorm,
    LmHead,
    AttnNorm(usize),
    Q(usize),
    K(usize),
    V(usize),
    O(usize),
    QBias(usize),
    KBias(usize),
    VBias(usize),
    FfnNorm(usize),
    Gate(usize),
    Up(usize),
    Down(usize),
}

/// Where the builder gets tensors from.
pub(crate) trait TensorSource {
    fn path(&self) -> &Path;
    /// The format's name for a role.
    fn name(&self, role: Role) -> String;
    fn contains(&self, name: &str) -> bool;
    /// The tensor's dims as stored (row-major, outermost first).
    fn dims(&self, name: &str) -> Option<Vec<usize>>;
    /// A `[out, in]` matrix as a linear layer (quantised where the file is).
    fn linear(&mut self, name: &str) -> Result<Linear, ModelError>;
    /// Any tensor, dequantised to f32 and flattened.
    fn f32s(&mut self, name: &str) -> Result<Vec<f32>, ModelError>;
}

/// Every weight a model of `config` reads, in build order: the names a checkpoint of
/// it holds (q/k/v biases for qwen2 only; the output layer only when untied).
pub(crate) fn roles(config: &ModelConfig) -> Vec<Role> {
    let mut roles = vec![Role::Embedding];
    for i in 0..config.num_layers {
        roles.extend([Role::AttnNorm(i), Role::Q(i), Role::K(i), Role::V(i)]);
        if config.architecture == Architecture::Qwen2 {
            roles.extend([Role::QBias(i), Role::KBias(i), Role::VBias(i)]);
        }
        roles.extend([
            Role::O(i),
            Role::FfnNorm(i),
            Role::Gate(i),
            Role::Up(i),
            Role::Down(i),
        ]);
    }
    roles.push(Role::FinalNorm);
    if !config.tie_word_embeddings {
        roles.push(Role::LmHead);
    }
    roles
}

fn check(src: &dyn TensorSource, name: &str, expected: &[usize]) -> Result<(), ModelError> {
    match src.dims(name) {
        None => Err(ModelError::MissingTensor {
            path: src.path().to_path_buf(),
            name: name.to_string(),
        }),
        Some(found) if found != expected => Err(ModelError::ShapeMismatch {
            path: src.path().to_path_buf(),
            name: name.to_string(),
            expected: expected.to_vec(),
            found,
        }),
        Some(_) => Ok(()),
    }
}

fn linear(
    src: &mut dyn TensorSource,
    role: Role,
    out: usize,
    inp: usize,
) -> Result<Linear, ModelError> {
    let name = src.name(role);
    check(src, &name, &[out, inp])?;
    src.linear(&name)
}

fn vector(src: &mut dyn TensorSource, role: Role, len: usize) -> Result<Vec<f32>, ModelError> {
    let name = src.name(role);
    check(src, &name, &[len])?;
    src.f32s(&name)
}

fn biased(
    src: &mut dyn TensorSource,
    role: Role,
    bias: Role,
    out: usize,
    inp: usize,
    wants_bias: bool,
) -> Result<Linear, ModelError> {
    let lin = linear(src, role, out, inp)?;
    if !wants_bias {
        return Ok(lin);
    }
    let b = vector(src, bias, out)?;
    Ok(lin.with_bias(b))
}

/// Builds the model, failing with the offending tensor's name on any mismatch.
pub(crate) fn build_model(
    config: ModelConfig,
    src: &mut dyn TensorSource,
) -> Result<Model, ModelError> {
    config.validate().map_err(|msg| ModelError::Config {
        path: src.path().to_path_buf(),
        msg,
    })?;
    let c = &config;
    let (h, q, kv, ff) = (c.hidden_size, c.q_dim(), c.kv_dim(), c.intermediate_size);
    let qkv_bias = c.architecture == Architecture::Qwen2;

    let emb_name = src.name(Role::Embedding);
    check(src, &emb_name, &[c.vocab_size, h])?;
    let embedding = src.f32s(&emb_name)?;

    let mut layers = Vec::with_capacity(c.num_layers);
    for i in 0..c.num_layers {
        layers.push(Layer {
            attn_norm: vector(src, Role::AttnNorm(i), h)?,
            q: biased(src, Role::Q(i), Role::QBias(i), q, h, qkv_bias)?,
            k: biased(src, Role::K(i), Role::KBias(i), kv, h, qkv_bias)?,
            v: biased(src, Role::V(i), Role::VBias(i), kv, h, qkv_bias)?,
            o: linear(src, Role::O(i), h, q)?,
            ffn_norm: vector(src, Role::FfnNorm(i), h)?,
            gate: linear(src, Role::Gate(i), ff, h)?,
            up: linear(src, Role::Up(i), ff, h)?,
            down: linear(src, Role::Down(i), h, ff)?,
        });
    }
    let final_norm = vector(src, Role::FinalNorm, h)?;
    // Tied embeddings: the output projection is the embedding matrix itself.
    let head_name = src.name(Role::LmHead);
    let lm_head = if !c.tie_word_embeddings && src.contains(&head_name) {
        linear(src, Role::LmHead, c.vocab_size, h)?
    } else {
        src.linear(&emb_name)?
    };
    Ok(Model {
        rope: Rope::new(c),
        config,
        embedding,
        layers,
        final_norm,
        lm_head,
        kv_format: super::KvFormat::F32,
    })
}

impl Model {
    /// A copy with every linear layer held dense in `format` (see
    /// [`Linear::to_dense`]); norms, embedding and RoPE are shared values, copied.
    pub fn densified(&self, format: super::kernels::WeightFormat) -> Result<Model, ModelError> {
        self.map_linears(|l| l.to_dense(format))
    }

    /// Fast if any linear layer is served with 8-bit activations, else exact.
    pub fn precision(&self) -> super::Precision {
        let fast = self
            .linears()
            .any(|l| l.precision() == super::Precision::Fast);
        if fast {
            super::Precision::Fast
        } else {
            super::Precision::Exact
        }
    }

    /// Whether every linear layer is already served at `precision`.
    pub fn serves_at(&self, precision: super::Precision) -> bool {
        self.linears().all(|l| l.serves_at(precision))
    }

    /// Every linear layer: the output layer, then each block's seven.
    fn linears(&self) -> impl Iterator<Item = &Linear> {
        std::iter::once(&self.lm_head).chain(
            self.layers
                .iter()
                .flat_map(|l| [&l.q, &l.k, &l.v, &l.o, &l.gate, &l.up, &l.down]),
        )
    }

    /// A copy whose linear layers are served at `precision` (see
    /// [`Linear::at_precision`]).
    /// Keys and values follow: f16 when the copy is fast ([`super::KvFormat`]).
    pub fn at_precision(&self, precision: super::Precision) -> Result<Model, ModelError> {
        let mut model = self.map_linears(|l| l.at_precision(precision))?;
        model.kv_format = match model.precision() {
            super::Precision::Fast => super::KvFormat::F16,
            super::Precision::Exact => super::KvFormat::F32,
        };
        Ok(model)
    }

    /// The format keys and values are kept in between steps.
    pub fn kv_format(&self) -> super::KvFormat {
        self.kv_format
    }

    /// A copy with `d` applied to every linear layer, the rest copied.
    fn map_linears(
        &self,
        d: impl Fn(&Linear) -> Result<Linear, ModelError>,
    ) -> Result<Model, ModelError> {
        let layers = self
            .layers
            .iter()
            .map(|l| {
                Ok(Layer {
                    attn_norm: l.attn_norm.clone(),
                    q: d(&l.q)?,
                    k: d(&l.k)?,
                    v: d(&l.v)?,
                    o: d(&l.o)?,
                    ffn_norm: l.ffn_norm.clone(),
                    gate: d(&l.gate)?,
                    up: d(&l.up)?,
                    down: d(&l.down)?,
                })
            })
            .collect::<Result<Vec<_>, ModelError>>()?;
        Ok(Model {
            config: self.config.clone(),
            embedding: self.embedding.clone(),
            layers,
            final_norm: self.final_norm.clone(),
            lm_head: d(&self.lm_head)?,
            rope: self.rope.clone(),
            kv_format: self.kv_format,
        })
    }
}

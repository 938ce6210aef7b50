//! Loads an HF model directory: `config.json`, `model.safetensors` (or a sharded
//! `model.safetensors.index.json`), `tokenizer.json` and `tokenizer_config.json`.
//! Matrices keep bf16 and f16 as stored (the kernels widen them exactly when read);
//! every other weight (norms, embeddings, other dtypes) is converted to f32.

use std::collections::{BTreeSet, HashMap};
use std::path::{Path, PathBuf};

use candle_core::{DType, Device, Tensor};
use serde::Deserialize;

use super::chat::ChatTemplate;
use super::config::{Architecture, ModelConfig, RopeStyle};
use super::error::ModelError;
use super::forward::Model;
use super::linear::Linear;
use super::tokenizer::{hf_tokenizer_file, stop_tokens, Tokenizer};
use super::weights::{build_model, Role, TensorSource};
use super::TokenId;

/// What an HF directory holds that we use.
pub struct HfModel {
    /// The network; matrices keep bf16 and f16 as stored, other dtypes become f32.
    pub model: Model,
    /// The tokenizer from `tokenizer.json`.
    pub tokenizer: Tokenizer,
    /// The chat template (`chat_template.jinja`, else `tokenizer_config.json`), `None`
    /// if the directory has none.
    pub chat_template: Option<ChatTemplate>,
}

/// The fields of `config.json` the llama and qwen2 families share.
#[derive(Debug, Deserialize)]
struct HfConfig {
    model_type: Option<String>,
    #[serde(default)]
    architectures: Vec<String>,
    vocab_size: usize,
    hidden_size: usize,
    intermediate_size: usize,
    num_hidden_layers: usize,
    num_attention_heads: usize,
    num_key_value_heads: Option<usize>,
    head_dim: Option<usize>,
    rms_norm_eps: f64,
    rope_theta: Option<f32>,
    /// transformers 5: `{"rope_type", "rope_theta", <scaling fields>}`.
    rope_parameters: Option<serde_json::Value>,
    /// transformers 4: the scaling beside a top-level `rope_theta`.
    rope_scaling: Option<serde_json::Value>,
    max_position_embeddings: usize,
    #[serde(default)]
    tie_word_embeddings: bool,
    bos_token_id: Option<TokenId>,
    eos_token_id: Option<serde_json::Value>,
}

fn read_json<T: serde::de::DeserializeOwned>(path: &Path) -> Result<T, ModelError> {
    let text = std::fs::read_to_string(path).map_err(|e| ModelError::io(path, e))?;
    serde_json::from_str(&text).map_err(|source| ModelError::ConfigJson {
        path: path.to_path_buf(),
        source,
    })
}

fn config(hf: &HfConfig, path: &Path) -> Result<ModelConfig, ModelError> {
    let kind = hf
        .model_type
        .clone()
        .or_else(|| hf.architectures.first().cloned())
        .unwrap_or_default();
    let architecture = match kind.to_lowercase().as_str() {
        "llama" | "mistral" | "llamaforcausallm" | "mistralforcausallm" => Architecture::Llama,
        "qwen2" | "qwen2forcausallm" => Architecture::Qwen2,
        _ => {
            return Err(ModelError::UnsupportedArchitecture {
                path: path.to_path_buf(),
                arch: kind,
            })
        }
    };
    let num_heads = hf.num_attention_heads;
    let (rope_theta, rope_scaling) = super::rope::from_hf_config(
        hf.rope_theta,
        hf.rope_parameters.as_ref(),
        hf.rope_scaling.as_ref(),
    )
    .map_err(|problem| ModelError::Rope {
        path: path.to_path_buf(),
        problem,
    })?;
    Ok(ModelConfig {
        architecture,
        vocab_size: hf.vocab_size,
        hidden_size: hf.hidden_size,
        intermediate_size: hf.intermediate_size,
        num_layers: hf.num_hidden_layers,
        num_heads,
        num_kv_heads: hf.num_key_value_heads.unwrap_or(num_heads),
        head_dim: hf.head_dim.unwrap_or(hf.hidden_size / num_heads.max(1)),
        rms_norm_eps: hf.rms_norm_eps,
        rope_theta,
        rope_scaling,
        rope_style: RopeStyle::HalfSplit,
        max_position_embeddings: hf.max_position_embeddings,
        tie_word_embeddings: hf.tie_word_embeddings,
    })
}

/// Loads the model in the HF directory `dir`.
pub fn load(dir: &Path) -> Result<HfModel, ModelError> {
    let config_path = dir.join("config.json");
    if !config_path.exists() {
        return Err(ModelError::Config {
            path: config_path,
            msg: "file not found (an HF model directory needs config.json)".into(),
        });
    }
    let hf: HfConfig = read_json(&config_path)?;
    let cfg = config(&hf, &config_path)?;

    let tok = hf_tokenizer_file(&dir.join("tokenizer.json"))?;
    let tok_config: serde_json::Value = match dir.join("tokenizer_config.json") {
        p if p.exists() => read_json(&p)?,
        _ => serde_json::Value::Null,
    };
    let token_of = |key: &str| -> Option<TokenId> {
        match tok_config.get(key)? {
            serde_json::Value::String(s) => tok.token_to_id(s),
            serde_json::Value::Object(o) => tok.token_to_id(o.get("content")?.as_str()?),
            _ => None,
        }
    };
    let bos = token_of("bos_token").or(hf.bos_token_id);
    let declared_eos = token_of("eos_token").or(match &hf.eos_token_id {
        Some(serde_json::Value::Number(n)) => n.as_u64().map(|v| v as TokenId),
        Some(serde_json::Value::Array(a)) => {
            a.first().and_then(|v| v.as_u64()).map(|v| v as TokenId)
        }
        _ => None,
    });
    let add_bos = tok_config
        .get("add_bos_token")
        .and_then(|v| v.as_bool())
        .unwrap_or(false);
    let eos = stop_tokens(declared_eos, |t| tok.token_to_id(t));
    let tokenizer = Tokenizer::from_hf(tok, bos, eos, add_bos);
    let chat_template = match chat_template_source(dir, &tok_config)? {
        Some(src) => Some(ChatTemplate::new(
            &src,
            tokenizer.bos_text(),
            tokenizer.eos_text(),
        )?),
        None => None,
    };

    let mut src = SafetensorsSource::open(dir)?;
    let model = build_model(cfg, &mut src)?;
    Ok(HfModel {
        model,
        tokenizer,
        chat_template,
    })
}

/// The chat template's source: `chat_template.jinja` (where transformers 5 writes
/// it; it wins over the config, as in transformers), else `tokenizer_config.json`'s
/// `chat_template`, a string or a list of named templates (the one named `default`).
fn chat_template_source(
    dir: &Path,
    tok_config: &serde_json::Value,
) -> Result<Option<String>, ModelError> {
    let file = dir.join("chat_template.jinja");
    if file.exists() {
        return std::fs::read_to_string(&file)
            .map(Some)
            .map_err(|e| ModelError::io(&file, e));
    }
    Ok(match tok_config.get("chat_template") {
        Some(serde_json::Value::String(s)) => Some(s.clone()),
        Some(serde_json::Value::Array(named)) => named
            .iter()
            .find(|t| t.get("name").and_then(|n| n.as_str()) == Some("default"))
            .and_then(|t| t.get("template")?.as_str())
            .map(str::to_string),
        _ => None,
    })
}

impl Model {
    /// A model from tensors in memory named as in an HF checkpoint (how the engine
    /// serves a trainer's weights). bf16 and f16 matrices stay in half precision, any
    /// other dtype is widened to f32; every shape is checked against `config`, and
    /// errors name `label`. The RoPE pairing is `config`'s: Q/K rows must be laid out
    /// for it.
    pub fn from_hf_tensors(
        config: ModelConfig,
        tensors: HashMap<String, Tensor>,
        label: &Path,
    ) -> Result<Model, ModelError> {
        let mut src = SafetensorsSource {
            path: label.to_path_buf(),
            tensors,
        };
        build_model(config, &mut src)
    }
}

/// All tensors of the directory's safetensors file(s), by name.
struct SafetensorsSource {
    path: PathBuf,
    tensors: HashMap<String, Tensor>,
}

impl SafetensorsSource {
    fn open(dir: &Path) -> Result<Self, ModelError> {
        let single = dir.join("model.safetensors");
        let index = dir.join("model.safetensors.index.json");
        let files: Vec<PathBuf> = if single.exists() {
            vec![single.clone()]
        } else if index.exists() {
            #[derive(Deserialize)]
            struct Index {
                weight_map: HashMap<String, String>,
            }
            let idx: Index = read_json(&index)?;
            let shards: BTreeSet<String> = idx.weight_map.into_values().collect();
            shards.into_iter().map(|s| dir.join(s)).collect()
        } else {
            return Err(ModelError::MissingTensor {
                path: dir.to_path_buf(),
                name: "model.safetensors or model.safetensors.index.json".into(),
            });
        };
        let mut tensors = HashMap::new();
        for f in &files {
            if !f.exists() {
                return Err(ModelError::io(
                    f,
                    std::io::Error::new(std::io::ErrorKind::NotFound, "shard not found"),
                ));
            }
            let loaded = candle_core::safetensors::load(f, &Device::Cpu).map_err(|source| {
                ModelError::Safetensors {
                    path: f.clone(),
                    source,
                }
            })?;
            tensors.extend(loaded);
        }
        Ok(SafetensorsSource {
            // Errors name the file the tensors came from: the index for a sharded
            // checkpoint (even one of a single shard), which says where each tensor is.
            path: if single.exists() { single } else { index },
            tensors,
        })
    }

    fn get(&self, name: &str) -> Result<Tensor, ModelError> {
        Ok(self.raw(name)?.to_dtype(DType::F32)?)
    }

    /// A tensor in the dtype the file stores it in.
    fn raw(&self, name: &str) -> Result<&Tensor, ModelError> {
        self.tensors
            .get(name)
            .ok_or_else(|| ModelError::MissingTensor {
                path: self.path.clone(),
                name: name.to_string(),
            })
    }
}

impl TensorSource for SafetensorsSource {
    fn path(&self) -> &Path {
        &self.path
    }

    fn name(&self, role: Role) -> String {
        hf_name(role)
    }

    fn contains(&self, name: &str) -> bool {
        self.tensors.contains_key(name)
    }

    fn dims(&self, name: &str) -> Option<Vec<usize>> {
        self.tensors.get(name).map(|t| t.dims().to_vec())
    }

    fn linear(&mut self, name: &str) -> Result<Linear, ModelError> {
        Linear::dense(self.raw(name)?)
    }

    fn f32s(&mut self, name: &str) -> Result<Vec<f32>, ModelError> {
        Ok(self.get(name)?.flatten_all()?.to_vec1::<f32>()?)
    }
}

/// A weight's name in an HF checkpoint (and in a transformers model's `state_dict()`).
pub(crate) fn hf_name(role: Role) -> String {
    let l = |i: usize, rest: &str| format!("model.layers.{i}.{rest}");
    match role {
        Role::Embedding => "model.embed_tokens.weight".into(),
        Role::FinalNorm => "model.norm.weight".into(),
        Role::LmHead => "lm_head.weight".into(),
        Role::AttnNorm(i) => l(i, "input_layernorm.weight"),
        Role::Q(i) => l(i, "self_attn.q_proj.weight"),
        Role::K(i) => l(i, "self_attn.k_proj.weight"),
        Role::V(i) => l(i, "self_attn.v_proj.weight"),
        Role::O(i) => l(i, "self_attn.o_proj.weight"),
        Role::QBias(i) => l(i, "self_attn.q_proj.bias"),
        Role::KBias(i) => l(i, "self_attn.k_proj.bias"),
        Role::VBias(i) => l(i, "self_attn.v_proj.bias"),
        Role::FfnNorm(i) => l(i, "post_attention_layernorm.weight"),
        Role::Gate(i) => l(i, "mlp.gate_proj.weight"),
        Role::Up(i) => l(i, "mlp.up_proj.weight"),
        Role::Down(i) => l(i, "mlp.down_proj.weight"),
    }
}

//! Loads a llama.cpp GGUF file: config from metadata, quantised weights, the tokenizer
//! and the chat template stored in the metadata.

use std::fs::File;
use std::path::{Path, PathBuf};

use candle_core::quantized::gguf_file::Content;
use candle_core::quantized::{GgmlDType, QMatMul};

use super::chat::ChatTemplate;
use super::config::{Architecture, ModelConfig, RopeStyle};
use super::error::ModelError;
use super::forward::Model;
use super::gguf_file::{read_content, read_tensor, Metadata};
use super::kernels::{PackedMatrix, WeightFormat};
use super::linear::Linear;
use super::tokenizer::{gguf_tokenizer, Tokenizer};
use super::weights::{build_model, Role, TensorSource};

/// Everything a GGUF file holds that we use.
pub struct GgufModel {
    /// The network; Q4_0, Q4_1 and Q8_0 matrices are repacked for our kernels, not
    /// dequantised.
    pub model: Model,
    /// The tokenizer the file's metadata describes.
    pub tokenizer: Tokenizer,
    /// The file's chat template (`tokenizer.chat_template`), `None` if it has none.
    pub chat_template: Option<ChatTemplate>,
}

/// Reads the architecture description from GGUF metadata.
pub fn config_from_metadata(md: &Metadata<'_>) -> Result<ModelConfig, ModelError> {
    let arch_name = md.string("general.architecture")?;
    let architecture = match arch_name {
        "llama" | "mistral" => Architecture::Llama,
        "qwen2" => Architecture::Qwen2,
        other => {
            return Err(ModelError::UnsupportedArchitecture {
                path: md.path.to_path_buf(),
                arch: other.to_string(),
            })
        }
    };
    let key = |k: &str| format!("{arch_name}.{k}");
    let hidden_size = md.usize(&key("embedding_length"))?;
    let num_heads = md.usize(&key("attention.head_count"))?;
    let num_kv_heads = md
        .opt_usize(&key("attention.head_count_kv"))?
        .unwrap_or(num_heads);
    let head_dim = match md.opt_usize(&key("attention.key_length"))? {
        Some(d) => d,
        None => hidden_size / num_heads.max(1),
    };
    let vocab_size = match md.opt_usize(&key("vocab_size"))? {
        Some(v) => v,
        None => md.strings("tokenizer.ggml.tokens")?.len(),
    };
    let rope_theta = match md.get(&key("rope.freq_base")) {
        Some(_) => md.f64(&key("rope.freq_base"))? as f32,
        None => super::rope::DEFAULT_THETA,
    };
    // llama.cpp keeps Llama 3.1's scaling as a `rope_freqs` tensor and others as a
    // scaling type; we serve neither, and say so rather than rotate by plain RoPE.
    let rope_problem = if md.content.tensor_infos.contains_key("rope_freqs.weight") {
        Some("llama3 (a rope_freqs tensor)".to_string())
    } else {
        match md.get(&key("rope.scaling.type")) {
            Some(_) => match md.string(&key("rope.scaling.type"))? {
                "none" => None,
                other => Some(other.to_string()),
            },
            None => None,
        }
    };
    if let Some(kind) = rope_problem {
        return Err(ModelError::Rope {
            path: md.path.to_path_buf(),
            problem: super::rope::RopeConfigError::UnsupportedType(format!(
                "{kind}, in a GGUF file (load the HF checkpoint instead)"
            )),
        });
    }
    Ok(ModelConfig {
        architecture,
        vocab_size,
        hidden_size,
        intermediate_size: md.usize(&key("feed_forward_length"))?,
        num_layers: md.usize(&key("block_count"))?,
        num_heads,
        num_kv_heads,
        head_dim,
        rms_norm_eps: md.f64(&key("attention.layer_norm_rms_epsilon"))?,
        rope_theta,
        rope_scaling: super::rope::RopeScaling::Default,
        // llama.cpp permutes llama Q/K for adjacent-pair RoPE and runs qwen2 in neox mode.
        rope_style: match architecture {
            Architecture::Llama => RopeStyle::Interleaved,
            Architecture::Qwen2 => RopeStyle::HalfSplit,
        },
        max_position_embeddings: md.usize(&key("context_length"))?,
        tie_word_embeddings: !md.content.tensor_infos.contains_key("output.weight"),
    })
}

/// What a GGUF header describes: the config, the tokenizer and the chat template.
pub struct GgufHeader {
    /// The architecture the metadata describes.
    pub config: ModelConfig,
    /// The tokenizer the metadata describes.
    pub tokenizer: Tokenizer,
    /// The chat template, `None` if the file has none.
    pub chat_template: Option<ChatTemplate>,
}

fn header(md: &Metadata<'_>) -> Result<GgufHeader, ModelError> {
    let config = config_from_metadata(md)?;
    let tokenizer = gguf_tokenizer(md)?;
    let chat_template = match md.get("tokenizer.chat_template") {
        Some(_) => Some(ChatTemplate::new(
            md.string("tokenizer.chat_template")?,
            tokenizer.bos_text(),
            tokenizer.eos_text(),
        )?),
        None => None,
    };
    Ok(GgufHeader {
        config,
        tokenizer,
        chat_template,
    })
}

/// Everything [`load`] reads before the weights, from a file's bytes in memory (the
/// fuzz target; `path` only names the file in errors).
pub fn read_header(bytes: &[u8], path: &Path) -> Result<GgufHeader, ModelError> {
    let content = super::gguf_file::read_content_from_bytes(bytes, path)?;
    header(&Metadata {
        content: &content,
        path,
    })
}

/// Loads weights, tokenizer and template from the GGUF file at `path`.
pub fn load(path: &Path) -> Result<GgufModel, ModelError> {
    let (file, content) = read_content(path)?;
    let md = Metadata {
        content: &content,
        path,
    };
    let GgufHeader {
        config,
        tokenizer,
        chat_template,
    } = header(&md)?;
    let mut src = GgufSource {
        path: path.to_path_buf(),
        file,
        content: &content,
    };
    let model = build_model(config, &mut src)?;
    Ok(GgufModel {
        model,
        tokenizer,
        chat_template,
    })
}

struct GgufSource<'a> {
    path: PathBuf,
    file: File,
    content: &'a Content,
}

impl TensorSource for GgufSource<'_> {
    fn path(&self) -> &Path {
        &self.path
    }

    fn name(&self, role: Role) -> String {
        match role {
            Role::Embedding => "token_embd.weight".into(),
            Role::FinalNorm => "output_norm.weight".into(),
            Role::LmHead => "output.weight".into(),
            Role::AttnNorm(i) => format!("blk.{i}.attn_norm.weight"),
            Role::Q(i) => format!("blk.{i}.attn_q.weight"),
            Role::K(i) => format!("blk.{i}.attn_k.weight"),
            Role::V(i) => format!("blk.{i}.attn_v.weight"),
            Role::O(i) => format!("blk.{i}.attn_output.weight"),
            Role::QBias(i) => format!("blk.{i}.attn_q.bias"),
            Role::KBias(i) => format!("blk.{i}.attn_k.bias"),
            Role::VBias(i) => format!("blk.{i}.attn_v.bias"),
            Role::FfnNorm(i) => format!("blk.{i}.ffn_norm.weight"),
            Role::Gate(i) => format!("blk.{i}.ffn_gate.weight"),
            Role::Up(i) => format!("blk.{i}.ffn_up.weight"),
            Role::Down(i) => format!("blk.{i}.ffn_down.weight"),
        }
    }

    fn contains(&self, name: &str) -> bool {
        self.content.tensor_infos.contains_key(name)
    }

    fn dims(&self, name: &str) -> Option<Vec<usize>> {
        self.content
            .tensor_infos
            .get(name)
            .map(|t| t.shape.dims().to_vec())
    }

    fn linear(&mut self, name: &str) -> Result<Linear, ModelError> {
        let t = read_tensor(&mut self.file, self.content, name, &self.path)?;
        let (out, inp) = t.shape().dims2()?;
        let format = match t.dtype() {
            GgmlDType::Q4_0 => Some(WeightFormat::Q4_0),
            GgmlDType::Q4_1 => Some(WeightFormat::Q4_1),
            GgmlDType::Q8_0 => Some(WeightFormat::Q8_0),
            _ => None,
        };
        match format {
            Some(format) if inp.is_multiple_of(32) => Ok(Linear::packed(PackedMatrix::from_ggml(
                format,
                out,
                inp,
                &t.data()?,
            )?)),
            _ => Ok(Linear::candle(QMatMul::from_qtensor(t)?, out, inp)),
        }
    }

    fn f32s(&mut self, name: &str) -> Result<Vec<f32>, ModelError> {
        let t = read_tensor(&mut self.file, self.content, name, &self.path)?;
        let t = t.dequantize(&candle_core::Device::Cpu)?;
        Ok(t.flatten_all()?.to_vec1::<f32>()?)
    }
}

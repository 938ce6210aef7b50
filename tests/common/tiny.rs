//! Tiny test models written by the tests themselves: seeded random weights in HF layout
//! (a directory with `config.json`, safetensors, `tokenizer.json`) and the same weights
//! as a llama.cpp-style GGUF file, plus a small byte-level BPE tokenizer for both.

use std::collections::HashMap;
use std::path::Path;

use candle_core::quantized::gguf_file::Value;
use candle_core::quantized::{GgmlDType, QTensor};
use candle_core::{DType, Device, Tensor};
use tokenizers::models::bpe::{Vocab, BPE};
use tokenizers::pre_tokenizers::byte_level::ByteLevel;
use tokenizers::pre_tokenizers::digits::Digits;
use tokenizers::pre_tokenizers::sequence::Sequence;
use tokenizers::AddedToken;
use treegrpo::model::{BatchSeq, DenseKvStore, ForwardBatch, LoadedModel, LogitsWanted};
use treegrpo::random::{SplitMix64, Uniform};

/// The ChatML template the tiny models ship.
pub const CHATML: &str = "{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>\\n' }}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}";

const SPECIALS: [&str; 3] = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"];
/// Merges of the tiny tokenizer, comma-separated, in rank order, in the byte-level
/// alphabet (`Ġ` is a space, `Ċ` a newline).
const MERGES: &str = "Ġ t,h e,Ġt he,i n,Ġ a,e r,o n,Ġ s,r e,a t,Ġ w,o r,l l,he ll,hell o,\
                      Ġ i,Ġi s,Ġ Ġ,ĠĠ ĠĠ,Ċ Ċ,e s,a n,Ġ in,Ġt in";

/// GPT-2's byte → character table, written out here so fixtures do not borrow the code
/// under test.
pub fn byte_chars() -> Vec<char> {
    let printable = |b: u8| (b'!'..=b'~').contains(&b) || (0xA1..=0xAC).contains(&b) || b >= 0xAE;
    let mut next = 256u32;
    (0..=255u8)
        .map(|b| {
            if printable(b) {
                b as char
            } else {
                next += 1;
                char::from_u32(next - 1).unwrap()
            }
        })
        .collect()
}

/// A byte-level BPE vocabulary: tokens by id, merges in rank order, special ids.
#[derive(Debug, Clone)]
pub struct Vocabulary {
    pub tokens: Vec<String>,
    pub merges: Vec<(String, String)>,
    pub specials: Vec<u32>,
}

impl Vocabulary {
    /// Special tokens, then the 256 byte characters, then one token per merge.
    pub fn tiny() -> Self {
        let mut tokens: Vec<String> = SPECIALS.iter().map(|s| s.to_string()).collect();
        tokens.extend(byte_chars().into_iter().map(String::from));
        let mut merges = Vec::new();
        for m in MERGES.split(',') {
            let (a, b) = m.split_once(' ').unwrap();
            let merged = format!("{a}{b}");
            if !tokens.contains(&merged) {
                tokens.push(merged);
            }
            merges.push((a.to_string(), b.to_string()));
        }
        Vocabulary {
            tokens,
            merges,
            specials: (0..SPECIALS.len() as u32).collect(),
        }
    }

    /// The vocabulary of a llama.cpp GGUF file (`tokenizer.ggml.*`): its tokens, its
    /// merges, and its control tokens (type 3) as the specials. With the default
    /// model's file, a tiny model speaks SmolLM2's tokens.
    pub fn from_gguf(path: &Path) -> Self {
        let mut file = std::fs::File::open(path).unwrap();
        let content = candle_core::quantized::gguf_file::Content::read(&mut file).unwrap();
        let array = |key: &str| match &content.metadata[key] {
            Value::Array(v) => v.clone(),
            other => panic!("{key}: not an array: {other:?}"),
        };
        let string = |v: &Value| v.to_string().unwrap().clone();
        let tokens: Vec<String> = array("tokenizer.ggml.tokens").iter().map(string).collect();
        let merges = array("tokenizer.ggml.merges")
            .iter()
            .map(|m| {
                let merge = string(m);
                let (a, b) = merge.split_once(' ').unwrap();
                (a.to_string(), b.to_string())
            })
            .collect();
        let specials = array("tokenizer.ggml.token_type")
            .iter()
            .enumerate()
            .filter(|(_, t)| t.to_i32().unwrap() == 3)
            .map(|(i, _)| i as u32)
            .collect();
        Vocabulary {
            tokens,
            merges,
            specials,
        }
    }

    /// SmolLM2's `tokenizer.json` layout for this vocabulary: BPE, pre-tokenizer
    /// `Sequence[Digits(individual), ByteLevel(no prefix space, regex)]`, ByteLevel
    /// decoder, special tokens as special added tokens.
    pub fn hf_tokenizer(&self) -> tokenizers::Tokenizer {
        let vocab: Vocab = self
            .tokens
            .iter()
            .enumerate()
            .map(|(i, t)| (t.clone(), i as u32))
            .collect();
        let bpe = BPE::builder()
            .vocab_and_merges(vocab, self.merges.clone())
            .build()
            .unwrap();
        let mut tok = tokenizers::Tokenizer::new(bpe);
        let pre = Sequence::new(vec![
            Digits::new(true).into(),
            ByteLevel::new(false, true, true).into(),
        ]);
        tok.with_pre_tokenizer(Some(pre));
        tok.with_decoder(Some(ByteLevel::default()));
        let added: Vec<AddedToken> = self
            .specials
            .iter()
            .map(|&id| AddedToken::from(self.tokens[id as usize].clone(), true))
            .collect();
        tok.add_special_tokens(&added);
        tok
    }

    /// The `tokenizer.*` GGUF metadata llama.cpp writes for this vocabulary.
    pub fn gguf_metadata(&self, pre: &str) -> Vec<(String, Value)> {
        let strings = |v: Vec<String>| Value::Array(v.into_iter().map(Value::String).collect());
        let types = (0..self.tokens.len() as u32)
            .map(|i| Value::I32(if self.specials.contains(&i) { 3 } else { 1 }))
            .collect();
        let merges = self.merges.iter().map(|(a, b)| format!("{a} {b}"));
        vec![
            ("tokenizer.ggml.model".into(), Value::String("gpt2".into())),
            ("tokenizer.ggml.pre".into(), Value::String(pre.into())),
            ("tokenizer.ggml.tokens".into(), strings(self.tokens.clone())),
            ("tokenizer.ggml.merges".into(), strings(merges.collect())),
            ("tokenizer.ggml.token_type".into(), Value::Array(types)),
            ("tokenizer.ggml.bos_token_id".into(), Value::U32(1)),
            ("tokenizer.ggml.eos_token_id".into(), Value::U32(2)),
            (
                "tokenizer.chat_template".into(),
                Value::String(CHATML.into()),
            ),
        ]
    }
}

/// Which family the tiny model imitates.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Flavour {
    /// No biases, tied embeddings, GGUF Q/K permuted for interleaved RoPE.
    Llama,
    /// q/k/v biases, untied `lm_head`, another rope_theta, GGUF not permuted.
    Qwen2,
}

/// A tiny model: its shape and its f32 weights under their HF names.
pub struct TinyModel {
    pub flavour: Flavour,
    pub vocab: Vocabulary,
    pub hidden: usize,
    pub layers: usize,
    pub heads: usize,
    pub kv_heads: usize,
    pub ff: usize,
    pub context: usize,
    pub rope_theta: f32,
    pub eps: f64,
    pub tensors: Vec<(String, Tensor)>,
}

/// The library's SplitMix64: a seeded generator so every run writes the same weights.
struct Rng(SplitMix64);

impl Rng {
    fn uniform(&mut self, scale: f32) -> f32 {
        let z = self.0.next_u64();
        ((z >> 40) as f32 / (1u64 << 24) as f32 * 2.0 - 1.0) * scale
    }

    fn tensor(&mut self, dims: &[usize], centre: f32, scale: f32) -> Tensor {
        let n = dims.iter().product();
        let v: Vec<f32> = (0..n).map(|_| centre + self.uniform(scale)).collect();
        Tensor::from_vec(v, dims, &Device::Cpu).unwrap()
    }
}

impl TinyModel {
    pub fn new(flavour: Flavour, seed: u64) -> Self {
        Self::with_dims(flavour, seed, 64, 128)
    }

    /// Hidden 16, FFN 32 (head_dim 4): small enough to check every weight's gradient
    /// by finite differences.
    pub fn small(flavour: Flavour, seed: u64) -> Self {
        Self::with_dims(flavour, seed, 16, 32)
    }

    /// Two layers, 4 heads over 2 KV heads, the given widths.
    pub fn with_dims(flavour: Flavour, seed: u64, hidden: usize, ff: usize) -> Self {
        Self::with_vocabulary(flavour, seed, Vocabulary::tiny(), hidden, ff)
    }

    /// Two layers, 4 heads over 2 KV heads, the given widths and vocabulary.
    pub fn with_vocabulary(
        flavour: Flavour,
        seed: u64,
        vocab: Vocabulary,
        hidden: usize,
        ff: usize,
    ) -> Self {
        let (layers, heads, kv_heads) = (2, 4, 2);
        let (q, kv, v) = (hidden, hidden / heads * kv_heads, vocab.tokens.len());
        let qwen = flavour == Flavour::Qwen2;
        let mut rng = Rng(SplitMix64::new(seed));
        let mut tensors = Vec::new();
        let mut add = |name: String, dims: &[usize], centre: f32, scale: f32| {
            tensors.push((name, rng.tensor(dims, centre, scale)));
        };
        let lin = |inp: usize| 1.5 / (inp as f32).sqrt();
        add("model.embed_tokens.weight".into(), &[v, hidden], 0.0, 1.0);
        for i in 0..layers {
            let p = |s: &str| format!("model.layers.{i}.{s}");
            add(p("input_layernorm.weight"), &[hidden], 1.0, 0.2);
            add(p("self_attn.q_proj.weight"), &[q, hidden], 0.0, lin(hidden));
            add(
                p("self_attn.k_proj.weight"),
                &[kv, hidden],
                0.0,
                lin(hidden),
            );
            add(
                p("self_attn.v_proj.weight"),
                &[kv, hidden],
                0.0,
                lin(hidden),
            );
            if qwen {
                add(p("self_attn.q_proj.bias"), &[q], 0.0, 0.5);
                add(p("self_attn.k_proj.bias"), &[kv], 0.0, 0.5);
                add(p("self_attn.v_proj.bias"), &[kv], 0.0, 0.5);
            }
            add(p("self_attn.o_proj.weight"), &[hidden, q], 0.0, lin(q));
            add(p("post_attention_layernorm.weight"), &[hidden], 1.0, 0.2);
            add(p("mlp.gate_proj.weight"), &[ff, hidden], 0.0, lin(hidden));
            add(p("mlp.up_proj.weight"), &[ff, hidden], 0.0, lin(hidden));
            add(p("mlp.down_proj.weight"), &[hidden, ff], 0.0, lin(ff));
        }
        add("model.norm.weight".into(), &[hidden], 1.0, 0.2);
        if qwen {
            add("lm_head.weight".into(), &[v, hidden], 0.0, 1.0);
        }
        let (rope_theta, eps) = if qwen { (1e6, 1e-6) } else { (1e4, 1e-5) };
        TinyModel {
            flavour,
            vocab,
            hidden,
            layers,
            heads,
            kv_heads,
            ff,
            context: 64,
            rope_theta,
            eps,
            tensors,
        }
    }

    pub fn arch(&self) -> &'static str {
        match self.flavour {
            Flavour::Llama => "llama",
            Flavour::Qwen2 => "qwen2",
        }
    }

    /// Replaces the tensor stored under the HF name `name`.
    pub fn set(&mut self, name: &str, t: Tensor) {
        let slot = self.tensors.iter_mut().find(|(n, _)| n == name).unwrap();
        slot.1 = t;
    }

    pub fn config_json(&self) -> serde_json::Value {
        serde_json::json!({
            "architectures": [if self.flavour == Flavour::Llama { "LlamaForCausalLM" } else { "Qwen2ForCausalLM" }],
            "model_type": self.arch(),
            "vocab_size": self.vocab.tokens.len(),
            "hidden_size": self.hidden,
            "intermediate_size": self.ff,
            "num_hidden_layers": self.layers,
            "num_attention_heads": self.heads,
            "num_key_value_heads": self.kv_heads,
            "rms_norm_eps": self.eps,
            "rope_theta": self.rope_theta,
            "max_position_embeddings": self.context,
            "tie_word_embeddings": self.flavour == Flavour::Llama,
            "bos_token_id": 1,
            "eos_token_id": 2,
        })
    }

    /// Writes the HF directory: weights in `dtype`, in `shards` files (1 = a single
    /// `model.safetensors`, more = `model-0000i-of-0000n.safetensors` plus an index).
    pub fn write_hf(&self, dir: &Path, dtype: DType, shards: usize) {
        std::fs::create_dir_all(dir).unwrap();
        let json = |name: &str, v: &serde_json::Value| {
            std::fs::write(dir.join(name), serde_json::to_string_pretty(v).unwrap()).unwrap()
        };
        json("config.json", &self.config_json());
        let tok_config = serde_json::json!({
            "bos_token": "<|im_start|>", "eos_token": "<|im_end|>",
            "add_bos_token": false, "chat_template": CHATML,
        });
        json("tokenizer_config.json", &tok_config);
        self.vocab
            .hf_tokenizer()
            .save(dir.join("tokenizer.json"), false)
            .unwrap();
        let per_shard = self.tensors.len().div_ceil(shards);
        let mut weight_map = serde_json::Map::new();
        for (s, chunk) in self.tensors.chunks(per_shard).enumerate() {
            let file = if shards == 1 {
                "model.safetensors".to_string()
            } else {
                format!("model-{:05}-of-{shards:05}.safetensors", s + 1)
            };
            let map: HashMap<String, Tensor> = chunk
                .iter()
                .map(|(n, t)| (n.clone(), t.to_dtype(dtype).unwrap()))
                .collect();
            candle_core::safetensors::save(&map, dir.join(&file)).unwrap();
            for (n, _) in chunk {
                weight_map.insert(n.clone(), file.clone().into());
            }
        }
        if shards > 1 {
            let index = serde_json::json!({ "metadata": {}, "weight_map": weight_map });
            json("model.safetensors.index.json", &index);
        }
    }

    /// The GGUF metadata llama.cpp would write for this model.
    pub fn gguf_metadata(&self) -> Vec<(String, Value)> {
        let a = self.arch();
        let u = |v: usize| Value::U32(v as u32);
        let mut md = vec![
            ("general.architecture".into(), Value::String(a.into())),
            (format!("{a}.block_count"), u(self.layers)),
            (format!("{a}.context_length"), u(self.context)),
            (format!("{a}.embedding_length"), u(self.hidden)),
            (format!("{a}.feed_forward_length"), u(self.ff)),
            (format!("{a}.attention.head_count"), u(self.heads)),
            (format!("{a}.attention.head_count_kv"), u(self.kv_heads)),
            (format!("{a}.rope.freq_base"), Value::F32(self.rope_theta)),
            (
                format!("{a}.attention.layer_norm_rms_epsilon"),
                Value::F32(self.eps as f32),
            ),
            (format!("{a}.vocab_size"), u(self.vocab.tokens.len())),
        ];
        md.extend(self.vocab.gguf_metadata("smollm"));
        md
    }

    /// The weights under llama.cpp names. With `permute`, Q and K are permuted the way
    /// `convert_hf_to_gguf.py` does for llama (`n_head` = KV heads for K).
    pub fn gguf_tensors(&self, permute: bool) -> Vec<(String, Tensor)> {
        self.tensors
            .iter()
            .map(|(name, t)| {
                let gguf = gguf_name(name);
                let t = if permute && gguf.ends_with("attn_q.weight") {
                    permute_qk(t, self.heads)
                } else if permute && gguf.ends_with("attn_k.weight") {
                    permute_qk(t, self.kv_heads)
                } else {
                    t.clone()
                };
                (gguf, t)
            })
            .collect()
    }

    /// Writes the GGUF the way llama.cpp's converter would (llama: Q/K permuted).
    pub fn write_gguf(&self, path: &Path) {
        self.write_gguf_quantized(path, GgmlDType::F32);
    }

    /// The same with its matrices quantised to `dtype`.
    pub fn write_gguf_quantized(&self, path: &Path, dtype: GgmlDType) {
        let permute = self.flavour == Flavour::Llama;
        write_gguf_as(
            path,
            &self.gguf_metadata(),
            &self.gguf_tensors(permute),
            dtype,
        );
    }
}

/// A tiny llama (seeded random weights, f32, HF layout) written to `dir`, with a
/// 4,096-position context: room for the tasks' prompts and long generations. The
/// model of the tests whose checks do not depend on the model.
pub fn write_long_context(dir: &Path, seed: u64) {
    let mut t = TinyModel::new(Flavour::Llama, seed);
    t.context = 4096;
    t.write_hf(dir, DType::F32, 1);
}

/// llama.cpp's name for an HF tensor name.
pub fn gguf_name(hf: &str) -> String {
    let fixed = [
        ("model.embed_tokens.weight", "token_embd.weight"),
        ("model.norm.weight", "output_norm.weight"),
        ("lm_head.weight", "output.weight"),
    ];
    if let Some((_, g)) = fixed.iter().find(|(h, _)| *h == hf) {
        return g.to_string();
    }
    let rest = hf.strip_prefix("model.layers.").unwrap();
    let (layer, rest) = rest.split_once('.').unwrap();
    let parts = [
        ("input_layernorm.", "attn_norm."),
        ("self_attn.q_proj.", "attn_q."),
        ("self_attn.k_proj.", "attn_k."),
        ("self_attn.v_proj.", "attn_v."),
        ("self_attn.o_proj.", "attn_output."),
        ("post_attention_layernorm.", "ffn_norm."),
        ("mlp.gate_proj.", "ffn_gate."),
        ("mlp.up_proj.", "ffn_up."),
        ("mlp.down_proj.", "ffn_down."),
    ];
    let (h, g) = parts.iter().find(|(h, _)| rest.starts_with(h)).unwrap();
    format!("blk.{layer}.{g}{}", &rest[h.len()..])
}

/// `w.reshape(n_head, 2, dim/n_head/2, in).swapaxes(1, 2).reshape(dim, in)`.
pub fn permute_qk(w: &Tensor, n_head: usize) -> Tensor {
    let (dim, inp) = w.dims2().unwrap();
    w.reshape((n_head, 2, dim / n_head / 2, inp))
        .and_then(|t| t.transpose(1, 2))
        .and_then(|t| t.contiguous())
        .and_then(|t| t.reshape((dim, inp)))
        .unwrap()
}

/// Writes a GGUF file with f32 tensors.
pub fn write_gguf(path: &Path, metadata: &[(String, Value)], tensors: &[(String, Tensor)]) {
    write_gguf_as(path, metadata, tensors, GgmlDType::F32);
}

/// Writes a GGUF file with every matrix whose rows are whole 32-value blocks in
/// `dtype` (e.g. Q8_0, so the model runs on our batch-invariant quantised kernel) and
/// the rest (norms) in f32.
pub fn write_gguf_as(
    path: &Path,
    metadata: &[(String, Value)],
    tensors: &[(String, Tensor)],
    dtype: GgmlDType,
) {
    let q: Vec<(String, QTensor)> = tensors
        .iter()
        .map(|(n, t)| {
            let blocks = t.dims().len() == 2 && t.dims()[1] % 32 == 0;
            let d = if blocks { dtype } else { GgmlDType::F32 };
            (n.clone(), QTensor::quantize(t, d).unwrap())
        })
        .collect();
    let md: Vec<(&str, &Value)> = metadata.iter().map(|(k, v)| (k.as_str(), v)).collect();
    let ts: Vec<(&str, &QTensor)> = q.iter().map(|(n, t)| (n.as_str(), t)).collect();
    let mut f = std::fs::File::create(path).unwrap();
    candle_core::quantized::gguf_file::write(&mut f, &md, &ts).unwrap();
}

/// The model's logits at every position of `tokens`, as one forward.
pub fn logits_all(m: &LoadedModel, tokens: &[u32]) -> Vec<Vec<f32>> {
    let cfg = m.model.config();
    let mut kv = DenseKvStore::new(cfg.num_layers, cfg.kv_dim());
    let slot = kv.add_sequence();
    let batch = ForwardBatch {
        seqs: vec![BatchSeq {
            slot,
            start: 0,
            tokens: tokens.to_vec(),
            logits: LogitsWanted::All,
        }],
    };
    m.model.forward(&batch, &mut kv).unwrap().remove(0).rows
}

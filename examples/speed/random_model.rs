//! Writes a randomly initialised HF model (f32 safetensors) of Qwen2.5-0.5B's shape:
//! 24 layers, hidden 896, 14 heads over 2 KV heads, FFN 4864, vocabulary 151,936,
//! tied embeddings, q/k/v biases, RoPE θ 1e6 — for measuring the trainer at a scale
//! past the default model's. The tokenizer and chat template are copied from an HF
//! directory given (e.g. a `treegrpo update` checkpoint of the default model, whose
//! ids all lie inside the larger vocabulary).
//!
//! `cargo run --release --example random_model -- TOKENIZER_DIR OUT_DIR`

use std::collections::HashMap;
use std::path::PathBuf;

use candle_core::{Device, Tensor};

/// splitmix64: the same weights every run.
struct Rng(u64);

impl Rng {
    fn uniform(&mut self) -> f32 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^= z >> 31;
        (z >> 40) as f32 / (1u64 << 24) as f32 * 2.0 - 1.0
    }

    fn tensor(&mut self, dims: &[usize], centre: f32, scale: f32) -> anyhow::Result<Tensor> {
        let n: usize = dims.iter().product();
        let v: Vec<f32> = (0..n).map(|_| centre + scale * self.uniform()).collect();
        Ok(Tensor::from_vec(v, dims, &Device::Cpu)?)
    }
}

fn main() -> anyhow::Result<()> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let [tokenizer_dir, out] = args.as_slice() else {
        anyhow::bail!("usage: random_model TOKENIZER_DIR OUT_DIR");
    };
    let (tokenizer_dir, out) = (PathBuf::from(tokenizer_dir), PathBuf::from(out));
    let (layers, hidden, heads, kv_heads, ff, vocab) = (24, 896, 14, 2, 4864, 151_936);
    let head_dim = hidden / heads;
    let kv = kv_heads * head_dim;
    std::fs::create_dir_all(&out)?;
    for file in ["tokenizer.json", "tokenizer_config.json"] {
        std::fs::copy(tokenizer_dir.join(file), out.join(file))?;
    }
    let config = serde_json::json!({
        "architectures": ["Qwen2ForCausalLM"],
        "model_type": "qwen2",
        "vocab_size": vocab,
        "hidden_size": hidden,
        "intermediate_size": ff,
        "num_hidden_layers": layers,
        "num_attention_heads": heads,
        "num_key_value_heads": kv_heads,
        "rms_norm_eps": 1e-6,
        "rope_theta": 1_000_000.0,
        "max_position_embeddings": 32768,
        "tie_word_embeddings": true,
        "bos_token_id": 1,
        "eos_token_id": 2,
    });
    std::fs::write(
        out.join("config.json"),
        serde_json::to_string_pretty(&config)?,
    )?;
    let mut rng = Rng(0x5eed);
    let lin = |inp: usize| 1.0 / (inp as f32).sqrt();
    let mut tensors: HashMap<String, Tensor> = HashMap::new();
    tensors.insert(
        "model.embed_tokens.weight".into(),
        rng.tensor(&[vocab, hidden], 0.0, 0.05)?,
    );
    for i in 0..layers {
        let p = |s: &str| format!("model.layers.{i}.{s}");
        let mut add = |name: String, t: Tensor| {
            tensors.insert(name, t);
        };
        add(
            p("input_layernorm.weight"),
            rng.tensor(&[hidden], 1.0, 0.1)?,
        );
        add(
            p("self_attn.q_proj.weight"),
            rng.tensor(&[hidden, hidden], 0.0, lin(hidden))?,
        );
        add(
            p("self_attn.k_proj.weight"),
            rng.tensor(&[kv, hidden], 0.0, lin(hidden))?,
        );
        add(
            p("self_attn.v_proj.weight"),
            rng.tensor(&[kv, hidden], 0.0, lin(hidden))?,
        );
        add(p("self_attn.q_proj.bias"), rng.tensor(&[hidden], 0.0, 0.1)?);
        add(p("self_attn.k_proj.bias"), rng.tensor(&[kv], 0.0, 0.1)?);
        add(p("self_attn.v_proj.bias"), rng.tensor(&[kv], 0.0, 0.1)?);
        add(
            p("self_attn.o_proj.weight"),
            rng.tensor(&[hidden, hidden], 0.0, lin(hidden))?,
        );
        add(
            p("post_attention_layernorm.weight"),
            rng.tensor(&[hidden], 1.0, 0.1)?,
        );
        add(
            p("mlp.gate_proj.weight"),
            rng.tensor(&[ff, hidden], 0.0, lin(hidden))?,
        );
        add(
            p("mlp.up_proj.weight"),
            rng.tensor(&[ff, hidden], 0.0, lin(hidden))?,
        );
        add(
            p("mlp.down_proj.weight"),
            rng.tensor(&[hidden, ff], 0.0, lin(ff))?,
        );
    }
    tensors.insert("model.norm.weight".into(), rng.tensor(&[hidden], 1.0, 0.1)?);
    candle_core::safetensors::save(&tensors, out.join("model.safetensors"))?;
    let params: usize = tensors.values().map(|t| t.elem_count()).sum();
    println!("{}: {params} parameters", out.display());
    Ok(())
}

//! Prefill and decode speed of our forward beside candle-transformers' quantised llama
//! on the same GGUF, measured in one process (release build):
//!
//! `cargo run --release --example model_speed [-- MODEL.gguf]`

use std::time::Instant;

use candle_core::{Device, Tensor};
use candle_transformers::models::quantized_llama::ModelWeights;
use treegrpo::model::{BatchSeq, DenseKvStore, ForwardBatch, KvSlot, LoadedModel, LogitsWanted};

const PREFILL: usize = 256;
const DECODE: usize = 64;

fn main() -> anyhow::Result<()> {
    let path = match std::env::args().nth(1) {
        Some(p) => p.into(),
        None => treegrpo::model::fetch::ensure_default_model(&mut |m| eprintln!("{m}"))?,
    };
    let m = LoadedModel::load(&path)?;
    let cfg = m.model.config().clone();
    let text = "The quick brown fox jumps over the lazy dog. ".repeat(64);
    let prompt: Vec<u32> = m.tokenizer.encode(&text, false)?[..PREFILL].to_vec();
    println!("threads: {}", rayon::current_num_threads());

    // Ours: prefill in one forward, then batch-1 decode.
    let mut kv = DenseKvStore::new(cfg.num_layers, cfg.kv_dim());
    let slot = kv.add_sequence();
    let t = Instant::now();
    let batch = |start: usize, tokens: Vec<u32>| ForwardBatch {
        seqs: vec![BatchSeq {
            slot,
            start,
            tokens,
            logits: LogitsWanted::Last,
        }],
    };
    m.model.forward(&batch(0, prompt.clone()), &mut kv)?;
    let prefill_ours = PREFILL as f64 / t.elapsed().as_secs_f64();
    let t = Instant::now();
    for (i, &tok) in prompt.iter().take(DECODE).enumerate() {
        m.model.forward(&batch(PREFILL + i, vec![tok]), &mut kv)?;
    }
    let decode_ours = DECODE as f64 / t.elapsed().as_secs_f64();

    // Ours, batched decode: B sequences of 16 prompt tokens, one new token each per step.
    let mut batched = Vec::new();
    for b in [8usize, 32] {
        let mut kv = DenseKvStore::new(cfg.num_layers, cfg.kv_dim());
        let slots: Vec<KvSlot> = (0..b).map(|_| kv.add_sequence()).collect();
        let fb = |start: usize, n: usize| ForwardBatch {
            seqs: slots
                .iter()
                .map(|&s| BatchSeq {
                    slot: s,
                    start,
                    tokens: prompt[start..start + n].to_vec(),
                    logits: LogitsWanted::Last,
                })
                .collect(),
        };
        m.model.forward(&fb(0, 16), &mut kv)?;
        let steps = 16;
        let t = Instant::now();
        for i in 0..steps {
            m.model.forward(&fb(16 + i, 1), &mut kv)?;
        }
        batched.push((b, (b * steps) as f64 / t.elapsed().as_secs_f64()));
    }

    // candle-transformers' quantised llama (its default CPU mode).
    let mut file = std::fs::File::open(&path)?;
    let content = candle_core::quantized::gguf_file::Content::read(&mut file)?;
    let mut cm = ModelWeights::from_gguf(content, &mut file, &Device::Cpu)?;
    let x = Tensor::new(prompt.as_slice(), &Device::Cpu)?.unsqueeze(0)?;
    let t = Instant::now();
    cm.forward(&x, 0)?;
    let prefill_candle = PREFILL as f64 / t.elapsed().as_secs_f64();
    let t = Instant::now();
    for (i, &tok) in prompt.iter().take(DECODE).enumerate() {
        let x = Tensor::new(&[tok], &Device::Cpu)?.unsqueeze(0)?;
        cm.forward(&x, PREFILL + i)?;
    }
    let decode_candle = DECODE as f64 / t.elapsed().as_secs_f64();

    println!(
        "| engine | prefill tok/s ({PREFILL} tokens) | decode tok/s, batch 1 (after {PREFILL}) |"
    );
    println!("|---|---|---|");
    println!("| treegrpo | {prefill_ours:.0} | {decode_ours:.1} |");
    println!("| candle-transformers quantized_llama | {prefill_candle:.0} | {decode_candle:.1} |");
    for (b, tps) in batched {
        println!("treegrpo aggregate decode at batch {b}: {tps:.1} tok/s");
    }
    Ok(())
}

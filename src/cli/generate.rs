//! `treegrpo generate`: one prompt in, its completion on stdout, timings on stderr.

use std::path::PathBuf;
use std::time::Instant;

use clap::Args;
use treegrpo::engine::{generate, GenParams, GenerateRequest};
use treegrpo::model::ChatMessage;

#[derive(Debug, Args)]
pub struct GenerateArgs {
    /// The user message (or, with --raw, the exact prompt text).
    #[arg(long)]
    prompt: String,
    /// A .gguf file or an HF directory (default: the default model, fetched on first use).
    #[arg(long)]
    model: Option<PathBuf>,
    /// Most tokens to generate.
    #[arg(long, default_value_t = 128)]
    max_tokens: usize,
    #[command(flatten)]
    sampling: super::flags::SamplingFlags,
    /// Seed of the sampling RNG.
    #[arg(long, default_value_t = 0)]
    seed: u64,
    /// Feed the prompt as is, without the model's chat template.
    #[arg(long)]
    raw: bool,
    #[command(flatten)]
    precision: super::flags::PrecisionFlag,
}

pub fn run(a: GenerateArgs) -> anyhow::Result<()> {
    // The options first, by the rule every way in shares (before the model loads).
    let sampling = a.sampling.sampling()?;
    let penalties = a.sampling.penalties()?;
    GenParams {
        sampling,
        penalties,
        ..GenParams::greedy(a.max_tokens)
    }
    .validate()?;
    let m = a.precision.apply(super::load_model(a.model.as_deref())?)?;
    let prompt = if a.raw {
        m.tokenizer.encode_prompt(&a.prompt)?
    } else {
        m.chat_prompt(&[ChatMessage::new("user", a.prompt.clone())])?
    };
    let req = GenerateRequest {
        prompt: prompt.clone(),
        max_new_tokens: a.max_tokens,
        sampling,
        seed: a.seed,
        stop_tokens: m.tokenizer.eos_ids().to_vec(),
        prefill_chunk: 512,
        penalties,
    };
    let t0 = Instant::now();
    let out = generate(&m.model, &req)?;
    let secs = t0.elapsed().as_secs_f64();
    let ids: Vec<u32> = out.tokens.iter().map(|t| t.token).collect();
    println!("{}", m.tokenizer.decode(&ids)?);
    eprintln!(
        "[{} prompt tokens, {} generated in {:.2}s, stop: {:?}]",
        prompt.len(),
        ids.len(),
        secs,
        out.stop
    );
    Ok(())
}

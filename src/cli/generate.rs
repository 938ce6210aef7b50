//! `treegrpo generate`: one prompt in, its completion on stdout, timings on stderr.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Instant;

use clap::Args;
use treegrpo::engine::{EngineConfig, EngineCore};
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
    a.sampling.gen_params(a.max_tokens, a.seed, Vec::new())?;
    let m = Arc::new(a.precision.apply(super::load_model(a.model.as_deref())?)?);
    let prompt = if a.raw {
        m.tokenizer.encode_prompt(&a.prompt)?
    } else {
        m.chat_prompt(&[ChatMessage::new("user", a.prompt.clone())])?
    };
    let params = a
        .sampling
        .gen_params(a.max_tokens, a.seed, m.tokenizer.eos_ids().to_vec())?;
    let t0 = Instant::now();
    // The engine's one generation loop, with a single sequence: the same tokens as
    // in any batch (each row's arithmetic is fixed, the draw seeded by the params).
    let mut core = EngineCore::new(m.clone(), EngineConfig::default())?;
    let seq = core.add_sequence(&prompt)?;
    core.generate(seq, params)?;
    core.run_until_idle()?;
    let out = core
        .take_finished()
        .into_iter()
        .find(|(s, _)| *s == seq)
        .map(|(_, g)| g)
        .ok_or_else(|| anyhow::anyhow!("the engine finished without the generation"))??;
    let secs = t0.elapsed().as_secs_f64();
    println!("{}", m.tokenizer.decode(&out.tokens)?);
    eprintln!(
        "[{} prompt tokens, {} generated in {:.2}s, stop: {:?}]",
        prompt.len(),
        out.tokens.len(),
        secs,
        out.stop
    );
    Ok(())
}

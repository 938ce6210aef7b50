//! `treegrpo bench`: every rollout mode on the same prompts and seed, as a markdown
//! table or JSON (the figures BENCHMARKS.md quotes).

use std::path::PathBuf;
use std::sync::Arc;

use clap::Args;
use treegrpo::bench::{
    bench_rows, engine_decode_tokens_per_second, engine_prefill_tokens_per_second, machine_info,
    markdown, prefill_prompt, run_mode, BenchReport, BenchRow, BenchSettings, DecodeSpeed,
};
use treegrpo::engine::Sampling;
use treegrpo::env::{Environment, QaSample};
use treegrpo::model::LoadedModel;

use super::progress::Progress;

#[derive(Debug, Args)]
pub struct BenchArgs {
    #[command(flatten)]
    pub source: super::flags::TaskFlags,
    #[arg(long, default_value_t = 16)]
    pub prompts: usize,
    #[command(flatten)]
    pub step: super::flags::StepFlags,
    /// Run only these modes, comma-separated: names (`chain-4`, `tree-2-2-1`,
    /// `tree-2-2-1-reference`, `tree-1-2-1`, `tree-2-6-1`, `tree-4-5-1`,
    /// `tree-recompute-2-2-1`, and `mistralrs-chain-4` with the `mistralrs` feature) or
    /// kinds (`chain`, `tree`, `tree-recompute`, `mistralrs-chain`).
    #[arg(long, value_delimiter = ',')]
    pub only: Vec<String>,
    /// Batch sizes at which to measure decode tokens/s (`--decode-batches` with no
    /// value: skip the decode measurement).
    #[arg(long, value_delimiter = ',', num_args = 0.., default_value = "1,16")]
    pub decode_batches: Vec<usize>,
    /// Tokens each sequence generates in the decode measurement.
    #[arg(long, default_value_t = 64)]
    pub decode_tokens: usize,
    /// Prompt length the decode measurement starts from (0: the short chat prompt;
    /// e.g. 4096 for long-context attention). A long prompt is prefilled once and
    /// shared by the batch's sequences, in both engines.
    #[arg(long, default_value_t = 0)]
    pub decode_context: usize,
    /// Prompt length of the prefill measurement (0: skip it).
    #[arg(long, default_value_t = 256)]
    pub prefill_tokens: usize,
    /// Timed prefill runs (after one warm-up); the median is reported.
    #[arg(long, default_value_t = 3)]
    pub prefill_runs: usize,
    /// KV cache budget in MiB (default: a quarter of the available memory, between
    /// 512 MiB and 8 GiB). A smaller pool is slower, never wrong: sequences that do
    /// not fit at once are preempted and recomputed.
    #[arg(long)]
    pub kv_mib: Option<usize>,
    /// Most prompts grown at once (0: all).
    #[arg(long, default_value_t = 16)]
    pub concurrent_prompts: usize,
    /// Weights the engine serves: `native` (as the file stores them), or every
    /// linear layer held dense as `f32` (exactly the file's values) or `bf16` (what a
    /// trainer's weights are served as).
    #[arg(long, default_value = "native")]
    pub weights: ServedWeights,
    #[command(flatten)]
    pub precision: super::flags::PrecisionFlag,
    /// Print JSON instead of the markdown table.
    #[arg(long)]
    pub json: bool,
}

/// `--weights`: the file's own format, or dense.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum ServedWeights {
    Native,
    F32,
    Bf16,
}

impl ServedWeights {
    /// Loads `path` and converts its layers as asked.
    pub fn load(self, path: &std::path::Path) -> anyhow::Result<treegrpo::model::LoadedModel> {
        use treegrpo::model::kernels::WeightFormat;
        let model = treegrpo::model::LoadedModel::load(path)?;
        Ok(match self {
            ServedWeights::Native => model,
            ServedWeights::F32 => model.with_dense_weights(WeightFormat::F32)?,
            ServedWeights::Bf16 => model.with_dense_weights(WeightFormat::Bf16)?,
        })
    }
}

/// What every row measures on: the model, the task's prompts, the shared settings.
struct Workload {
    model_path: PathBuf,
    model: Arc<LoadedModel>,
    env: Arc<dyn Environment>,
    samples: Vec<QaSample>,
}

/// The peer engines measured beside ours (each only with its feature).
struct Peers {
    /// mistral.rs's chain row is wanted, and so its decode speed.
    #[cfg(feature = "mistralrs")]
    mistralrs: bool,
    /// llama.cpp, measured beside every decode and prefill figure of ours.
    #[cfg(feature = "llamacpp")]
    llamacpp: Option<treegrpo::peer::LlamaCppPeer>,
}

pub fn run(a: BenchArgs) -> anyhow::Result<()> {
    anyhow::ensure!(a.prompts > 0, "--prompts must be at least 1");
    let sampling = Sampling::new(a.step.temperature, None, None, None)?;
    let rows = bench_rows(&a.only);
    anyhow::ensure!(!rows.is_empty(), "--only matched no mode");
    let work = load(&a)?;
    let mut report = BenchReport {
        machine: machine_info(),
        model: work.model_path.display().to_string(),
        weights: format!("{:?}", a.weights).to_lowercase(),
        precision: a.precision.precision.name().to_string(),
        task: format!("{:?}", a.source.task),
        settings: BenchSettings {
            prompts: work.samples.len(),
            seed: a.step.seed,
            sampling,
            max_step_tokens: a.step.max_step_tokens,
            kv_budget_bytes: super::flags::kv_budget_bytes(a.kv_mib),
            max_concurrent_prompts: a.concurrent_prompts,
        },
        runs: Vec::new(),
        decode: Vec::new(),
        prefill: Vec::new(),
    };
    let peers = peers(&a, &rows, &work, &report)?;
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    measure_rows(&rt, &work, &rows, &mut report)?;
    measure_decode(&a, &rt, &work, &peers, &mut report)?;
    measure_prefill(&a, &rt, &work, &peers, &mut report)?;
    report.fill_ratios();
    if a.json {
        println!("{}", serde_json::to_string_pretty(&report)?);
    } else {
        print!("{}", markdown(&report));
    }
    Ok(())
}

/// The model as `--weights` and `--precision` ask, and the task's prompts.
fn load(a: &BenchArgs) -> anyhow::Result<Workload> {
    let model_path =
        treegrpo::model::fetch::model_path_or_default(a.source.model.as_deref(), &mut |m| {
            eprintln!("{m}")
        })?;
    let model = Arc::new(a.precision.apply(a.weights.load(&model_path)?)?);
    let (env, samples) = a
        .source
        .task
        .setup(&a.source.data(), a.step.turns, a.prompts)?;
    Ok(Workload {
        model_path,
        model,
        env,
        samples,
    })
}

/// The peers this build and these rows measure (llama.cpp loaded here).
// The peers' arguments are unused in a build without them.
#[cfg_attr(
    not(any(feature = "mistralrs", feature = "llamacpp")),
    allow(unused_variables)
)]
fn peers(
    a: &BenchArgs,
    rows: &[BenchRow],
    work: &Workload,
    report: &BenchReport,
) -> anyhow::Result<Peers> {
    Ok(Peers {
        #[cfg(feature = "mistralrs")]
        mistralrs: rows.iter().any(|r| matches!(r, BenchRow::PeerChain(_))),
        #[cfg(feature = "llamacpp")]
        llamacpp: if a.decode_batches.is_empty() && a.prefill_tokens == 0 {
            None
        } else {
            eprintln!("loading {} into llama.cpp …", work.model_path.display());
            Some(treegrpo::peer::LlamaCppPeer::load(
                &work.model_path,
                report.machine.forward_threads,
            )?)
        },
    })
}

/// Every row on the same prompts and seed, each one's figures on stderr as it ends
/// (a long run stopped early still shows what it measured).
fn measure_rows(
    rt: &tokio::runtime::Runtime,
    work: &Workload,
    rows: &[BenchRow],
    report: &mut BenchReport,
) -> anyhow::Result<()> {
    // A bar over the rows and, under it, one over the row's prompts.
    let prompts = work.samples.len() as u64;
    let modes = Progress::new("bench", "modes", rows.len() as u64);
    let row_bar = modes.below("bench", "prompts", prompts);
    for (i, row) in rows.iter().enumerate() {
        let run = match row {
            BenchRow::Ours(mode) => {
                modes.update(i as u64, format!("running {}", mode.label));
                row_bar.restart(&mode.label, "prompts", prompts);
                let shown = row_bar.clone();
                let progress = move |p: treegrpo::rollout::Progress| {
                    shown.update(p.prompts_done as u64, super::rollout::rollout_message(&p));
                };
                rt.block_on(run_mode(
                    &work.model,
                    work.env.clone(),
                    &work.samples,
                    mode,
                    &report.settings,
                    Some(Box::new(progress)),
                ))?
            }
            #[cfg(feature = "mistralrs")]
            BenchRow::PeerChain(chains) => {
                let label = format!("mistralrs-chain-{chains}");
                modes.update(i as u64, format!("running {label}"));
                row_bar.status(&label, "running (mistral.rs reports no progress)");
                rt.block_on(treegrpo::bench::run_mistralrs_chain(
                    &work.model_path,
                    &work.model,
                    work.env.clone(),
                    &work.samples,
                    *chains,
                    &report.settings,
                ))?
            }
        };
        // The row's last figures (a pipe's line), then its JSON.
        row_bar.finish();
        modes.println(serde_json::to_string(&run)?);
        modes.update(i as u64 + 1, String::new());
        report.runs.push(run);
    }
    row_bar.clear();
    modes.finish();
    Ok(())
}

/// Decode tokens/s at each `--decode-batches` size, ours and the peers'.
// The peers' arguments are unused in a build without them.
#[cfg_attr(
    not(any(feature = "mistralrs", feature = "llamacpp")),
    allow(unused_variables)
)]
fn measure_decode(
    a: &BenchArgs,
    rt: &tokio::runtime::Runtime,
    work: &Workload,
    peers: &Peers,
    report: &mut BenchReport,
) -> anyhow::Result<()> {
    if a.decode_batches.is_empty() {
        return Ok(());
    }
    let prompt = if a.decode_context > 0 {
        prefill_prompt(&work.model, a.decode_context)?
    } else {
        treegrpo::bench::decode_prompt(&work.model)?
    };
    for &batch in &a.decode_batches {
        eprintln!("decode speed at batch {batch}, context {} …", prompt.len());
        let speed = rt.block_on(engine_decode_tokens_per_second(
            &work.model,
            &prompt,
            batch,
            a.decode_tokens,
        ))?;
        record_decode(report, speed)?;
        // The mistral.rs peer decodes from the short chat prompt only.
        #[cfg(feature = "mistralrs")]
        if peers.mistralrs && a.decode_context == 0 {
            eprintln!("mistral.rs decode speed at batch {batch} …");
            let speed = rt.block_on(treegrpo::bench::peer_decode_tokens_per_second(
                &work.model_path,
                &work.model,
                batch,
                a.decode_tokens,
            ))?;
            record_decode(report, speed)?;
        }
        #[cfg(feature = "llamacpp")]
        if let Some(peer) = &peers.llamacpp {
            eprintln!("llama.cpp decode speed at batch {batch} …");
            let speed = treegrpo::bench::llamacpp_decode_tokens_per_second(
                peer,
                &prompt,
                batch,
                a.decode_tokens,
            )?;
            record_decode(report, speed)?;
        }
    }
    Ok(())
}

/// Prefill tokens/s of one `--prefill-tokens` prompt, ours and llama.cpp's.
// The peers' arguments are unused in a build without them.
#[cfg_attr(
    not(any(feature = "mistralrs", feature = "llamacpp")),
    allow(unused_variables)
)]
fn measure_prefill(
    a: &BenchArgs,
    rt: &tokio::runtime::Runtime,
    work: &Workload,
    peers: &Peers,
    report: &mut BenchReport,
) -> anyhow::Result<()> {
    if a.prefill_tokens == 0 {
        return Ok(());
    }
    let prompt = prefill_prompt(&work.model, a.prefill_tokens)?;
    eprintln!("prefill speed of {} tokens …", prompt.len());
    let speed = rt.block_on(engine_prefill_tokens_per_second(
        &work.model,
        &prompt,
        a.prefill_runs,
    ))?;
    eprintln!("{}", serde_json::to_string(&speed)?);
    report.prefill.push(speed);
    #[cfg(feature = "llamacpp")]
    if let Some(peer) = &peers.llamacpp {
        eprintln!("llama.cpp prefill speed of {} tokens …", prompt.len());
        let speed =
            treegrpo::bench::llamacpp_prefill_tokens_per_second(peer, &prompt, a.prefill_runs)?;
        eprintln!("{}", serde_json::to_string(&speed)?);
        report.prefill.push(speed);
    }
    Ok(())
}

/// Keeps a decode figure, printing its JSON on stderr at once (as the rows are).
fn record_decode(report: &mut BenchReport, speed: DecodeSpeed) -> anyhow::Result<()> {
    eprintln!("{}", serde_json::to_string(&speed)?);
    report.decode.push(speed);
    Ok(())
}

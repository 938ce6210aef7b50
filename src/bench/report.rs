//! The benchmark's outputs: a markdown table (what BENCHMARKS.md quotes)
//! and a JSON document (`--json`) with the machine it ran on.

use serde::Serialize;

use super::decode::DecodeSpeed;
use super::modes::{BenchRun, BenchSettings, ModeKind};
use super::prefill::PrefillSpeed;

/// Where the figures were measured.
#[derive(Debug, Clone, Serialize)]
pub struct MachineInfo {
    /// The CPU model from `/proc/cpuinfo` (`unknown` where there is none).
    pub cpu: String,
    /// Logical CPUs the process may use.
    pub threads: usize,
    /// Operating system and architecture, e.g. `linux x86_64`.
    pub os: String,
    /// Threads rayon's pool has (the trainer's and standalone matmuls).
    pub rayon_threads: usize,
    /// Members of the forward's thread team (`TREEGRPO_THREADS`).
    pub forward_threads: usize,
    /// The kernel variant every matmul ran on (`avx512`, `avx2` or `scalar`).
    pub kernel: String,
}

/// Reads the CPU model from `/proc/cpuinfo` (Linux) and the thread counts.
pub fn machine_info() -> MachineInfo {
    let cpu = std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|text| {
            text.lines()
                .find(|l| l.starts_with("model name"))
                .and_then(|l| l.split(':').nth(1))
                .map(|s| s.trim().to_string())
        })
        .unwrap_or_else(|| "unknown".into());
    MachineInfo {
        cpu,
        threads: std::thread::available_parallelism().map_or(1, |n| n.get()),
        os: format!("{} {}", std::env::consts::OS, std::env::consts::ARCH),
        rayon_threads: rayon::current_num_threads(),
        forward_threads: crate::model::team::global().size(),
        kernel: crate::model::kernels::Isa::active().name().to_string(),
    }
}

/// The whole benchmark (`--json`).
#[derive(Debug, Clone, Serialize)]
pub struct BenchReport {
    /// The machine the figures were measured on.
    pub machine: MachineInfo,
    /// Path of the model file served.
    pub model: String,
    /// `native`, `f32` or `bf16`: the weights the engine served (`--weights`).
    pub weights: String,
    /// `exact` or `fast` (`--precision`).
    pub precision: String,
    /// The task whose prompts the rollout rows ran.
    pub task: String,
    /// What every rollout row shared.
    pub settings: BenchSettings,
    /// The rollout rows, in the order measured.
    pub runs: Vec<BenchRun>,
    /// Decode speeds, ours and the peers', per batch size.
    pub decode: Vec<DecodeSpeed>,
    /// Prefill speeds, ours and the peers', per prompt length.
    pub prefill: Vec<PrefillSpeed>,
}

impl BenchReport {
    /// Fills in every run's ratios against the first `chain` run, and every peer's
    /// decode and prefill figure's ratio to ours at the same batch or prompt length.
    pub fn fill_ratios(&mut self) {
        let ours = |d: &DecodeSpeed| d.engine == "treegrpo";
        let decode_ours: Vec<DecodeSpeed> =
            self.decode.iter().filter(|d| ours(d)).copied().collect();
        for d in self.decode.iter_mut().filter(|d| !ours(d)) {
            d.treegrpo_ratio = decode_ours
                .iter()
                .find(|o| {
                    o.batch == d.batch && o.context == d.context && o.new_tokens == d.new_tokens
                })
                .and_then(|o| ratio(o.tokens_per_second, d.tokens_per_second));
        }
        let prefill_ours: Vec<PrefillSpeed> = self
            .prefill
            .iter()
            .filter(|p| p.engine == "treegrpo")
            .copied()
            .collect();
        for p in self.prefill.iter_mut().filter(|p| p.engine != "treegrpo") {
            p.treegrpo_ratio = prefill_ours
                .iter()
                .find(|o| o.tokens == p.tokens)
                .and_then(|o| ratio(o.tokens_per_second, p.tokens_per_second));
        }
        self.fill_run_ratios();
    }

    fn fill_run_ratios(&mut self) {
        let Some(chain) = self
            .runs
            .iter()
            .find(|r| r.mode == ModeKind::Chain)
            .cloned()
        else {
            return;
        };
        for r in &mut self.runs {
            // A peer's token figures are tokens needed, not computed: no token ratio.
            if !r.is_peer() {
                r.ratio_to_chain = ratio(r.rollouts_per_10k_tokens, chain.rollouts_per_10k_tokens);
            }
            r.speed_ratio_to_chain = ratio(r.rollouts_per_second, chain.rollouts_per_second);
        }
    }
}

fn ratio(a: f64, b: f64) -> Option<f64> {
    (b > 0.0).then(|| a / b)
}

fn fmt_ratio(r: Option<f64>) -> String {
    r.map_or("–".into(), |r| format!("{r:.2}×"))
}

/// The report as markdown: the rollout table, then decode speeds.
pub fn markdown(report: &BenchReport) -> String {
    let mut s = String::new();
    s.push_str(&format!(
        "{} prompts of {}, seed {}, max {} tokens per step, model {}\n",
        report.settings.prompts,
        report.task,
        report.settings.seed,
        report.settings.max_step_tokens,
        report.model
    ));
    s.push_str(&format!(
        "machine: {} ({} threads, {})\n\n",
        report.machine.cpu, report.machine.threads, report.machine.os
    ));
    s.push_str("| mode | rollouts | prefilled | decoded | reused | recomputed | computed / rollout | rollouts / 10k tokens | vs chain | wall s | rollouts / s | vs chain | peak KV MiB | mean reward |\n");
    s.push_str("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|\n");
    for r in &report.runs {
        let t = &r.tokens;
        s.push_str(&format!(
            "| {} | {} | {} | {} | {} | {} | {:.1} | {:.2} | {} | {:.1} | {:.3} | {} | {} | {:.3} |\n",
            r.label,
            r.rollouts,
            t.prompt_prefilled + t.observation_prefilled,
            t.decoded,
            t.reused,
            t.recomputed,
            r.tokens_computed_per_rollout,
            r.rollouts_per_10k_tokens,
            fmt_ratio(r.ratio_to_chain),
            r.wall_seconds,
            r.rollouts_per_second,
            fmt_ratio(r.speed_ratio_to_chain),
            r.peak_kv_bytes.map_or("–".into(), |b| format!(
                "{:.1}",
                b as f64 / (1u64 << 20) as f64
            )),
            r.mean_reward,
        ));
    }
    if report.runs.iter().any(BenchRun::is_peer) {
        s.push_str(
            "\nmistralrs-chain: its token columns are our tokenizer's count of what the \
             rollouts needed, not what mistral.rs computed (it reports neither token ids nor \
             prefix-cache hits), so it has no token ratio and no KV figure.\n",
        );
    }
    if !report.decode.is_empty() {
        s.push_str(
            "\n| engine | batch | context | new tokens each | decode tokens/s | treegrpo ÷ this |\n\
             |---|---|---|---|---|---|\n",
        );
        for d in &report.decode {
            s.push_str(&format!(
                "| {} | {} | {} | {} | {:.1} | {} |\n",
                d.engine,
                d.batch,
                d.context,
                d.new_tokens,
                d.tokens_per_second,
                fmt_ratio(d.treegrpo_ratio)
            ));
        }
    }
    if !report.prefill.is_empty() {
        s.push_str(
            "\n| engine | prompt tokens | prefill tokens/s | treegrpo ÷ this |\n|---|---|---|---|\n",
        );
        for p in &report.prefill {
            s.push_str(&format!(
                "| {} | {} | {:.1} | {} |\n",
                p.engine,
                p.tokens,
                p.tokens_per_second,
                fmt_ratio(p.treegrpo_ratio)
            ));
        }
    }
    s
}

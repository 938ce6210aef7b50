//! Flag groups several commands share: the task, its data and the model (`rollout`,
//! `bench`, `sft`, `train`), the search's shape and sampling (`rollout`, `train`), the
//! update's settings (`update`, `train`) and the serving precision (`generate`,
//! `rollout`, `bench`, `serve`).

use std::path::PathBuf;

use clap::Args;
use treegrpo::env::{Task, TaskData};
use treegrpo::rollout::{Selection, TreeConfig, TreeConfigError, TreeOptions};
use treegrpo::train::{LossAgg, LossConfig, OptimizerConfig, OptimizerKind, UpdateConfig};

#[derive(Debug, Clone, Args)]
pub struct TaskFlags {
    /// Built-in task: search-qa (multi-hop QA, BM25 search tool) or calc (calculator).
    #[arg(long, default_value = "search-qa")]
    pub task: Task,
    /// Data folder of your own in the task's layout (search-qa: corpus.jsonl,
    /// train.jsonl, test.jsonl; calc: train.jsonl, test.jsonl); default: the task's
    /// committed data, built into the binary.
    #[arg(long)]
    pub data: Option<PathBuf>,
    /// A .gguf file or an HF directory (default: the default model).
    #[arg(long)]
    pub model: Option<PathBuf>,
}

/// `--precision`: the arithmetic the model is served with.
#[derive(Debug, Clone, Copy, Args)]
pub struct PrecisionFlag {
    /// `exact` (f32 activations against each weight's exact value: logits match
    /// candle-transformers, what the trainer recomputes) or `fast` (8-bit activations
    /// and integer dot products on Q4_0/Q4_1/Q8_0 layers and keys/values kept in f16, as
    /// llama.cpp computes; logits drift, see docs/numerics-and-precision.md).
    #[arg(long, default_value = "exact")]
    pub precision: treegrpo::model::Precision,
}

impl PrecisionFlag {
    /// `model` served at the chosen precision (a note on stderr where the fast mode
    /// has no VNNI kernel on this CPU and runs its scalar one).
    pub fn apply(
        self,
        model: treegrpo::model::LoadedModel,
    ) -> anyhow::Result<treegrpo::model::LoadedModel> {
        if self.precision == treegrpo::model::Precision::Fast
            && !treegrpo::model::kernels::vnni_available()
        {
            eprintln!(
                "note: this CPU has no AVX-512 VNNI; --precision fast runs its scalar \
                 kernel (the same values, much slower than exact)"
            );
        }
        Ok(model.with_precision(self.precision)?)
    }
}

impl TaskFlags {
    pub fn data(&self) -> TaskData {
        TaskData::from_option(self.data.clone())
    }
}

#[derive(Debug, Clone, Args)]
pub struct TreeFlags {
    /// M: trees per prompt.
    #[arg(long, default_value_t = TreeOptions::default().trees)]
    pub trees: usize,
    /// N: branches per tree per expansion round.
    #[arg(long, default_value_t = TreeOptions::default().expand)]
    pub expand: usize,
    /// L: expansion rounds.
    #[arg(long, default_value_t = TreeOptions::default().rounds)]
    pub rounds: usize,
    /// K: leaves kept per tree at random.
    #[arg(long)]
    pub keep: Option<usize>,
    /// G independent chains per prompt instead of trees (the GRPO baseline).
    #[arg(long, conflicts_with_all = ["trees", "expand", "rounds", "keep"])]
    pub chains: Option<usize>,
    /// Node selection: paper (distinct inner nodes), reference (with replacement, root
    /// included) or entropy (the boundaries whose next step was most uncertain).
    #[arg(long, default_value = "paper")]
    pub select: Selection,
    /// Draw each branch's first tokens from a wider distribution (diversity at the
    /// fork; root chains never): a spec — t<T> temperature, k<K> top-k, p<P> top-p,
    /// n<N> first tokens (default 1) or s the whole first step, q<Q> the probability
    /// a branch is boosted — e.g. t2, t1.5p0.95s, or treerl (= t5k16q0.5).
    #[arg(long, value_name = "SPEC")]
    pub branch_sampling: Option<String>,
    #[command(flatten)]
    pub step: StepFlags,
}

/// How each agent step is sampled: seed, temperature, its length, the turn limit.
#[derive(Debug, Clone, Args)]
pub struct StepFlags {
    #[arg(long, default_value_t = TreeOptions::default().seed)]
    pub seed: u64,
    /// Sampling temperature (0 = greedy).
    #[arg(long, default_value_t = TreeOptions::default().temperature)]
    pub temperature: f32,
    /// Most tokens per agent step.
    #[arg(long, default_value_t = TreeOptions::default().max_step_tokens)]
    pub max_step_tokens: usize,
    /// Tool turns before the forced answer turn.
    #[arg(long, default_value_t = treegrpo::env::EnvConfig::default().max_turns)]
    pub turns: usize,
}

impl TreeFlags {
    /// The search these flags describe (prefixes reused), by the library's rule.
    pub fn tree_config(&self) -> Result<TreeConfig, TreeConfigError> {
        TreeOptions {
            trees: self.trees,
            expand: self.expand,
            rounds: self.rounds,
            keep: self.keep,
            chains: self.chains,
            selection: self.select,
            temperature: self.step.temperature,
            max_step_tokens: self.step.max_step_tokens,
            seed: self.step.seed,
            branch_sampling: self.branch_sampling.clone(),
        }
        .config()
    }
}

/// `--kv-mib`: the KV budget in bytes, or a quarter of the available memory.
pub fn kv_budget_bytes(kv_mib: Option<usize>) -> usize {
    kv_mib.map_or_else(treegrpo::engine::EngineConfig::auto_kv_budget_bytes, |m| {
        m << 20
    })
}

#[derive(Debug, Clone, Args)]
pub struct UpdateFlags {
    #[arg(long, default_value = "adamw")]
    pub optimizer: OptimizerKind,
    #[arg(long, default_value_t = OptimizerConfig::default().lr)]
    pub lr: f64,
    #[arg(long, default_value_t = OptimizerConfig::default().weight_decay)]
    pub weight_decay: f64,
    /// Warm-up steps of a linear learning-rate ramp (0: constant).
    #[arg(long, default_value_t = OptimizerConfig::default().warmup_steps)]
    pub warmup_steps: u64,
    #[arg(long, default_value_t = LossConfig::default().clip_low)]
    pub clip_low: f64,
    #[arg(long, default_value_t = LossConfig::default().clip_high)]
    pub clip_high: f64,
    /// Dual-clip bound for negative advantages.
    #[arg(long, default_value_t = LossConfig::default().clip_c)]
    pub clip_c: f64,
    #[arg(long, default_value = "token-mean")]
    pub loss_agg: LossAgg,
    /// k3 KL coefficient (the reference is the model before the update).
    #[arg(long, default_value_t = LossConfig::default().kl_coef)]
    pub kl_coef: f64,
    #[arg(long, default_value_t = LossConfig::default().entropy_coef)]
    pub entropy_coef: f64,
    /// Cap of the truncated importance weight between rollout and trainer logprobs.
    #[arg(long, default_value_t = LossConfig::default().tis_cap)]
    pub tis_cap: f64,
    /// Global grad-norm clip (0: none).
    #[arg(long, default_value_t = UpdateConfig::default().max_grad_norm)]
    pub max_grad_norm: f64,
    /// Forward every trajectory whole instead of each prompt's trajectories as a trie.
    #[arg(long)]
    pub no_packed: bool,
    /// Rows per micro-batch (bounds memory; gradients accumulate across them). A
    /// prompt's trie split over two micro-batches forwards its shared prefix twice.
    #[arg(long, default_value_t = UpdateConfig::default().micro_batch_tokens)]
    pub micro_batch_tokens: usize,
}

impl UpdateFlags {
    pub fn check(&self) -> anyhow::Result<()> {
        anyhow::ensure!(
            self.lr.is_finite() && self.lr >= 0.0,
            "--lr must be a non-negative number"
        );
        anyhow::ensure!(
            self.micro_batch_tokens > 0,
            "--micro-batch-tokens must be at least 1"
        );
        Ok(())
    }

    pub fn optimizer_config(&self) -> OptimizerConfig {
        OptimizerConfig {
            kind: self.optimizer,
            lr: self.lr,
            weight_decay: self.weight_decay,
            warmup_steps: self.warmup_steps,
            ..OptimizerConfig::default()
        }
    }

    /// The update these flags describe, scoring under `temperature`.
    pub fn update_config(&self, temperature: f64) -> UpdateConfig {
        UpdateConfig {
            loss: LossConfig {
                clip_low: self.clip_low,
                clip_high: self.clip_high,
                clip_c: self.clip_c,
                agg: self.loss_agg,
                kl_coef: self.kl_coef,
                entropy_coef: self.entropy_coef,
                tis_cap: self.tis_cap,
            },
            max_grad_norm: self.max_grad_norm,
            packed: !self.no_packed,
            micro_batch_tokens: self.micro_batch_tokens,
            temperature,
        }
    }
}

/// How `treegrpo generate` draws tokens: vLLM's options, checked by the engine's own
/// constructors (a negative temperature is an error, not greedy).
#[derive(Debug, Clone, Args)]
pub struct SamplingFlags {
    /// Sampling temperature (0 or absent: greedy).
    #[arg(long)]
    temperature: Option<f32>,
    /// Keep the k most likely tokens (-1 or 0: off, as vLLM).
    #[arg(long, allow_negative_numbers = true)]
    top_k: Option<i64>,
    /// Keep the most likely tokens holding this much probability (1: off).
    #[arg(long)]
    top_p: Option<f32>,
    /// Drop tokens below this fraction of the most likely one's probability (0: off).
    #[arg(long)]
    min_p: Option<f32>,
    /// vLLM's repetition penalty over the prompt and the output (1: off).
    #[arg(long, default_value_t = 1.0)]
    repetition_penalty: f32,
    /// Subtracted once from every generated token's logit (0: off).
    #[arg(long, default_value_t = 0.0)]
    presence_penalty: f32,
    /// Subtracted from a generated token's logit per time it came (0: off).
    #[arg(long, default_value_t = 0.0)]
    frequency_penalty: f32,
    /// Fewest tokens before the generation may stop (vLLM's min_tokens; 0: off).
    #[arg(long, default_value_t = 0)]
    min_tokens: usize,
}

impl SamplingFlags {
    /// The engine's params for `max_tokens` tokens seeded by `seed`, ending at
    /// `stop_tokens`, checked by the rule every way in shares.
    pub fn gen_params(
        &self,
        max_tokens: usize,
        seed: u64,
        stop_tokens: Vec<treegrpo::model::TokenId>,
    ) -> Result<treegrpo::engine::GenParams, treegrpo::engine::SamplingError> {
        let params = treegrpo::engine::GenParams {
            sampling: self.sampling()?,
            penalties: self.penalties()?,
            min_tokens: self.min_tokens,
            stop_tokens,
            seed: vec![seed],
            ..treegrpo::engine::GenParams::greedy(max_tokens)
        };
        params.validate()?;
        Ok(params)
    }

    pub fn sampling(&self) -> Result<treegrpo::engine::Sampling, treegrpo::engine::SamplingError> {
        treegrpo::engine::Sampling::new(
            self.temperature.unwrap_or(0.0),
            self.top_k,
            self.top_p,
            self.min_p,
        )
    }

    pub fn penalties(
        &self,
    ) -> Result<treegrpo::engine::Penalties, treegrpo::engine::SamplingError> {
        treegrpo::engine::Penalties::new(
            self.repetition_penalty,
            self.presence_penalty,
            self.frequency_penalty,
        )
    }
}

//! Engine benchmarks (Criterion): `cargo bench --bench engine_bench`.
//!
//! - `kv_fork/<tokens>`: [`KvCache::fork`] + [`KvCache::free`] of the child, for a parent
//!   of 64 … 16384 cached tokens, on a pool shaped like the default model (30 layers,
//!   kv_dim 192, blocks of 16). Forking copies no KV: its cost is the parent's block
//!   table and token history, never the KV bytes.
//! - `engine_decode/<B>`: one [`EngineCore::step`] in which each of B sequences decodes
//!   one token (greedy) on the default model, SmolLM2-135M Q4_1. Throughput is B
//!   elements per iteration, so Criterion's `elem/s` is aggregate decode tokens/s.
//! - `candle_decode/1`: candle-transformers' `quantized_llama::ModelWeights` decoding one
//!   token (forward + argmax) at batch 1 on the same GGUF, for comparison.
//!
//! Both decode benchmarks run at contexts of about 15–150 tokens: each generation runs
//! for [`WINDOW`] tokens, then the sequences are replaced (untimed) by fresh ones.

use std::hint::black_box;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use candle_core::{Device, Tensor};
use candle_transformers::models::quantized_llama::ModelWeights;
use criterion::{
    criterion_group, criterion_main, BenchmarkId, Criterion, SamplingMode, Throughput,
};
use treegrpo::engine::{EngineConfig, EngineCore, GenParams};
use treegrpo::kv::{KvCache, KvConfig};
use treegrpo::model::{LoadedModel, TokenId};

/// The default model's shape (SmolLM2-135M): 30 layers, 3 KV heads × 64.
const LAYERS: usize = 30;
const KV_DIM: usize = 192;
const BLOCK: usize = 16;

/// Tokens each decode generation runs for before its sequences are replaced.
const WINDOW: usize = 128;

fn default_model_path() -> PathBuf {
    treegrpo::model::fetch::ensure_default_model(&mut |m| eprintln!("{m}"))
        .expect("the default model could not be fetched")
}

fn kv_fork(c: &mut Criterion) {
    let mut group = c.benchmark_group("kv_fork");
    group
        .warm_up_time(Duration::from_millis(500))
        .measurement_time(Duration::from_secs(2));
    for tokens in [64usize, 256, 1024, 4096, 16384] {
        // Exactly the parent's blocks: forking allocates none.
        let bytes_per_block = 2 * LAYERS * BLOCK * KV_DIM * 4;
        let config = KvConfig {
            block_size: BLOCK,
            budget_bytes: tokens.div_ceil(BLOCK) * bytes_per_block,
            format: treegrpo::model::KvFormat::F32,
        };
        let mut kv = KvCache::new(config, LAYERS, KV_DIM).unwrap();
        let parent = kv.new_sequence();
        // Fork cost does not depend on the KV contents: fill the table with dummy tokens.
        let dummy: Vec<TokenId> = (0..tokens as u32).map(|i| i % 49_000).collect();
        kv.reserve(parent, tokens).unwrap();
        kv.commit(parent, &dummy).unwrap();
        assert_eq!(kv.free_blocks(), 0);
        group.bench_with_input(BenchmarkId::from_parameter(tokens), &tokens, |b, _| {
            b.iter(|| {
                let child = kv.fork(black_box(parent)).unwrap();
                kv.free(black_box(child)).unwrap();
            })
        });
        kv.check_invariants().unwrap();
    }
    group.finish();
}

/// B sequences generating greedily, one decode token each per step.
struct Decoder {
    core: EngineCore,
    batch: usize,
    /// Decode steps left before the generations end.
    steps_left: usize,
    round: usize,
}

impl Decoder {
    fn new(model: &Arc<LoadedModel>, batch: usize) -> Self {
        let cfg = model.model.config();
        let per_seq = (32 + WINDOW).div_ceil(BLOCK) + 1;
        let core = EngineCore::new(
            model.clone(),
            EngineConfig {
                kv_budget_bytes: batch * per_seq * BLOCK * cfg.kv_bytes_per_token(),
                block_size: BLOCK,
                // The whole batch's prompts prefill in one step.
                max_batch_tokens: 4096,
                max_batch_seqs: 64,
                ..EngineConfig::default()
            },
        )
        .unwrap();
        let mut d = Decoder {
            core,
            batch,
            steps_left: 0,
            round: 0,
        };
        d.refill();
        d
    }

    /// Frees the finished sequences and starts B fresh ones (distinct prompts), prefilled.
    fn refill(&mut self) {
        for seq in self.core.kv().sequence_ids() {
            self.core.free(seq).unwrap();
        }
        self.core.take_finished();
        let model = self.core.model().clone();
        let mut prompt_tokens = 0;
        for i in 0..self.batch {
            let text = format!(
                "Question {}: what is {} times {}? Answer:",
                self.round * 1000 + i,
                i + 3,
                self.round + 7
            );
            let prompt = model.tokenizer.encode(&text, false).unwrap();
            assert!(prompt.len() < 32);
            prompt_tokens += prompt.len();
            let seq = self.core.add_sequence(&prompt).unwrap();
            self.core.generate(seq, GenParams::greedy(WINDOW)).unwrap();
        }
        self.round += 1;
        // One step prefills every prompt and samples each sequence's first token.
        let rows = self.core.step().unwrap();
        assert_eq!(rows, prompt_tokens);
        assert!(self.core.take_finished().is_empty());
        self.steps_left = WINDOW - 1;
    }

    /// One decode step: B rows.
    fn step(&mut self) -> Duration {
        if self.steps_left == 0 {
            self.refill();
        }
        let t = Instant::now();
        let rows = self.core.step().unwrap();
        let elapsed = t.elapsed();
        assert_eq!(
            rows, self.batch,
            "every sequence decodes one token per step"
        );
        self.steps_left -= 1;
        elapsed
    }
}

fn decode(c: &mut Criterion) {
    let path = default_model_path();
    let model = Arc::new(LoadedModel::load(&path).unwrap());
    let cfg = model.model.config();
    assert_eq!(
        (cfg.num_layers, cfg.kv_dim()),
        (LAYERS, KV_DIM),
        "kv_fork's shape"
    );
    eprintln!(
        "decode: {} on {} forward threads, {} kernels",
        path.display(),
        treegrpo::model::team::global().size(),
        treegrpo::model::kernels::Isa::active().name()
    );

    let mut group = c.benchmark_group("engine_decode");
    group
        .sample_size(10)
        .sampling_mode(SamplingMode::Flat)
        .warm_up_time(Duration::from_secs(1));
    for batch in [1usize, 8, 32, 64] {
        let mut dec = Decoder::new(&model, batch);
        // Ten flat samples of at least one step each (about 0.7 s at batch 64 on 2 cores).
        let secs = if batch >= 64 { 8 } else { 4 };
        group.measurement_time(Duration::from_secs(secs));
        group.throughput(Throughput::Elements(batch as u64));
        group.bench_function(BenchmarkId::from_parameter(batch), |b| {
            b.iter_custom(|iters| (0..iters).map(|_| dec.step()).sum())
        });
    }
    group.finish();
    drop(model);

    // candle-transformers' quantised llama, batch 1, same prompt length and window.
    let mut file = std::fs::File::open(&path).unwrap();
    let content = candle_core::quantized::gguf_file::Content::read(&mut file).unwrap();
    let mut cm = ModelWeights::from_gguf(content, &mut file, &Device::Cpu).unwrap();
    let tok = LoadedModel::load(&path).unwrap().tokenizer;
    let prompt = tok
        .encode("Question 0: what is 3 times 7? Answer:", false)
        .unwrap();
    let argmax = |logits: &Tensor| -> u32 {
        let v: Vec<f32> = logits.squeeze(0).unwrap().to_vec1().unwrap();
        let mut best = 0;
        for (i, &x) in v.iter().enumerate() {
            if x > v[best] {
                best = i;
            }
        }
        best as u32
    };
    let mut pos = 0;
    let mut next = 0u32;
    let mut group = c.benchmark_group("candle_decode");
    group
        .sample_size(10)
        .sampling_mode(SamplingMode::Flat)
        .warm_up_time(Duration::from_secs(1))
        .measurement_time(Duration::from_secs(4))
        .throughput(Throughput::Elements(1));
    group.bench_function(BenchmarkId::from_parameter(1), |b| {
        b.iter_custom(|iters| {
            let mut total = Duration::ZERO;
            for _ in 0..iters {
                if pos == 0 || pos >= prompt.len() + WINDOW - 1 {
                    // Untimed: a fresh prefill (index 0 resets candle's KV cache).
                    let x = Tensor::new(prompt.as_slice(), &Device::Cpu)
                        .and_then(|t| t.unsqueeze(0))
                        .unwrap();
                    next = argmax(&cm.forward(&x, 0).unwrap());
                    pos = prompt.len();
                }
                let t = Instant::now();
                let x = Tensor::new(&[next], &Device::Cpu)
                    .and_then(|t| t.unsqueeze(0))
                    .unwrap();
                next = argmax(&cm.forward(&x, pos).unwrap());
                total += t.elapsed();
                pos += 1;
            }
            total
        })
    });
    group.finish();
}

criterion_group!(benches, kv_fork, decode);
criterion_main!(benches);

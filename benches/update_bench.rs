//! Update benchmarks (Criterion): `cargo bench --bench update_bench`.
//!
//! - `f32_peak/2048`: one 2048³ f32 matrix product through `gemm` (the backward's
//!   kernel), throughput in FLOPs: Criterion's `elem/s` is this machine's measured f32
//!   limit, the denominator of the update's fraction of it.
//! - `update_rows/<rows>`: the native trainer's forward (kept for the backward) and
//!   backward on the default model (SmolLM2-135M, dequantised to f32) over a fixed
//!   packed batch: a trie of four trajectories sharing a 192-token prompt, two of them
//!   also sharing a branch, every response token scored. Throughput is rows, so
//!   `elem/s` is packed rows per second; times about 0.76 GFLOP a row (a forward of
//!   0.21, its recomputation 0.21, the backward 0.42, at 2·params matmul FLOPs, plus
//!   the scored rows' head) it gives the update's FLOP rate.

use std::hint::black_box;
use std::time::Duration;

use candle_core::DType;
use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use treegrpo::model::LoadedModel;
use treegrpo::train::native::{Grads, NativeDecoder};
use treegrpo::train::pack::pack;
use treegrpo::train::Params;

fn f32_peak(c: &mut Criterion) {
    let n = 2048;
    let a: Vec<f32> = (0..n * n).map(|i| (i % 7) as f32 * 0.01).collect();
    let b: Vec<f32> = (0..n * n).map(|i| (i % 5) as f32 * 0.01).collect();
    let mut out = vec![0f32; n * n];
    let mut group = c.benchmark_group("f32_peak");
    group
        .sample_size(10)
        .measurement_time(Duration::from_secs(5))
        .throughput(Throughput::Elements(2 * (n * n * n) as u64));
    group.bench_function(BenchmarkId::from_parameter(n), |bench| {
        bench.iter(|| {
            // dX = dY·W: the backward's input-gradient product, [n, n]·[n, n].
            treegrpo::train::native::matmul::input_grad(&a, &b, n, n, n, &mut out, false);
            black_box(&out);
        })
    });
    group.finish();
}

fn update_rows(c: &mut Criterion) {
    let path = treegrpo::model::fetch::ensure_default_model(&mut |m| eprintln!("{m}"))
        .expect("the default model could not be fetched");
    let model = LoadedModel::load(&path).expect("the default model loads");
    let params = Params::from_model(&model.model, DType::F32).expect("f32 weights");
    let decoder = NativeDecoder::new(&params).expect("an f32 decoder");
    // Fixed token ids (a deterministic walk through the vocabulary).
    let ids = |seed: u32, n: usize| -> Vec<u32> {
        (0..n as u32)
            .map(|i| (seed * 7919 + i * 104_729) % 49_000)
            .collect()
    };
    let prompt = ids(1, 192);
    let branch = ids(2, 96);
    let seqs: Vec<Vec<u32>> = vec![
        [prompt.clone(), ids(3, 160)].concat(),
        [prompt.clone(), branch.clone(), ids(4, 64)].concat(),
        [prompt.clone(), branch, ids(5, 96)].concat(),
        [prompt.clone(), ids(6, 128)].concat(),
    ];
    let wanted: Vec<Vec<bool>> = seqs
        .iter()
        .map(|s| (0..s.len()).map(|i| i >= prompt.len()).collect())
        .collect();
    let inputs: Vec<(&[u32], &[bool])> = seqs
        .iter()
        .zip(&wanted)
        .map(|(s, w)| (s.as_slice(), w.as_slice()))
        .collect();
    let batch = pack(&inputs, true, 1 << 20).remove(0).batch;
    let rows = batch.tokens.len();
    let m = batch.targets.len();
    let g_logp = vec![1.0 / m as f64; m];
    let g_entropy = vec![0.001 / m as f64; m];
    let mut grads = Grads::zeros(&params);
    let mut group = c.benchmark_group("update_rows");
    group
        .sample_size(10)
        .measurement_time(Duration::from_secs(20))
        .throughput(Throughput::Elements(rows as u64));
    group.bench_function(BenchmarkId::from_parameter(rows), |bench| {
        bench.iter(|| {
            let fwd = decoder.forward(&batch, 1.0, true).expect("forward");
            decoder
                .backward(&batch, fwd, &g_logp, &g_entropy, &mut grads)
                .expect("backward");
        })
    });
    group.finish();
    black_box(grads);
}

criterion_group!(benches, f32_peak, update_rows);
criterion_main!(benches);

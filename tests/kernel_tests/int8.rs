//! The fast precision mode (`kernels::int8`, `Precision::Fast`) against references:
//!
//! - its matmul equals an f64 recompute of the module's formula (activations
//!   quantised to 8 bits per block of 32, integer dot products, per-block scaling),
//!   and stays within the quantisation error bound of the exact product;
//! - the VNNI variant (where the CPU has it) and the scalar one agree bit for bit,
//!   and a row's outputs are bit-identical alone and in any batch;
//! - the relaid-out codes give back exactly the matrix's values;
//! - on the default model: batch invariance of the whole forward, and the drift of
//!   its logprobs from the exact path, measured and bounded; its keys and values
//!   kept in f16 give the same logits in an f16 pool, an f32 pool and the dense store,
//!   and an engine that keeps f16 refuses exact weights.

use super::common;
use super::common::batch::{assert_batch_invariant, run_steps};
use super::{quantized, Lcg, QUANT};
use treegrpo::engine::{Engine, EngineConfig, EngineError};
use treegrpo::kv::{KvCache, KvConfig};
use treegrpo::model::kernels::vnni_available;
use treegrpo::model::kernels::{Epilogue, Int8Matrix, OutputSink, PackedMatrix};
use treegrpo::model::{
    BatchSeq, ChatMessage, ForwardBatch, KvFormat, LoadedModel, LogitsWanted, Model, Precision,
};

/// Logits at every position of `tokens`, one forward into a paged pool of `format`.
fn paged_logits(model: &Model, tokens: &[u32], format: KvFormat) -> Vec<Vec<f32>> {
    let cfg = model.config();
    let block_size = 16;
    let block_bytes = block_size * 2 * cfg.num_layers * cfg.kv_dim() * format.bytes();
    let config = KvConfig {
        block_size,
        budget_bytes: (tokens.len() / block_size + 2) * block_bytes,
        format,
    };
    let mut kv = KvCache::for_model(config, cfg).unwrap();
    assert_eq!(kv.format(), format);
    let seq = kv.new_sequence();
    kv.reserve(seq, tokens.len()).unwrap();
    let batch = ForwardBatch {
        seqs: vec![BatchSeq {
            slot: seq.slot(),
            start: 0,
            tokens: tokens.to_vec(),
            logits: LogitsWanted::All,
        }],
    };
    let out = model.forward(&batch, &mut kv).unwrap();
    kv.commit(seq, tokens).unwrap();
    out.into_iter().next().unwrap().rows
}

/// A quantised `[out, inp]` matrix of `format` (made by candle's quantiser).
fn quantized_matrix(
    dtype: candle_core::quantized::GgmlDType,
    format: treegrpo::model::kernels::WeightFormat,
    out: usize,
    inp: usize,
    seed: u64,
) -> PackedMatrix {
    let m = quantized(dtype, out, inp, seed).1;
    assert_eq!(m.format(), format);
    m
}

/// `[rows, out]` through the active int8 variant (VNNI where available) or scalar.
fn int8_matmul(m: &Int8Matrix, x: &[f32], rows: usize, scalar: bool) -> Vec<f32> {
    let mut y = vec![0f32; rows * m.out_features()];
    let sink = OutputSink::new(&mut y, m.out_features(), m.out_features(), Epilogue::Store);
    if scalar {
        m.gemm_panels_scalar(x, rows, 0..m.panels(), &sink);
    } else {
        m.gemm_panels(x, rows, 0..m.panels(), &sink);
    }
    y
}

/// The module's formula recomputed from scratch in f64: each activation block rounded
/// to `dx · xq` (`dx = max|x| / 127`, ties to even), times the exact weights.
fn reference(w: &[f32], x: &[f32], out: usize, inp: usize, rows: usize) -> Vec<f64> {
    let mut xr = vec![0f64; rows * inp];
    for (src, dst) in x.chunks(32).zip(xr.chunks_mut(32)) {
        let amax = src.iter().fold(0f32, |a, v| a.max(v.abs()));
        let d = amax / 127.0;
        let id = if d > 0.0 { 1.0 / d } else { 0.0 };
        for (v, r) in src.iter().zip(dst) {
            *r = d as f64 * (v * id).round_ties_even().clamp(-127.0, 127.0) as f64;
        }
    }
    let mut y = vec![0f64; rows * out];
    for r in 0..rows {
        for o in 0..out {
            y[r * out + o] = (0..inp)
                .map(|k| w[o * inp + k] as f64 * xr[r * inp + k])
                .sum();
        }
    }
    y
}

#[test]
fn int8_matmul_equals_the_quantised_formula_and_stays_within_its_error_bound() {
    eprintln!("VNNI variant available: {}", vnni_available());
    for (dtype, format) in QUANT {
        for (out, inp, rows) in [(1, 32, 1), (17, 64, 3), (40, 576, 9), (33, 1536, 20)] {
            let packed = quantized_matrix(dtype, format, out, inp, 5);
            let m = Int8Matrix::from_packed(&packed).unwrap();
            let w = packed.to_dense();
            let x = Lcg(77).vec(rows * inp);
            let got = int8_matmul(&m, &x, rows, false);
            let want = reference(&w, &x, out, inp, rows);
            for r in 0..rows {
                for o in 0..out {
                    let i = r * out + o;
                    let scale: f64 = (0..inp)
                        .map(|k| (w[o * inp + k] as f64 * x[r * inp + k] as f64).abs())
                        .sum();
                    // f32 rounding of the per-block steps only: the integer sums are exact.
                    assert!(
                        (got[i] as f64 - want[i]).abs() <= 1e-5 * scale.max(1.0),
                        "{format:?} {out}x{inp} row {r} out {o}: {} vs {}",
                        got[i],
                        want[i]
                    );
                    // Against the exact product: each activation moved by at most half
                    // a quantisation step, dx / 2 = max|x_block| / 254.
                    let exact: f64 = (0..inp)
                        .map(|k| w[o * inp + k] as f64 * x[r * inp + k] as f64)
                        .sum();
                    let bound: f64 = (0..inp)
                        .map(|k| {
                            let blk = &x[r * inp + k / 32 * 32..][..32];
                            let amax = blk.iter().fold(0f32, |a, v| a.max(v.abs())) as f64;
                            (w[o * inp + k] as f64).abs() * amax / 254.0
                        })
                        .sum();
                    assert!(
                        (got[i] as f64 - exact).abs() <= bound * 1.001 + 1e-5 * scale.max(1.0),
                        "{format:?}: error {} past the quantisation bound {bound}",
                        (got[i] as f64 - exact).abs()
                    );
                }
            }
        }
    }
}

#[test]
fn int8_variants_agree_bit_for_bit_and_rows_are_batch_invariant() {
    for (dtype, format) in QUANT {
        let (out, inp) = (50, 576);
        let m = Int8Matrix::from_packed(&quantized_matrix(dtype, format, out, inp, 9)).unwrap();
        for rows in [1, 2, 7, 8, 9, 33] {
            let x = Lcg(rows as u64).vec(rows * inp);
            let fast = int8_matmul(&m, &x, rows, false);
            let scalar = int8_matmul(&m, &x, rows, true);
            assert!(
                fast == scalar,
                "{format:?} rows {rows}: VNNI and scalar differ"
            );
            for r in 0..rows {
                let alone = int8_matmul(&m, &x[r * inp..(r + 1) * inp], 1, false);
                assert!(
                    alone[..] == fast[r * out..(r + 1) * out],
                    "{format:?}: row {r} of {rows} differs alone"
                );
            }
            // Any split of the panels gives the same outputs.
            let mut split = vec![0f32; rows * out];
            let sink = OutputSink::new(&mut split, out, out, Epilogue::Store);
            m.gemm_panels(&x, rows, 0..1, &sink);
            m.gemm_panels(&x, rows, 1..m.panels(), &sink);
            assert!(split == fast, "{format:?} rows {rows}: split panels differ");
        }
    }
}

#[test]
fn int8_codes_give_back_the_matrix_exactly() {
    for (dtype, format) in QUANT {
        let packed = quantized_matrix(dtype, format, 37, 96, 3);
        let m = Int8Matrix::from_packed(&packed).unwrap();
        assert_eq!(m.source_format(), format);
        assert_eq!(m.to_dense(), packed.to_dense(), "{format:?}");
    }
    let dense = PackedMatrix::from_f32(4, 32, &[0.5; 128]).unwrap();
    assert!(Int8Matrix::from_packed(&dense).is_err());
}

#[test]
fn fast_default_model_is_batch_invariant_and_its_drift_is_bounded() {
    let path = common::default_model();
    let exact = LoadedModel::load(&path).unwrap();
    let fast = LoadedModel::load(&path)
        .unwrap()
        .with_precision(Precision::Fast)
        .unwrap();
    let tokens = exact
        .chat_prompt(&[ChatMessage::new(
            "user",
            "Write a short story about a lighthouse keeper and a storm.",
        )])
        .unwrap();
    let fast_logits = assert_batch_invariant(&fast, &tokens, "fast default model");

    // Keys and values in f16 under fast, f32 under exact; the model rounds them before
    // any store, so an f16 pool, an f32 pool and the dense store give the same logits.
    assert_eq!(fast.model.kv_format(), KvFormat::F16);
    assert_eq!(exact.model.kv_format(), KvFormat::F32);
    let bits =
        |rows: &[Vec<f32>]| -> Vec<u32> { rows.concat().iter().map(|x| x.to_bits()).collect() };
    let dense = run_steps(&fast, 1, &[vec![(0, tokens.clone())]]).remove(0);
    for format in [KvFormat::F16, KvFormat::F32] {
        let paged = paged_logits(&fast.model, &tokens, format);
        assert!(
            bits(&paged) == bits(&dense),
            "fast logits from an {format:?} pool differ"
        );
    }
    let exact_logits = run_steps(&exact, 1, &[vec![(0, tokens.clone())]]).remove(0);
    assert_eq!(fast_logits.len(), exact_logits.len());

    // Drift at every position: |Δ logprob| of the token that follows, KL(exact‖fast).
    let (mut sum_abs, mut max_abs, mut sum_kl, mut max_kl, mut same_argmax) =
        (0.0, 0f64, 0.0, 0f64, 0);
    let n = tokens.len() - 1;
    for pos in 0..n {
        let (pe, pf) = (
            common::log_softmax(&exact_logits[pos]),
            common::log_softmax(&fast_logits[pos]),
        );
        let next = tokens[pos + 1] as usize;
        let d = (pe[next] - pf[next]).abs();
        sum_abs += d;
        max_abs = max_abs.max(d);
        let kl: f64 = pe.iter().zip(&pf).map(|(a, b)| a.exp() * (a - b)).sum();
        sum_kl += kl;
        max_kl = max_kl.max(kl);
        same_argmax +=
            (common::argmax(&exact_logits[pos]) == common::argmax(&fast_logits[pos])) as usize;
    }
    eprintln!(
        "fast vs exact over {n} positions: mean |Δ logprob| {:.4}, max {:.4}; mean KL {:.5}, max {:.5}; argmax agrees at {same_argmax}/{n}",
        sum_abs / n as f64,
        max_abs,
        sum_kl / n as f64,
        max_kl
    );
    // The fast path is an approximation of the same model, not another model.
    assert!(sum_kl / n as f64 <= 0.05, "mean KL {}", sum_kl / n as f64);
    assert!(
        same_argmax * 10 >= n * 8,
        "argmax agrees at only {same_argmax}/{n}"
    );
    assert!(
        sum_abs / n as f64 > 0.0,
        "the fast path changed nothing: is it running?"
    );

    // The engine reports the arithmetic it serves (rollouts record it in summary.json).
    assert_eq!(exact.model.precision(), Precision::Exact);
    assert_eq!(fast.model.precision(), Precision::Fast);
    let rt = tokio::runtime::Builder::new_current_thread()
        .build()
        .unwrap();
    // A model already at the asked precision is kept, not copied; back to exact
    // converts.
    let exact_weights = exact.model.clone();
    let exact = exact.with_precision(Precision::Exact).unwrap();
    assert!(std::sync::Arc::ptr_eq(&exact.model, &exact_weights));
    let fast_weights = fast.model.clone();
    let fast = fast.with_precision(Precision::Fast).unwrap();
    assert!(std::sync::Arc::ptr_eq(&fast.model, &fast_weights));
    drop((exact_weights, fast_weights));
    let back = LoadedModel::load(&path)
        .unwrap()
        .with_precision(Precision::Fast)
        .unwrap()
        .with_precision(Precision::Exact)
        .unwrap();
    assert_eq!(back.model.precision(), Precision::Exact);
    drop((exact, back));
    let engine = Engine::start(std::sync::Arc::new(fast), EngineConfig::default()).unwrap();
    assert_eq!(
        rt.block_on(engine.stats()).unwrap().precision,
        Precision::Fast
    );
    // Its pool keeps f16: exact weights (f32 K/V) would be rounded there, so a swap to
    // them is refused and the engine keeps serving fast.
    let exact_again = LoadedModel::load(&path).unwrap().model;
    match rt.block_on(engine.load_weights(exact_again)) {
        Err(EngineError::KvFormat { cache, weights }) => {
            assert_eq!((cache, weights), (KvFormat::F16, KvFormat::F32));
        }
        other => panic!("exact weights into an f16 pool: {other:?}"),
    }
    assert_eq!(
        rt.block_on(engine.stats()).unwrap().precision,
        Precision::Fast
    );
    // A file is served at the engine's precision: the quantised default model loads
    // fast and is taken.
    assert_eq!(rt.block_on(engine.load_weights_from(&path)).unwrap(), 1);
    assert_eq!(
        rt.block_on(engine.stats()).unwrap().precision,
        Precision::Fast
    );
}

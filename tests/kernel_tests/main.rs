//! Our matmul kernels against from-scratch references, on every variant this CPU runs.
//!
//! - Dequantisation of each ggml block format equals candle's own `dequantize` exactly.
//! - The matmul equals an f64 dot product of the (dequantised) weights with the
//!   activations (relative error 1e-5: f32 accumulation of up to 1536 terms), for every
//!   weight format, ragged shapes included.
//! - Every variant (AVX-512, AVX2, scalar) gives bit-identical results, and a
//!   quantised matrix gives bit-identically what its dequantised f32 copy gives.
//! - Batch invariance: a row's outputs are bit-identical alone and inside batches of
//!   any size and content, on every variant: the property the engine's
//!   reproducibility rests on.
//! - Thread splits: results are the same however the panels are divided.
//! - Attention's weighted sums of value rows: identical on every variant and to the
//!   plain loop they replaced; attention's scores four keys at a time equal the
//!   fixed-order dot. (These two tests force variants process-wide; the others
//!   name their variant explicitly, so they are unaffected.)
//! - `exp.rs`: the vectorised `exp`s (f32 for softmax and SwiGLU, f64 for sampling)
//!   equal libm's bit for bit over every exponent range of their paths, and SwiGLU
//!   equals its scalar formula.
//! - `int8.rs`: the fast precision's matmul (8-bit activations) against an f64
//!   recompute of its formula and its error bound, its two variants against each
//!   other, and its drift from exact on the default model.

#[path = "../common/mod.rs"]
mod common;
mod exp;
mod int8;

use candle_core::quantized::{GgmlDType, QTensor};
use candle_core::{Device, Tensor};
use half::{bf16, f16};
use treegrpo::model::kernels::{
    split_range, Epilogue, Isa, OutputSink, PackedMatrix, RowRuns, Rows, WeightFormat,
};

/// Small deterministic generator for test data.
struct Lcg(u64);
impl Lcg {
    fn next(&mut self) -> f32 {
        self.0 = self
            .0
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        ((self.0 >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0
    }
    fn vec(&mut self, n: usize) -> Vec<f32> {
        (0..n).map(|_| self.next()).collect()
    }
}

fn variants() -> Vec<Isa> {
    let v: Vec<Isa> = Isa::ALL.into_iter().filter(|i| i.available()).collect();
    eprintln!("kernel variants on this CPU: {v:?}");
    v
}

const QUANT: [(GgmlDType, WeightFormat); 3] = [
    (GgmlDType::Q4_0, WeightFormat::Q4_0),
    (GgmlDType::Q4_1, WeightFormat::Q4_1),
    (GgmlDType::Q8_0, WeightFormat::Q8_0),
];

fn quantized(dtype: GgmlDType, out: usize, inp: usize, seed: u64) -> (QTensor, PackedMatrix) {
    let w = Lcg(seed).vec(out * inp);
    let t = Tensor::from_vec(w, (out, inp), &Device::Cpu).unwrap();
    let q = QTensor::quantize(&t, dtype).unwrap();
    let format = QUANT.iter().find(|(d, _)| *d == dtype).unwrap().1;
    let m = PackedMatrix::from_ggml(format, out, inp, &q.data().unwrap()).unwrap();
    (q, m)
}

/// One matrix of every format, `[out, inp]` (quantised ones need `inp % 32 == 0`).
fn every_format(out: usize, inp: usize, seed: u64) -> Vec<PackedMatrix> {
    let w = Lcg(seed).vec(out * inp);
    let mut all = vec![
        PackedMatrix::from_f32(out, inp, &w).unwrap(),
        PackedMatrix::from_bf16(
            out,
            inp,
            &w.iter().map(|&v| bf16::from_f32(v)).collect::<Vec<_>>(),
        )
        .unwrap(),
        PackedMatrix::from_f16(
            out,
            inp,
            &w.iter().map(|&v| f16::from_f32(v)).collect::<Vec<_>>(),
        )
        .unwrap(),
    ];
    if inp.is_multiple_of(32) {
        all.extend(QUANT.iter().map(|(d, _)| quantized(*d, out, inp, seed).1));
    }
    all
}

#[test]
fn dequantisation_equals_candle_exactly() {
    for (dtype, _) in QUANT {
        let (q, m) = quantized(dtype, 24, 96, 1);
        let reference = q
            .dequantize(&Device::Cpu)
            .unwrap()
            .flatten_all()
            .unwrap()
            .to_vec1::<f32>()
            .unwrap();
        assert_eq!(m.to_dense(), reference, "{dtype:?}");
    }
}

#[test]
fn half_formats_widen_exactly() {
    let w = Lcg(4).vec(20 * 40);
    let b: Vec<bf16> = w.iter().map(|&v| bf16::from_f32(v)).collect();
    let h: Vec<f16> = w.iter().map(|&v| f16::from_f32(v)).collect();
    let mb = PackedMatrix::from_bf16(20, 40, &b).unwrap();
    let mh = PackedMatrix::from_f16(20, 40, &h).unwrap();
    assert_eq!(
        mb.to_dense(),
        b.iter().map(|v| v.to_f32()).collect::<Vec<_>>()
    );
    assert_eq!(
        mh.to_dense(),
        h.iter().map(|v| v.to_f32()).collect::<Vec<_>>()
    );
}

#[test]
fn matmul_equals_f64_reference_on_every_variant() {
    for isa in variants() {
        for (out, inp, rows) in [
            (1, 32, 1),
            (17, 64, 3),
            (40, 576, 9),
            (33, 1536, 20),
            (5, 7, 4),
            (31, 50, 11),
        ] {
            for m in every_format(out, inp, 7) {
                let x = Lcg(99).vec(rows * inp);
                let y = m.matmul_with(isa, &x, rows);
                let w = m.to_dense();
                for o in 0..out {
                    for r in 0..rows {
                        let terms = (0..inp).map(|i| w[o * inp + i] as f64 * x[r * inp + i] as f64);
                        let exact: f64 = terms.clone().sum();
                        let scale: f64 = terms.map(f64::abs).sum();
                        let got = y[r * out + o] as f64;
                        assert!(
                            (got - exact).abs() <= 1e-5 * scale.max(1.0),
                            "{isa:?} {:?} {out}x{inp} row {r} out {o}: {got} vs {exact}",
                            m.format()
                        );
                    }
                }
            }
        }
    }
}

#[test]
fn every_variant_and_the_dequantised_copy_agree_bit_for_bit() {
    let isas = variants();
    for (out, inp) in [(48, 576), (20, 64), (9, 45)] {
        for m in every_format(out, inp, 21) {
            let dense = PackedMatrix::from_f32(out, inp, &m.to_dense()).unwrap();
            // 9 to 24 rows are one wide tile on AVX-512, 25 plain ones; on AVX2
            // 7 to 24 rows but 12, 18 and 24 are tiles of half panels (25: whole).
            for rows in [1, 2, 3, 7, 8, 9, 12, 13, 16, 17, 23, 24, 25] {
                let x = Lcg(rows as u64).vec(rows * inp);
                let reference = m.matmul_with(Isa::Scalar, &x, rows);
                for &isa in &isas {
                    assert_eq!(
                        m.matmul_with(isa, &x, rows),
                        reference,
                        "{isa:?} {:?} rows {rows}",
                        m.format()
                    );
                    assert_eq!(
                        dense.matmul_with(isa, &x, rows),
                        reference,
                        "{isa:?} dense copy of {:?}",
                        m.format()
                    );
                }
            }
        }
    }
}

#[test]
fn a_row_is_bit_identical_alone_and_in_any_batch_on_every_variant() {
    for isa in variants() {
        for m in every_format(48, 576, 3) {
            let inp = m.in_features();
            let out = m.out_features();
            let probe = Lcg(5).vec(inp);
            let alone = m.matmul_with(isa, &probe, 1);
            let mut rng = Lcg(11);
            for (batch, at) in [
                (2, 0),
                (2, 1),
                (8, 5),
                (9, 8),
                (13, 6),
                (16, 15),
                (23, 22),
                (33, 17),
                (64, 63),
            ] {
                let mut x = rng.vec(batch * inp);
                x[at * inp..(at + 1) * inp].copy_from_slice(&probe);
                let y = m.matmul_with(isa, &x, batch);
                assert_eq!(
                    &y[at * out..(at + 1) * out],
                    &alone[..],
                    "{isa:?} {:?} batch {batch} row {at}",
                    m.format()
                );
            }
        }
    }
}

#[test]
fn any_split_of_the_panels_gives_the_same_result_and_epilogues_apply() {
    let (out, inp, rows) = (70, 96, 5);
    let m = &every_format(out, inp, 8)[4]; // Q4_1
    let x = Lcg(2).vec(rows * inp);
    let whole = m.matmul(&x, rows);
    let bias: Vec<f32> = (0..out).map(|o| o as f32 * 0.5).collect();
    for parts in [1, 2, 3, 5, 16] {
        let mut y = vec![1f32; rows * out];
        {
            let sink =
                OutputSink::new(&mut y, out, out, Epilogue::Accumulate).with_bias(Some(&bias));
            for range in split_range(m.panels(), parts) {
                m.gemm_panels(&x, rows, range, &sink);
            }
        }
        for r in 0..rows {
            for o in 0..out {
                assert_eq!(
                    y[r * out + o],
                    1.0 + (whole[r * out + o] + bias[o]),
                    "parts {parts}"
                );
            }
        }
    }
    // Columns past `cols` are never written.
    let mut y = vec![7f32; rows * out];
    m.gemm_panels(
        &x,
        rows,
        0..m.panels(),
        &OutputSink::new(&mut y, out, 30, Epilogue::Store),
    );
    assert!(y
        .chunks_exact(out)
        .all(|row| row[30..].iter().all(|&v| v == 7.0)));
}

#[test]
fn bad_shapes_are_errors_not_panics() {
    assert!(PackedMatrix::from_f32(3, 4, &[0.0; 11]).is_err());
    assert!(PackedMatrix::from_ggml(WeightFormat::Q4_0, 2, 48, &[0; 36]).is_err());
    assert!(PackedMatrix::from_ggml(WeightFormat::Q8_0, 2, 64, &[0; 10]).is_err());
    assert!(PackedMatrix::from_ggml(WeightFormat::F32, 2, 64, &[0; 10]).is_err());
}

#[test]
fn weighted_sums_of_rows_are_identical_on_every_variant_and_match_the_plain_loop() {
    let mut rng = Lcg(17);
    for (n, width, offset) in [(1, 64, 0), (37, 64, 64), (300, 80, 16), (5, 7, 3)] {
        let rows_data: Vec<Vec<f32>> = (0..n).map(|_| rng.vec(offset + width + 5)).collect();
        let rows: Vec<&[f32]> = rows_data.iter().map(|r| &r[..]).collect();
        let probs: Vec<f32> = rng.vec(n).iter().map(|v| v.abs()).collect();
        let scale = 0.37;
        // The plain loop the attention kernel used to run: `out += (p · scale) · v`, in
        // row order, straight into `out`.
        let mut expected = vec![0f32; width];
        for (row, p) in rows.iter().zip(&probs) {
            let p = p * scale;
            for (o, v) in expected.iter_mut().zip(&row[offset..]) {
                *o += p * v;
            }
        }
        for isa in variants() {
            isa.force().unwrap();
            let mut out = vec![0f32; width];
            treegrpo::model::kernels::weighted_sum(
                Rows::from_slices(&rows),
                offset,
                &probs,
                scale,
                &mut out,
            );
            assert_eq!(out, expected, "{isa:?} n {n} width {width}");
        }
        Isa::best().force().unwrap();
    }
}

#[test]
fn attention_scores_four_keys_at_a_time_equal_the_fixed_order_dot() {
    use treegrpo::model::kernels::{dot_fixed, dot_rows};
    let mut rng = Lcg(23);
    for (n, dim, offset) in [
        (1, 64, 0),
        (4, 64, 64),
        (37, 64, 128),
        (9, 128, 0),
        (6, 40, 8),
    ] {
        let q = rng.vec(dim);
        let rows_data: Vec<Vec<f32>> = (0..n).map(|_| rng.vec(offset + dim + 3)).collect();
        let rows: Vec<&[f32]> = rows_data.iter().map(|r| &r[..]).collect();
        let expected: Vec<f32> = rows
            .iter()
            .map(|r| dot_fixed(&q, &r[offset..offset + dim]))
            .collect();
        for isa in variants() {
            isa.force().unwrap();
            let mut out = vec![0f32; n];
            dot_rows(&q, Rows::from_slices(&rows), offset, &mut out);
            assert_eq!(out, expected, "{isa:?} n {n} dim {dim}");
        }
        Isa::best().force().unwrap();
        // And the fixed order is a dot product (within f32 rounding of an f64 one).
        for (r, e) in rows.iter().zip(&expected) {
            let exact: f64 = q
                .iter()
                .zip(&r[offset..])
                .map(|(a, b)| *a as f64 * *b as f64)
                .sum();
            assert!(
                (*e as f64 - exact).abs() <= 1e-5 * dim as f64,
                "{e} vs {exact}"
            );
        }
    }
}

#[test]
fn grouped_query_heads_read_each_row_once_and_equal_one_head_at_a_time() {
    use treegrpo::model::kernels::{dot_rows, dot_rows_heads, weighted_sum, weighted_sum_heads};
    let mut rng = Lcg(29);
    // Heads 1-4 run as one group on AVX-512 (1-3 on AVX2), 5 and 7 in pieces; widths
    // past 64 (32 on AVX2) and not a multiple of it take the per-head remainder; 0 and
    // 3 rows the tail paths.
    for (heads, n, dim) in [
        (3, 37, 64),
        (3, 13, 96),
        (1, 4, 64),
        (2, 9, 128),
        (4, 3, 64),
        (5, 21, 80),
        (7, 16, 48),
        (3, 0, 64),
    ] {
        let qs = rng.vec(heads * dim);
        let rows_data: Vec<Vec<f32>> = (0..n).map(|_| rng.vec(dim)).collect();
        let rows: Vec<&[f32]> = rows_data.iter().map(|r| &r[..]).collect();
        let probs: Vec<f32> = rng.vec(heads * n).iter().map(|v| v.abs()).collect();
        let scales: Vec<f32> = rng.vec(heads).iter().map(|v| v.abs() + 0.1).collect();
        // The grouped sum takes each probability already times its head's scale.
        let weights: Vec<f32> = (0..heads * n)
            .map(|i| probs[i] * scales[i / n.max(1)])
            .collect();
        for isa in variants() {
            isa.force().unwrap();
            // One head at a time, on the single-head loops.
            let mut scores = vec![0f32; heads * n];
            let mut sums = rng.vec(heads * dim);
            let start = sums.clone();
            for h in 0..heads {
                dot_rows(
                    &qs[h * dim..(h + 1) * dim],
                    Rows::from_slices(&rows),
                    0,
                    &mut scores[h * n..(h + 1) * n],
                );
                let p = &probs[h * n..(h + 1) * n];
                weighted_sum(
                    Rows::from_slices(&rows),
                    0,
                    p,
                    scales[h],
                    &mut sums[h * dim..(h + 1) * dim],
                );
            }
            let mut grouped_scores = vec![0f32; heads * n];
            dot_rows_heads(&qs, heads, Rows::from_slices(&rows), &mut grouped_scores);
            let mut grouped_sums = start;
            weighted_sum_heads(Rows::from_slices(&rows), heads, &weights, &mut grouped_sums);
            let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
            assert_eq!(
                bits(&grouped_scores),
                bits(&scores),
                "{isa:?} {heads} heads n {n}"
            );
            assert_eq!(
                bits(&grouped_sums),
                bits(&sums),
                "{isa:?} {heads} heads n {n}"
            );
        }
        Isa::best().force().unwrap();
    }
}

#[test]
fn rows_read_as_runs_of_blocks_equal_the_same_rows_as_slices() {
    use treegrpo::model::kernels::{dot_rows, dot_rows_heads, weighted_sum, weighted_sum_heads};
    let mut rng = Lcg(37);
    // Runs as the paged cache lays them out: `per_run` rows `stride` apart in each
    // block (a head-major block's rows are contiguous, a plain one's `kv_dim` apart),
    // the last block part-filled; every length crosses block edges differently.
    for (heads, n, dim, per_run, stride) in [
        (3usize, 37usize, 64usize, 16usize, 64usize),
        (3, 37, 64, 16, 192),
        (2, 5, 128, 4, 130),
        (1, 64, 64, 16, 64),
        (4, 1, 64, 16, 64),
        (3, 21, 80, 8, 80),
        (3, 0, 64, 16, 64),
    ] {
        let blocks: Vec<Vec<f32>> = (0..n.div_ceil(per_run))
            .map(|_| rng.vec((per_run - 1) * stride + dim))
            .collect();
        let runs = RowRuns::new(blocks.iter().map(|b| &b[..]).collect(), per_run, stride, n);
        let slices: Vec<&[f32]> = (0..n)
            .map(|j| &blocks[j / per_run][(j % per_run) * stride..][..dim])
            .collect();
        let (as_runs, as_slices) = (runs.view(n), Rows::from_slices(&slices));
        assert_eq!(as_runs.len(), n);
        for (j, slice) in slices.iter().enumerate() {
            assert_eq!(&as_runs.row(j)[..dim], *slice, "row {j}");
        }
        let qs = rng.vec(heads * dim);
        let probs: Vec<f32> = rng.vec(heads * n).iter().map(|v| v.abs()).collect();
        let scales: Vec<f32> = rng.vec(heads).iter().map(|v| v.abs() + 0.1).collect();
        // The grouped sum takes each probability already times its head's scale.
        let weights: Vec<f32> = (0..heads * n)
            .map(|i| probs[i] * scales[i / n.max(1)])
            .collect();
        let start = rng.vec(heads * dim);
        for isa in variants() {
            isa.force().unwrap();
            let run = |rows: Rows| {
                let mut scores = vec![0f32; heads * n];
                dot_rows_heads(&qs, heads, rows, &mut scores);
                let mut one = vec![0f32; n];
                dot_rows(&qs[..dim], rows, 0, &mut one);
                let mut sums = start.clone();
                weighted_sum_heads(rows, heads, &weights, &mut sums);
                let mut first = start[..dim].to_vec();
                weighted_sum(rows, 0, &probs[..n], scales[0], &mut first);
                [scores, one, sums, first]
                    .concat()
                    .iter()
                    .map(|x| x.to_bits())
                    .collect::<Vec<_>>()
            };
            assert_eq!(run(as_runs), run(as_slices), "{isa:?} {heads} heads n {n}");
        }
        Isa::best().force().unwrap();
    }
}

#[test]
fn f16_rows_give_what_f32_rows_of_the_same_values_give_on_every_variant() {
    use treegrpo::model::kernels::{dot_rows_heads, weighted_sum_heads};
    let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
    let mut rng = Lcg(41);
    // Head-major blocks as the f16 pool lays them out, rows of exactly-representable
    // values (f16 of random f32s), the last block part-filled; lengths that leave a
    // vector loop's tail of 1–3 rows, and a width the vector loops do not take (80).
    for (heads, n, dim, per_run) in [
        (3usize, 37usize, 64usize, 16usize),
        (3, 130, 64, 64),
        (1, 3, 64, 64),
        (4, 65, 128, 64),
        (3, 21, 80, 8),
        (2, 0, 64, 16),
    ] {
        let halves: Vec<Vec<f16>> = (0..n.div_ceil(per_run))
            .map(|_| {
                rng.vec(per_run * dim)
                    .iter()
                    .map(|&x| f16::from_f32(x))
                    .collect()
            })
            .collect();
        let widened: Vec<Vec<f32>> = halves
            .iter()
            .map(|b| b.iter().map(|h| h.to_f32()).collect())
            .collect();
        let runs16 = RowRuns::new(halves.iter().map(|b| &b[..]).collect(), per_run, dim, n);
        let runs32 = RowRuns::new(widened.iter().map(|b| &b[..]).collect(), per_run, dim, n);
        let qs = rng.vec(heads * dim);
        let weights: Vec<f32> = rng.vec(heads * n).iter().map(|v| v.abs()).collect();
        let start = rng.vec(heads * dim);
        for isa in variants() {
            isa.force().unwrap();
            let (mut s16, mut s32) = (vec![0f32; heads * n], vec![0f32; heads * n]);
            dot_rows_heads(&qs, heads, runs16.view(n), &mut s16);
            dot_rows_heads(&qs, heads, runs32.view(n), &mut s32);
            let (mut w16, mut w32) = (start.clone(), start.clone());
            weighted_sum_heads(runs16.view(n), heads, &weights, &mut w16);
            weighted_sum_heads(runs32.view(n), heads, &weights, &mut w32);
            assert_eq!(
                bits(&s16),
                bits(&s32),
                "{isa:?} scores, {heads} heads n {n}"
            );
            assert_eq!(bits(&w16), bits(&w32), "{isa:?} sums, {heads} heads n {n}");
        }
        Isa::best().force().unwrap();
    }
}

#[test]
#[should_panic(expected = "not 3 rows")]
fn runs_too_short_for_their_rows_are_refused() {
    let block = vec![0f32; 100];
    // Three rows 64 apart need 2 · 64 + 1 floats at least; fine with 100 only for 2.
    let _ = RowRuns::new(vec![&block[..]], 4, 64, 3);
}

#[test]
fn softmax_maximum_in_lanes_equals_the_sequential_fold() {
    use treegrpo::model::kernels::max_of;
    let mut rng = Lcg(31);
    let fold = |x: &[f32]| x.iter().fold(f32::NEG_INFINITY, |m, &v| m.max(v));
    for n in [0, 1, 15, 16, 17, 100, 1031] {
        let mut x = rng.vec(n);
        assert_eq!(max_of(&x).to_bits(), fold(&x).to_bits(), "n {n}");
        if n > 3 {
            // A NaN is ignored, as `f32::max` ignores it; −∞ scores (masked) too.
            x[n / 2] = f32::NAN;
            x[1] = f32::NEG_INFINITY;
            assert_eq!(max_of(&x).to_bits(), fold(&x).to_bits(), "n {n} with NaN");
        }
    }
    assert_eq!(max_of(&[f32::NEG_INFINITY; 20]), f32::NEG_INFINITY);
}

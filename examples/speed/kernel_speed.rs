//! Micro-benchmark of our matmul kernels: every variant this CPU runs × weight format ×
//! batch rows, on one thread, at the default model's MLP shape (1536 × 576).
//! `cargo run --release --example kernel_speed [-- ISA FORMAT ROWS]` (filters, e.g.
//! `avx2 Q4_1 64`, for `perf stat` of one case). `OUT=N` sets the output features
//! (default 1536): `OUT=98304` makes a 56 MB Q4_1 matrix, past L3, so the weights
//! stream from memory as a whole model's do in a decode step.
use std::time::Instant;

use treegrpo::model::kernels::{Epilogue, Isa, OutputSink, PackedMatrix, WeightFormat};

fn main() {
    let out = std::env::var("OUT")
        .ok()
        .and_then(|v| v.parse::<usize>().ok())
        .filter(|&o| o > 0)
        .unwrap_or(1536);
    let inp = 576;
    let w: Vec<f32> = (0..out * inp)
        .map(|i| ((i * 7919 % 1000) as f32) / 500.0 - 1.0)
        .collect();
    let bf: Vec<half::bf16> = w.iter().map(|&v| half::bf16::from_f32(v)).collect();
    let q41 = ggml_q4_1(&w, out, inp);
    let matrices = [
        PackedMatrix::from_f32(out, inp, &w).unwrap(),
        PackedMatrix::from_bf16(out, inp, &bf).unwrap(),
        PackedMatrix::from_ggml(WeightFormat::Q4_1, out, inp, &q41).unwrap(),
    ];
    let filter: Vec<String> = std::env::args().skip(1).collect();
    let keep = |i: usize, v: &str| filter.get(i).is_none_or(|f| f == v);
    println!("| kernel | format | rows | µs / call | GFLOP/s | weight GB/s |");
    println!("|---|---|---|---|---|---|");
    if keep(0, "int8") {
        let rows_list = match filter.get(2).and_then(|r| r.parse::<usize>().ok()) {
            Some(r) => vec![r],
            None => vec![1usize, 8, 16, 32, 64],
        };
        int8_rows(&matrices[2], &rows_list, out, inp);
        if filter.first().is_some_and(|f| f == "int8") {
            return;
        }
    }
    for isa in Isa::ALL
        .into_iter()
        .filter(|i| i.available() && keep(0, i.name()))
    {
        for m in matrices
            .iter()
            .filter(|m| keep(1, &format!("{:?}", m.format())))
        {
            // A third argument names any row count, not only the table's.
            let rows_list = match filter.get(2).and_then(|r| r.parse::<usize>().ok()) {
                Some(r) => vec![r],
                None => vec![1usize, 8, 32, 64],
            };
            for rows in rows_list {
                let iters = if isa == Isa::Scalar {
                    3
                } else {
                    // About the same work whatever the matrix's size.
                    (4000 / rows + 50) * 1536 / out + 3
                };
                let secs = seconds_per_call(rows, out, inp, iters, |x, sink| {
                    m.gemm_panels_with(isa, x, rows, 0..m.panels(), sink)
                });
                println!(
                    "| {} | {:?} | {rows} | {:.1} | {:.1} | {:.1} |",
                    isa.name(),
                    m.format(),
                    secs * 1e6,
                    2.0 * (out * inp * rows) as f64 / secs / 1e9,
                    m.stored_bytes() as f64 / secs / 1e9,
                );
            }
        }
    }
}

/// The fast precision's 8-bit-activation kernel (VNNI where present) on the same Q4_1
/// matrix, rows as given by the third argument or the usual list.
fn int8_rows(q41: &PackedMatrix, rows_list: &[usize], out: usize, inp: usize) {
    let m = treegrpo::model::kernels::Int8Matrix::from_packed(q41).unwrap();
    let name = if treegrpo::model::kernels::vnni_available() {
        "vnni"
    } else {
        "int8-scalar"
    };
    for &rows in rows_list {
        let secs = seconds_per_call(rows, out, inp, 4000 / rows + 50, |x, sink| {
            m.gemm_panels(x, rows, 0..m.panels(), sink)
        });
        println!(
            "| {name} | int8 × Q4_1 | {rows} | {:.1} | {:.1} | {:.1} |",
            secs * 1e6,
            2.0 * (out * inp * rows) as f64 / secs / 1e9,
            m.stored_bytes() as f64 / secs / 1e9,
        );
    }
}

/// Mean seconds of one `gemm` call on `rows` rows of a fixed input, over `iters` calls
/// after one warm-up, each into a fresh output as the engine's calls are.
fn seconds_per_call(
    rows: usize,
    out: usize,
    inp: usize,
    iters: usize,
    gemm: impl Fn(&[f32], &OutputSink),
) -> f64 {
    let x: Vec<f32> = (0..rows * inp).map(|i| (i % 13) as f32 / 13.0).collect();
    let run = || {
        let mut y = vec![0f32; rows * out];
        let sink = OutputSink::new(&mut y, out, out, Epilogue::Store);
        gemm(&x, &sink);
        std::hint::black_box(y);
    };
    run();
    let t0 = Instant::now();
    for _ in 0..iters {
        run();
    }
    t0.elapsed().as_secs_f64() / iters as f64
}

/// ggml Q4_1 blocks of `w` (min/max per 32 weights), the layout GGUF files hold.
fn ggml_q4_1(w: &[f32], out: usize, inp: usize) -> Vec<u8> {
    let mut bytes = Vec::new();
    for row in w.chunks_exact(inp).take(out) {
        for blk in row.chunks_exact(32) {
            let (lo, hi) = blk
                .iter()
                .fold((f32::MAX, f32::MIN), |(a, b), &v| (a.min(v), b.max(v)));
            let d = (hi - lo) / 15.0;
            let inv = if d == 0.0 { 0.0 } else { 1.0 / d };
            bytes.extend_from_slice(&half::f16::from_f32(d).to_bits().to_le_bytes());
            bytes.extend_from_slice(&half::f16::from_f32(lo).to_bits().to_le_bytes());
            for j in 0..16 {
                let q = |v: f32| (((v - lo) * inv).round() as u8).min(15);
                bytes.push(q(blk[j]) | (q(blk[j + 16]) << 4));
            }
        }
    }
    bytes
}

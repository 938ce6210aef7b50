//! Micro-benchmark of the quantised matmul kernel: ns per weight block at several batch
//! sizes. `cargo run --release --example kernel_speed`
use candle_core::quantized::{GgmlDType, QTensor};
use candle_core::{Device, Tensor};
use std::time::Instant;
use treegrpo::model::quant::QuantMatrix;

fn main() {
    let (out, inp) = (1536, 576);
    let w: Vec<f32> = (0..out * inp)
        .map(|i| ((i * 7919 % 1000) as f32) / 500.0 - 1.0)
        .collect();
    let t = Tensor::from_vec(w, (out, inp), &Device::Cpu).unwrap();
    for dtype in [GgmlDType::Q4_1, GgmlDType::Q8_0] {
        let q = QTensor::quantize(&t, dtype).unwrap();
        let m = QuantMatrix::from_qtensor(&q).unwrap().unwrap();
        for rows in [1usize, 8, 32] {
            let x: Vec<f32> = (0..rows * inp).map(|i| (i % 13) as f32 / 13.0).collect();
            let iters = 2000 / rows.max(1) + 50;
            let t0 = Instant::now();
            for _ in 0..iters {
                std::hint::black_box(m.matmul(&x, rows));
            }
            let secs = t0.elapsed().as_secs_f64() / iters as f64;
            let blocks = (out * inp / 32 * rows) as f64;
            println!(
                "{dtype:?} rows {rows:>2}: {:.1} us/call, {:.2} ns per block-row, {:.1} GMAC/s",
                secs * 1e6,
                secs * 1e9 / blocks,
                blocks * 32.0 / secs / 1e9
            );
        }
    }
}

//! The independent implementation our logits are checked against: candle-transformers'
//! quantised llama on the same GGUF, in its dequantise-all (f32) mode — the arithmetic
//! our kernels perform, so the two may differ only by summation order.

use candle_core::{Device, Tensor};
use candle_transformers::models::quantized_llama::ModelWeights;

/// Sets `CANDLE_DEQUANTIZE_ALL` once for the test binary. Changing the environment
/// while another thread reads it is a data race, so every test calls this first,
/// before it starts anything that could read the environment; the `Once` makes the
/// other tests wait until the one write is done.
pub fn dequantize_all_in_candle() {
    static SET: std::sync::Once = std::sync::Once::new();
    SET.call_once(|| std::env::set_var("CANDLE_DEQUANTIZE_ALL", "1"));
}

/// candle's model of `path`, in its f32 mode (read when candle first builds a
/// `QMatMul`, so it is set before loading).
pub fn candle_model(path: &std::path::Path) -> ModelWeights {
    dequantize_all_in_candle();
    let mut file = std::fs::File::open(path).unwrap();
    let content = candle_core::quantized::gguf_file::Content::read(&mut file).unwrap();
    ModelWeights::from_gguf(content, &mut file, &Device::Cpu).unwrap()
}

/// candle's logits at every position, feeding one token at a time.
pub fn candle_logits(m: &mut ModelWeights, tokens: &[u32]) -> Vec<Vec<f32>> {
    tokens
        .iter()
        .enumerate()
        .map(|(pos, &t)| {
            let x = Tensor::new(&[t], &Device::Cpu)
                .unwrap()
                .unsqueeze(0)
                .unwrap();
            let l = m.forward(&x, pos).unwrap();
            l.flatten_all().unwrap().to_vec1::<f32>().unwrap()
        })
        .collect()
}

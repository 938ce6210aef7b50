//! Running an [`Int8Matrix`]: the dispatch between the VNNI variant (`int8_vnni.rs`)
//! and the scalar reference loop, which compute the same values (see `int8.rs` for
//! the layout and the arithmetic both follow).

use std::cell::RefCell;
use std::ops::Range;

use rayon::prelude::*;

use super::int8::{Int8Matrix, QuantizedRows};
use super::packed::{BLOCK, PANEL};
use super::{split_range, Epilogue, OutputSink, TileSink};

impl Int8Matrix {
    /// Runs panels `panels` over `rows` rows of `x` (quantised here, per call) on the
    /// calling thread, results to `sink`.
    pub fn gemm_panels(&self, x: &[f32], rows: usize, panels: Range<usize>, sink: &dyn TileSink) {
        assert!(x.len() >= rows * self.inp, "activation shape");
        assert!(panels.end <= self.panels, "panel range");
        SCRATCH.with(|s| {
            let mut q = s.borrow_mut();
            #[cfg(target_arch = "x86_64")]
            if vnni_available() {
                q.resize(rows, self.inp);
                // SAFETY: the CPU runs AVX-512F/BW/VNNI and F16C (checked); `q` is
                // sized for `rows` rows (above); bounds asserted above and inside.
                unsafe {
                    super::int8_vnni::quantize(x, &mut q, rows * self.blocks);
                    super::int8_vnni::gemm(self, &q, rows, panels, sink);
                }
                return;
            }
            q.quantize(x, rows, self.inp);
            gemm_scalar(self, &q, rows, panels, sink);
        })
    }

    /// [`Self::gemm_panels`] on the scalar variant (the oracle the tests compare the
    /// VNNI variant with).
    pub fn gemm_panels_scalar(
        &self,
        x: &[f32],
        rows: usize,
        panels: Range<usize>,
        sink: &dyn TileSink,
    ) {
        assert!(x.len() >= rows * self.inp, "activation shape");
        assert!(panels.end <= self.panels, "panel range");
        let mut q = QuantizedRows::default();
        q.quantize(x, rows, self.inp);
        gemm_scalar(self, &q, rows, panels, sink);
    }

    /// `y = x · Wᵀ` for `x: [rows, in]`, returning `[rows, out]`; panels split over
    /// rayon's threads.
    pub fn matmul(&self, x: &[f32], rows: usize) -> Vec<f32> {
        let mut y = vec![0f32; rows * self.out];
        let sink = OutputSink::new(&mut y, self.out, self.out, Epilogue::Store);
        split_range(self.panels, rayon::current_num_threads() * 4)
            .into_par_iter()
            .for_each(|range| self.gemm_panels(x, rows, range, &sink));
        y
    }
}

/// Whether the VNNI variant runs here (else the scalar one computes the same values).
pub fn vnni_available() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        std::arch::is_x86_feature_detected!("avx512f")
            && std::arch::is_x86_feature_detected!("avx512bw")
            && std::arch::is_x86_feature_detected!("avx512vnni")
            && std::arch::is_x86_feature_detected!("f16c")
    }
    #[cfg(not(target_arch = "x86_64"))]
    false
}

thread_local! {
    /// Each thread's quantised activations, reused from call to call.
    static SCRATCH: RefCell<QuantizedRows> = RefCell::new(QuantizedRows::default());
}

/// The reference loop: one (row, panel) at a time, the module docs' operations.
fn gemm_scalar(
    m: &Int8Matrix,
    q: &QuantizedRows,
    rows: usize,
    panels: Range<usize>,
    sink: &dyn TileSink,
) {
    for p in panels {
        for r in 0..rows {
            let mut acc = [0f32; PANEL];
            for b in 0..m.blocks {
                let xq = &q.q[r * m.inp + b * BLOCK..][..BLOCK];
                let (dx, sx) = (q.dx[r * m.blocks + b], q.sx[r * m.blocks + b]);
                for (l, a) in acc.iter_mut().enumerate() {
                    // Padding outputs past `out` have zero codes and scales.
                    let o = p * PANEL + l;
                    let isum: i32 = (0..BLOCK)
                        .map(|j| m.code(o, b * BLOCK + j) as i32 * xq[j] as i32)
                        .sum();
                    let (d, mm) = m.scale_offset(p, b, l);
                    *a = (isum as f32).mul_add(d * dx, *a);
                    *a = mm.mul_add(sx, *a);
                }
            }
            sink.tile(r, 1, p, 1, &[acc]);
        }
    }
}

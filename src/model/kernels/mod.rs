//! Our matmul kernels: f32 activations against f32, bf16, f16, Q4_0, Q4_1 or Q8_0
//! weights, with one fixed order of arithmetic per output whatever the batch, the
//! thread count or the instruction set.
//!
//! - [`packed`]: weights repacked at load into panels of 16 outputs.
//! - `tile.rs`: the one loop every instruction set runs (the order it fixes is there).
//! - `avx512.rs`, `avx2.rs`, `scalar.rs`: that loop's sixteen lanes on each instruction
//!   set, chosen at run time ([`Isa::active`]), so one binary uses what the CPU has.
//! - [`rows`]: attention's row loops on the same lanes ([`dot_rows`] for scores,
//!   [`weighted_sum`] for values), bit-identical on every variant too.
//! - [`exp`]: softmax's `exp` sixteen at a time, bit-identical to glibc's `expf`.
//! - [`int8`] (run by `int8_gemm.rs` and `int8_vnni.rs`): the fast precision mode's matmul, 8-bit
//!   activations against the block quants with integer dot products, as llama.cpp
//!   does; not exact, but still batch-invariant and equal on its two variants.
//!
//! The crate is still compiled with `+avx2,+fma,+f16c` (`.cargo/config.toml`) because
//! candle's K-quant kernels choose their code at compile time; our dispatch is what
//! picks AVX-512 where the CPU has it, and the scalar variant is what the tests
//! compare the others with.
//!
//! Why not candle's: its quantised kernel quantises every activation row to 8 bits
//! (logits move by about one unit and greedy answers change on the default model) and
//! walks all the weights once per row; its dense gemm changes its reduction order with
//! the row count (results vary by about 1e-6 with the batch). Here a row's result is
//! bit-identical alone or in any batch, on every instruction set: the engine's batch
//! invariance rests on it, and a quantised matrix gives exactly what its dequantised
//! f32 copy gives, so the trainer's dense weights start where the engine's Q4 left off.
//!
//! Callers hand results to a [`TileSink`] ([`OutputSink`]: store with a bias, or add
//! into a residual), so an epilogue costs no extra pass over memory, and a caller that
//! splits the panels over threads gives each its own columns of one output buffer.

#[cfg(target_arch = "x86_64")]
mod avx2;
#[cfg(target_arch = "x86_64")]
mod avx512;
mod entry_points;
pub mod exp;
mod exp_f64;
pub mod int8;
mod int8_gemm;
#[cfg(target_arch = "x86_64")]
mod int8_vnni;
pub mod kv_elem;
mod lanes;
pub mod packed;
mod prefetch;
pub mod row_runs;
pub mod rows;
mod scalar;
mod source;
mod tile;

use std::ops::Range;
use std::sync::atomic::{AtomicU8, Ordering};

use rayon::prelude::*;

pub use exp::{exp_in_place, exp_in_place_with};
pub use exp_f64::{exp_f64_in_place, exp_f64_in_place_with};
pub use int8::Int8Matrix;
pub use int8_gemm::vnni_available;
pub use kv_elem::KvElem;
pub use packed::{PackError, PackedMatrix, WeightFormat, PANEL};
pub use row_runs::{RowRuns, Rows};
pub use rows::{dot_fixed, max_of};

/// Most accumulator vectors one tile produces (4 panels × 1 row, 2 × 8, or one panel
/// of up to 24 rows).
pub(crate) const MAX_TILE: usize = 24;

/// An instruction set a kernel variant is written for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Isa {
    /// AVX-512F (x86-64).
    Avx512,
    /// AVX2 with FMA and F16C (x86-64).
    Avx2,
    /// Plain Rust, runs anywhere: the reference the other variants are tested against.
    Scalar,
}

/// Why a kernel variant cannot be selected.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum KernelError {
    /// The variant asked for needs instructions this CPU lacks.
    #[error("this CPU cannot run the {0:?} kernels")]
    Unavailable(Isa),
    /// A kernel name other than `avx512`, `avx2` or `scalar`.
    #[error("unknown kernel `{0}` (expected avx512, avx2 or scalar)")]
    Unknown(String),
}

/// 0: not chosen yet; otherwise `Isa as u8 + 1`.
static ACTIVE: AtomicU8 = AtomicU8::new(0);

impl Isa {
    /// Every variant, fastest first.
    pub const ALL: [Isa; 3] = [Isa::Avx512, Isa::Avx2, Isa::Scalar];

    /// Whether this CPU runs the variant.
    pub fn available(self) -> bool {
        match self {
            #[cfg(target_arch = "x86_64")]
            Isa::Avx512 => std::arch::is_x86_feature_detected!("avx512f"),
            #[cfg(target_arch = "x86_64")]
            Isa::Avx2 => {
                std::arch::is_x86_feature_detected!("avx2")
                    && std::arch::is_x86_feature_detected!("fma")
                    && std::arch::is_x86_feature_detected!("f16c")
            }
            Isa::Scalar => true,
            #[allow(unreachable_patterns)]
            _ => false,
        }
    }

    /// The fastest variant this CPU runs.
    pub fn best() -> Isa {
        Isa::ALL
            .into_iter()
            .find(|i| i.available())
            .unwrap_or(Isa::Scalar)
    }

    /// The variant's name: `avx512`, `avx2` or `scalar` (what `TREEGRPO_KERNEL` takes).
    pub fn name(self) -> &'static str {
        match self {
            Isa::Avx512 => "avx512",
            Isa::Avx2 => "avx2",
            Isa::Scalar => "scalar",
        }
    }

    /// Parses `avx512`, `avx2` or `scalar`.
    pub fn parse(name: &str) -> Result<Isa, KernelError> {
        Isa::ALL
            .into_iter()
            .find(|i| i.name() == name)
            .ok_or_else(|| KernelError::Unknown(name.to_string()))
    }

    /// The variant every matmul in this process uses: [`Isa::force`]'s choice, else
    /// `TREEGRPO_KERNEL` (avx512, avx2 or scalar) if set and runnable, else the best.
    pub fn active() -> Isa {
        match ACTIVE.load(Ordering::Relaxed) {
            0 => {
                let chosen = std::env::var("TREEGRPO_KERNEL")
                    .ok()
                    .and_then(|v| Isa::parse(v.trim()).ok())
                    .filter(|i| i.available())
                    .unwrap_or_else(Isa::best);
                ACTIVE.store(chosen as u8 + 1, Ordering::Relaxed);
                chosen
            }
            v => Isa::ALL[(v - 1) as usize],
        }
    }

    /// Makes every later matmul in this process use `self` (tests use it to run each
    /// variant the CPU has; results are identical across variants by construction).
    pub fn force(self) -> Result<(), KernelError> {
        if !self.available() {
            return Err(KernelError::Unavailable(self));
        }
        ACTIVE.store(self as u8 + 1, Ordering::Relaxed);
        Ok(())
    }
}

/// Receives a kernel's results a tile at a time: rows `r0..r0 + nr` × panels
/// `p0..p0 + np`, `acc[r * np + j]` holding row `r0 + r`'s 16 outputs of panel `p0 + j`.
/// One matmul call reports each (row, panel) exactly once, so sinks that write disjoint
/// places per (row, panel) may be shared by the threads splitting the panels.
pub trait TileSink: Sync {
    /// Takes rows `r0..r0 + nr` × panels `p0..p0 + np` of results, `acc[r * np + j]`
    /// holding row `r0 + r`'s [`PANEL`] outputs of panel `p0 + j`.
    fn tile(&self, r0: usize, nr: usize, p0: usize, np: usize, acc: &[[f32; PANEL]]);
}

/// What [`OutputSink`] does with a result.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Epilogue {
    /// `out[r][o] = acc (+ bias[o])`.
    Store,
    /// `out[r][o] += acc (+ bias[o])` (a residual connection).
    Accumulate,
}

/// Writes results into a row-major `[rows, width]` buffer, columns past `cols` dropped.
pub struct OutputSink<'a> {
    out: *mut f32,
    len: usize,
    width: usize,
    cols: usize,
    bias: Option<&'a [f32]>,
    epilogue: Epilogue,
    _borrow: std::marker::PhantomData<&'a mut [f32]>,
}

// SAFETY: each (row, panel) a matmul reports maps to its own columns of `out`, and a
// matmul reports each once (see `TileSink`), so threads sharing the sink never write
// the same element; `out` is borrowed mutably for 'a, so no one else touches it.
unsafe impl Sync for OutputSink<'_> {}

impl<'a> OutputSink<'a> {
    /// `out` is `[rows, width]`; outputs `0..cols` are written.
    pub fn new(out: &'a mut [f32], width: usize, cols: usize, epilogue: Epilogue) -> Self {
        OutputSink {
            out: out.as_mut_ptr(),
            len: out.len(),
            width,
            cols: cols.min(width),
            bias: None,
            epilogue,
            _borrow: std::marker::PhantomData,
        }
    }

    /// A sink over raw memory, for callers that share one buffer between threads.
    ///
    /// # Safety
    /// `out..out + len` is valid for writes for `'a`, and sinks used at once over the
    /// same memory are given disjoint panel ranges (so they write disjoint columns).
    pub unsafe fn from_raw_parts(
        out: *mut f32,
        len: usize,
        width: usize,
        cols: usize,
        epilogue: Epilogue,
    ) -> Self {
        OutputSink {
            out,
            len,
            width,
            cols: cols.min(width),
            bias: None,
            epilogue,
            _borrow: std::marker::PhantomData,
        }
    }

    /// Adds `bias[o]` to every output `o`.
    pub fn with_bias(mut self, bias: Option<&'a [f32]>) -> Self {
        self.bias = bias;
        self
    }

    /// Row `r`'s outputs `col0..col0 + 16` (fewer past `cols`), given as a slice so the
    /// epilogue's loops run on whole vectors.
    ///
    /// # Safety
    /// No other reference to these outputs is live: a matmul reports each (row, panel)
    /// once (see `TileSink`), and the caller drops the slice before the next.
    #[allow(clippy::mut_from_ref)]
    unsafe fn panel_out(&self, r: usize, col0: usize) -> &mut [f32] {
        let n = PANEL.min(self.cols.saturating_sub(col0));
        let start = r * self.width + col0;
        assert!(start + n <= self.len, "sink row {r} out of bounds");
        // SAFETY: in bounds (checked above); unaliased by the caller's contract.
        unsafe { std::slice::from_raw_parts_mut(self.out.add(start), n) }
    }
}

impl TileSink for OutputSink<'_> {
    fn tile(&self, r0: usize, nr: usize, p0: usize, np: usize, acc: &[[f32; PANEL]]) {
        for r in 0..nr {
            for (j, a) in acc[r * np..(r + 1) * np].iter().enumerate() {
                let col0 = (p0 + j) * PANEL;
                // SAFETY: each (row, panel) is reported once; the slice dies here.
                let out = unsafe { self.panel_out(r0 + r, col0) };
                let n = out.len();
                let bias = self.bias.map(|b| &b[col0..col0 + n]);
                // A whole panel (all but a matrix's last, when its width is not a
                // multiple of 16) as a fixed-size write: a slice of unknown length
                // went through a `memmove` call per (row, panel), 2.6% of a rollout.
                if n == PANEL {
                    write_panel(self.epilogue, &mut out[..PANEL], &a[..PANEL], bias);
                } else {
                    write_panel(self.epilogue, out, &a[..n], bias);
                }
            }
        }
    }
}

/// One (row, panel)'s results `a` into `out` by `epilogue`, with `bias` added if any.
#[inline(always)]
fn write_panel(epilogue: Epilogue, out: &mut [f32], a: &[f32], bias: Option<&[f32]>) {
    match (epilogue, bias) {
        (Epilogue::Store, None) => out.copy_from_slice(a),
        (Epilogue::Store, Some(b)) => {
            for ((o, v), b) in out.iter_mut().zip(a).zip(b) {
                *o = v + b;
            }
        }
        (Epilogue::Accumulate, None) => {
            for (o, v) in out.iter_mut().zip(a) {
                *o += v;
            }
        }
        (Epilogue::Accumulate, Some(b)) => {
            for ((o, v), b) in out.iter_mut().zip(a).zip(b) {
                *o += v + b;
            }
        }
    }
}

impl PackedMatrix {
    /// Runs panels `panels` of `self` over `rows` rows of `x` on the calling thread
    /// with the given kernel variant (which must be available), results to `sink`.
    pub fn gemm_panels_with(
        &self,
        isa: Isa,
        x: &[f32],
        rows: usize,
        panels: Range<usize>,
        sink: &dyn TileSink,
    ) {
        assert!(isa.available(), "{isa:?} kernels on a CPU without them");
        assert!(x.len() >= rows * self.inp, "activation shape");
        assert!(panels.end <= self.panels, "panel range");
        match isa {
            // SAFETY: the CPU runs the variant (asserted); bounds asserted above and
            // again inside the kernel.
            #[cfg(target_arch = "x86_64")]
            Isa::Avx512 => unsafe { avx512::gemm(self, x, rows, panels, sink) },
            #[cfg(target_arch = "x86_64")]
            Isa::Avx2 => unsafe { avx2::gemm(self, x, rows, panels, sink) },
            // SAFETY: bounds as above; no instruction-set requirement.
            _ => unsafe { scalar::gemm(self, x, rows, panels, sink) },
        }
    }

    /// [`Self::gemm_panels_with`] on the active variant.
    pub fn gemm_panels(&self, x: &[f32], rows: usize, panels: Range<usize>, sink: &dyn TileSink) {
        self.gemm_panels_with(Isa::active(), x, rows, panels, sink)
    }

    /// `y = x · Wᵀ` for `x: [rows, in]`, returning `[rows, out]`; panels are split
    /// over rayon's threads (the engine's forward uses its own team instead).
    pub fn matmul(&self, x: &[f32], rows: usize) -> Vec<f32> {
        self.matmul_with(Isa::active(), x, rows)
    }

    /// [`Self::matmul`] on a given variant.
    pub fn matmul_with(&self, isa: Isa, x: &[f32], rows: usize) -> Vec<f32> {
        let mut y = vec![0f32; rows * self.out];
        let sink = OutputSink::new(&mut y, self.out, self.out, Epilogue::Store);
        let chunks = split_range(self.panels, rayon::current_num_threads() * 4);
        chunks
            .into_par_iter()
            .for_each(|range| self.gemm_panels_with(isa, x, rows, range, &sink));
        y
    }
}

/// `out[d] += Σ_j (probs[j] · scale) · row_j[offset + d]` on the active variant: each
/// lane summed in `j` order from zero, a product then a sum per step (attention's
/// weighted sum of values; the same result on every variant).
///
/// # Panics
/// If `rows` and `probs` differ in length or a row is shorter than
/// `offset + out.len()`.
pub fn weighted_sum(rows: Rows, offset: usize, probs: &[f32], scale: f32, out: &mut [f32]) {
    match Isa::active() {
        // SAFETY: `Isa::active` only returns variants the CPU runs; bounds are
        // asserted inside.
        #[cfg(target_arch = "x86_64")]
        Isa::Avx512 => unsafe { avx512::weighted_sum(rows, offset, probs, scale, out) },
        #[cfg(target_arch = "x86_64")]
        Isa::Avx2 => unsafe { avx2::weighted_sum(rows, offset, probs, scale, out) },
        // SAFETY: bounds asserted inside; no instruction-set requirement.
        _ => unsafe { scalar::weighted_sum(rows, offset, probs, scale, out) },
    }
}

/// `out[j] = dot_fixed(q, row_j[offset .. offset + q.len()])` (see
/// [`rows::dot_fixed`] for the order): attention's scores. Four rows at a time on
/// AVX-512 and AVX2, bit-identical to the plain loop.
///
/// # Panics
/// If `out` and `rows` differ in length or a row is too short.
pub fn dot_rows(q: &[f32], rows: Rows, offset: usize, out: &mut [f32]) {
    assert!(out.len() == rows.len() && rows.width() >= offset + q.len());
    #[cfg(target_arch = "x86_64")]
    if q.len().is_multiple_of(16) {
        match Isa::active() {
            // SAFETY: `Isa::active` only returns variants the CPU runs; the AVX-512
            // variant also needs AVX2 (it shares the AVX2 reduction), checked here.
            // Shapes asserted above.
            Isa::Avx512 if Isa::Avx2.available() => {
                unsafe { avx512::dot_rows(q, rows, offset, out) };
                return;
            }
            Isa::Avx2 => {
                unsafe { avx2::dot_rows(q, rows, offset, out) };
                return;
            }
            _ => {}
        }
    }
    for (j, o) in out.iter_mut().enumerate() {
        *o = rows::dot_fixed(q, &rows.row(j)[offset..offset + q.len()]);
    }
}

/// [`dot_rows`] of `heads` queries (`qs`: `heads × dim`, grouped-query attention's heads
/// sharing one KV head) with the same rows, head `h`'s scores into
/// `out[h · rows.len()..]`. On AVX-512 each key row is read once for up to four heads;
/// on AVX2 the heads take turns on each four rows, which stay in L1 between them;
/// every score is bit-identical to `dot_rows`'s.
///
/// # Panics
/// If `qs` is not `heads` queries, `out` is not `heads × rows.len()`, or a row is
/// shorter than a query.
///
/// Rows may be f16 ([`KvElem`]): each value widens exactly as it is loaded, so f16 rows
/// give what f32 rows of the same values give.
pub fn dot_rows_heads<T: KvElem>(qs: &[f32], heads: usize, rows: Rows<T>, out: &mut [f32]) {
    assert!(
        heads > 0 && qs.len().is_multiple_of(heads),
        "{heads} heads in {} values",
        qs.len()
    );
    let (n, dim) = (rows.len(), qs.len() / heads);
    assert!(out.len() == heads * n && rows.width() >= dim);
    #[cfg(target_arch = "x86_64")]
    if dim.is_multiple_of(16) && Isa::active() == Isa::Avx512 && Isa::Avx2.available() {
        let mut h0 = 0;
        while h0 < heads {
            let h = (heads - h0).min(avx512::MAX_SCORE_HEADS);
            let (q, o) = (
                &qs[h0 * dim..(h0 + h) * dim],
                &mut out[h0 * n..(h0 + h) * n],
            );
            // SAFETY: the CPU runs AVX-512F and AVX2 (checked); shapes asserted above.
            unsafe {
                match h {
                    1 => avx512::dot_rows_heads::<1, T>(q, rows, 0, o),
                    2 => avx512::dot_rows_heads::<2, T>(q, rows, 0, o),
                    3 => avx512::dot_rows_heads::<3, T>(q, rows, 0, o),
                    _ => avx512::dot_rows_heads::<4, T>(q, rows, 0, o),
                }
            }
            h0 += h;
        }
        return;
    }
    #[cfg(target_arch = "x86_64")]
    if dim.is_multiple_of(16) && Isa::active() == Isa::Avx2 {
        // SAFETY: the CPU runs AVX2 and FMA (`Isa::active` only returns variants it
        // runs); shapes asserted above.
        unsafe { avx2::dot_rows_heads(qs, heads, rows, 0, out) };
        return;
    }
    // The plain loop `dot_rows` runs where neither vector loop applies.
    rows::dot_rows_tail(qs, heads, rows, 0, 0, out);
}

/// [`weighted_sum`] for `heads` heads over the same value rows, each weight already
/// multiplied by its head's scale: head `h` adds `Σ_j weights[h·n + j] · row_j` into
/// `out[h·width..(h+1)·width]`. Passing `weights[h·n + j] = probs[h·n + j] ·
/// scales[h]` gives bit-identically what `weighted_sum(rows, 0, probs_h, scales[h],
/// out_h)` gives (it forms the same product). On AVX-512 each value row is read once
/// for up to four heads, on AVX2 for up to three (32 lanes at a time).
///
/// # Panics
/// If `heads` is 0, `weights` is not `heads × rows.len()`, `out` is not `heads` equal
/// widths, or a row is shorter than a width.
///
/// Rows may be f16, as in [`dot_rows_heads`].
pub fn weighted_sum_heads<T: KvElem>(
    rows: Rows<T>,
    heads: usize,
    weights: &[f32],
    out: &mut [f32],
) {
    let n = rows.len();
    assert!(heads > 0 && out.len().is_multiple_of(heads) && weights.len() == heads * n);
    let width = out.len() / heads;
    assert!(rows.width() >= width);
    // The grouped loop of the active variant and how many heads it takes at once.
    type Grouped<T> = unsafe fn(Rows<T>, usize, &[f32], &mut [f32]);
    let grouped: Option<(Grouped<T>, usize)> = match Isa::active() {
        #[cfg(target_arch = "x86_64")]
        Isa::Avx512 => Some((avx512::weighted_sum_heads::<T>, avx512::MAX_SUM_HEADS)),
        #[cfg(target_arch = "x86_64")]
        Isa::Avx2 => Some((avx2::weighted_sum_heads::<T>, avx2::MAX_SUM_HEADS)),
        _ => None,
    };
    if let Some((run, most)) = grouped {
        let mut h0 = 0;
        while h0 < heads {
            let h = (heads - h0).min(most);
            let w = &weights[h0 * n..(h0 + h) * n];
            let o = &mut out[h0 * width..(h0 + h) * width];
            // SAFETY: `Isa::active` only returns variants the CPU runs; at most
            // `most` heads; shapes asserted above.
            unsafe { run(rows, h, w, o) };
            h0 += h;
        }
        return;
    }
    for (h, o) in out.chunks_exact_mut(width.max(1)).enumerate().take(heads) {
        // `p · 1` is `p`: the product `weighted_sum` forms is the weight itself.
        // SAFETY: no instruction-set requirement; bounds are asserted inside.
        unsafe {
            scalar::weighted_sum(rows, 0, &weights[h * n..(h + 1) * n], 1.0, &mut o[..width])
        };
    }
}

/// Splits `0..n` into at most `parts` contiguous ranges, as equal as possible.
pub fn split_range(n: usize, parts: usize) -> Vec<Range<usize>> {
    let parts = parts.clamp(1, n.max(1));
    (0..parts)
        .map(|i| n * i / parts..n * (i + 1) / parts)
        .filter(|r| !r.is_empty())
        .collect()
}

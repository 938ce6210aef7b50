//! Attention's two row loops: dot products of one query with many key rows
//! ([`dot_fixed`], and four keys at a time in `avx512.rs` and `avx2.rs`), and weighted sums of
//! value rows (`Σ_j p_j · v_j`) on the same `Lanes` as the matmul, so the sums stay in
//! vector registers (written as plain Rust, LLVM kept them in memory and in scalar
//! registers, and that loop was most of the rollout's attention time).

use super::kv_elem::{self, KvElem};
use super::lanes::Lanes;
use super::prefetch::PREFETCH_ROWS;
use super::row_runs::Rows;
use super::PANEL;

/// `out[d] += Σ_j (probs[j] · scale) · row_j[offset + d]`, each lane summed in `j`
/// order from zero with a product then a sum (two roundings), then added to `out`.
///
/// # Safety
/// The CPU runs `L`'s instructions.
#[inline(always)]
pub(super) unsafe fn weighted_sum<L: Lanes, T: KvElem>(
    rows: Rows<T>,
    offset: usize,
    probs: &[f32],
    scale: f32,
    out: &mut [f32],
) {
    assert!(rows.len() == probs.len() && rows.width() >= offset + out.len());
    let (n, width) = (rows.len(), out.len());
    let mut d0 = 0;
    // Four vectors (64 lanes) at a time: four independent chains of adds.
    while d0 + 4 * PANEL <= width {
        let mut acc = [L::zero(); 4];
        for (j, &p) in probs.iter().enumerate() {
            if j + PREFETCH_ROWS < n {
                kv_elem::prefetch(rows.ptr(j + PREFETCH_ROWS).add(offset + d0), 4 * PANEL);
            }
            let w = L::splat(p * scale);
            let at = rows.ptr(j).add(offset + d0);
            for (c, a) in acc.iter_mut().enumerate() {
                *a = L::mul_add_twice(w, kv_elem::lanes::<L, T>(at.add(c * PANEL)), *a);
            }
        }
        for (c, a) in acc.iter().enumerate() {
            add_into::<L>(out.as_mut_ptr().add(d0 + c * PANEL), *a);
        }
        d0 += 4 * PANEL;
    }
    while d0 + PANEL <= width {
        let mut acc = L::zero();
        for (j, &p) in probs.iter().enumerate() {
            acc = L::mul_add_twice(
                L::splat(p * scale),
                kv_elem::lanes::<L, T>(rows.ptr(j).add(offset + d0)),
                acc,
            );
        }
        add_into::<L>(out.as_mut_ptr().add(d0), acc);
        d0 += PANEL;
    }
    for (d, o) in out.iter_mut().enumerate().skip(d0) {
        let mut acc = 0f32;
        for (j, &p) in probs.iter().enumerate() {
            acc += p * scale * rows.row(j)[offset + d].widen();
        }
        *o += acc;
    }
}

/// [`weighted_sum`] for `H` query heads at once, `VS` panels (16 lanes each) of the
/// width at a time: head `h` adds `Σ_j weights[h·n + j] · row_j` into
/// `out[h·width..(h+1)·width]`, where the caller has already multiplied each weight by
/// its head's scale (`probs[h·n + j] · scales[h]`, the product `weighted_sum` forms
/// itself). Each value row's piece is loaded once for all heads, and every lane still
/// receives its own product-then-sum in row order from zero, so each head's result is
/// bit-identical to `weighted_sum` alone. `H × VS` vectors of accumulators must fit the
/// registers: 4 × 4 on AVX-512, 3 × 2 on AVX2. Rows are walked run by run (a pointer
/// step a row, not an index lookup), prefetching the next run's row at the same place.
///
/// # Safety
/// The CPU runs `L`'s instructions; `out.len() == H * width`, `weights.len() == H *
/// rows.len()`, and every row holds `width` values.
#[inline(always)]
pub(super) unsafe fn weighted_sum_heads<L: Lanes, T: KvElem, const H: usize, const VS: usize>(
    rows: Rows<T>,
    weights: &[f32],
    out: &mut [f32],
) {
    assert!(weights.len() == H * rows.len() && out.len().is_multiple_of(H));
    let (n, width) = (rows.len(), out.len() / H);
    assert!(rows.width() >= width);
    let (runs, per_run, stride) = (rows.run_count(), rows.rows_per_run(), rows.stride());
    let piece = VS * PANEL;
    let w = weights.as_ptr();
    let mut d0 = 0;
    while d0 + piece <= width {
        let mut acc = [[L::zero(); VS]; H];
        for r in 0..runs {
            let first = r * per_run;
            let count = per_run.min(n - first);
            let base = rows.run_ptr(r).add(d0);
            // The next run's rows (`per_run` ahead), or none past the last run.
            let (ahead, ahead_rows) = if r + 1 < runs {
                (
                    rows.run_ptr(r + 1).add(d0),
                    per_run.min(n - first - per_run),
                )
            } else {
                (base, 0)
            };
            for i in 0..count {
                if i < ahead_rows {
                    kv_elem::prefetch(ahead.add(i * stride), piece);
                }
                let at = base.add(i * stride);
                let v: [L::V; VS] =
                    std::array::from_fn(|c| kv_elem::lanes::<L, T>(at.add(c * PANEL)));
                for (h, acc_h) in acc.iter_mut().enumerate() {
                    let wt = L::splat(*w.add(h * n + first + i));
                    for c in 0..VS {
                        acc_h[c] = L::mul_add_twice(wt, v[c], acc_h[c]);
                    }
                }
            }
        }
        for (h, acc_h) in acc.iter().enumerate() {
            for (c, a) in acc_h.iter().enumerate() {
                add_into::<L>(out.as_mut_ptr().add(h * width + d0 + c * PANEL), *a);
            }
        }
        d0 += piece;
    }
    if d0 < width {
        for h in 0..H {
            weighted_sum::<L, T>(
                rows,
                d0,
                &weights[h * n..(h + 1) * n],
                1.0,
                &mut out[h * width + d0..(h + 1) * width],
            );
        }
    }
}

/// The rows from `from` on that the vector score loops leave (fewer than four): each
/// head's [`dot_fixed`] with each row, head `h`'s scores at `out[h * rows.len()..]`.
pub(super) fn dot_rows_tail<T: KvElem>(
    qs: &[f32],
    heads: usize,
    rows: Rows<T>,
    offset: usize,
    from: usize,
    out: &mut [f32],
) {
    let (n, dim) = (rows.len(), qs.len() / heads);
    let mut buf = Vec::new();
    for j in from..n {
        let row = T::as_f32(&rows.row(j)[offset..offset + dim], &mut buf);
        for h in 0..heads {
            out[h * n + j] = dot_fixed(&qs[h * dim..(h + 1) * dim], row);
        }
    }
}

#[inline(always)]
unsafe fn add_into<L: Lanes>(at: *mut f32, v: L::V) {
    let mut lanes = [0f32; PANEL];
    L::store(lanes.as_mut_ptr(), v);
    for (o, l) in std::slice::from_raw_parts_mut(at, PANEL)
        .iter_mut()
        .zip(lanes)
    {
        *o += l;
    }
}

/// The dot product every variant reproduces: sixteen lane sums (`fma` over the chunks
/// of sixteen, in order), a sequential `fma` tail, then the lanes halved pairwise
/// (`l += l + 8`, `+ 4`, `+ 2`, `+ 1`) and the tail added last.
#[inline]
pub fn dot_fixed(a: &[f32], b: &[f32]) -> f32 {
    const L: usize = 16;
    let mut lanes = [0f32; L];
    let (ca, cb) = (a.chunks_exact(L), b.chunks_exact(L));
    let (ta, tb) = (ca.remainder(), cb.remainder());
    for (xa, xb) in ca.zip(cb) {
        for l in 0..L {
            lanes[l] = xa[l].mul_add(xb[l], lanes[l]);
        }
    }
    let mut tail = 0f32;
    for (x, y) in ta.iter().zip(tb) {
        tail = x.mul_add(*y, tail);
    }
    let mut width = L;
    while width > 1 {
        width /= 2;
        for l in 0..width {
            lanes[l] += lanes[l + width];
        }
    }
    lanes[0] + tail
}

/// The largest value of `x` (`−∞` when empty, NaNs ignored as `f32::max` does), sixteen
/// lanes at a time: a maximum does not depend on the order it is taken in, so this
/// equals the sequential `fold` up to the sign of a zero maximum, which softmax's
/// `exp(v − max)` cannot see. A sequential fold is one dependent `max` per score.
pub fn max_of(x: &[f32]) -> f32 {
    const L: usize = 16;
    let mut lanes = [f32::NEG_INFINITY; L];
    let chunks = x.chunks_exact(L);
    let tail = chunks.remainder();
    for c in chunks {
        for l in 0..L {
            lanes[l] = lanes[l].max(c[l]);
        }
    }
    lanes
        .iter()
        .chain(tail)
        .fold(f32::NEG_INFINITY, |m, &v| m.max(v))
}

//! Weighted sums of rows — attention's `Σ_j p_j · v_j` — on the same [`Lanes`] as the
//! matmul, so the sums stay in vector registers (written as plain Rust, LLVM kept
//! them in memory and in scalar registers, and that loop was most of the rollout's
//! attention time).

use super::tile::Lanes;
use super::PANEL;

/// `out[d] += Σ_j (probs[j] · scale) · rows[j][offset + d]`, each lane summed in `j`
/// order from zero with a product then a sum (two roundings), then added to `out`.
///
/// # Safety
/// The CPU runs `L`'s instructions; every row holds `offset + out.len()` values.
#[inline(always)]
pub(super) unsafe fn weighted_sum<L: Lanes>(
    rows: &[&[f32]],
    offset: usize,
    probs: &[f32],
    scale: f32,
    out: &mut [f32],
) {
    assert!(rows.len() == probs.len() && rows.iter().all(|r| r.len() >= offset + out.len()));
    let width = out.len();
    let mut d0 = 0;
    // Four vectors (64 lanes) at a time: four independent chains of adds.
    while d0 + 4 * PANEL <= width {
        let mut acc = [L::zero(); 4];
        for (row, &p) in rows.iter().zip(probs) {
            let w = L::splat(p * scale);
            let at = row.as_ptr().add(offset + d0);
            for (c, a) in acc.iter_mut().enumerate() {
                *a = L::mul_add_twice(w, L::load(at.add(c * PANEL)), *a);
            }
        }
        for (c, a) in acc.iter().enumerate() {
            add_into::<L>(out.as_mut_ptr().add(d0 + c * PANEL), *a);
        }
        d0 += 4 * PANEL;
    }
    while d0 + PANEL <= width {
        let mut acc = L::zero();
        for (row, &p) in rows.iter().zip(probs) {
            acc = L::mul_add_twice(
                L::splat(p * scale),
                L::load(row.as_ptr().add(offset + d0)),
                acc,
            );
        }
        add_into::<L>(out.as_mut_ptr().add(d0), acc);
        d0 += PANEL;
    }
    for d in d0..width {
        let mut acc = 0f32;
        for (row, &p) in rows.iter().zip(probs) {
            acc += p * scale * row[offset + d];
        }
        out[d] += acc;
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

//! The one matmul loop every instruction set runs, written once over `Lanes`.
//!
//! Each (row, output) pair owns one accumulator lane, which receives
//! `fma(x[k], w[k], acc)` for `k = 0, 1, …, in − 1` in that order, starting from zero.
//! Tile shapes, thread splits and instruction sets only decide which lanes are computed
//! together, never the order of a lane's operations: a row's result is bit-identical
//! alone or in any batch, and identical on AVX-512, AVX2 and the scalar fallback.

use std::ops::Range;

use super::lanes::Lanes;
use super::packed::{PackedMatrix, WeightFormat, BLOCK, PANEL};
use super::source::{block_ahead, F32Src, HalfSrc, Q4Src, Q8Src, Source};
use super::{TileSink, MAX_TILE};

/// `rows` rows of `x` against panels `panels` of `m`, tiles handed to `sink`.
///
/// # Safety
/// The CPU must run `L`'s instructions (the caller is a `#[target_feature]` function
/// that inlines this); `x` holds at least `rows * m.in_features()` values and
/// `panels.end <= m.panels()`.
#[inline(always)]
pub(super) unsafe fn gemm<L: Lanes>(
    m: &PackedMatrix,
    x: &[f32],
    rows: usize,
    panels: Range<usize>,
    sink: &dyn TileSink,
) {
    assert!(x.len() >= rows * m.inp && panels.end <= m.panels);
    let (inp, blocks) = (m.inp, m.blocks());
    match m.format {
        WeightFormat::F32 => {
            let src = F32Src {
                base: m.f32s.as_ptr(),
                inp,
            };
            drive::<L, _>(&src, m, x, rows, panels, sink);
        }
        WeightFormat::Bf16 => {
            let src = HalfSrc::<false> {
                base: m.halves.as_ptr(),
                inp,
            };
            drive::<L, _>(&src, m, x, rows, panels, sink);
        }
        WeightFormat::F16 => {
            let src = HalfSrc::<true> {
                base: m.halves.as_ptr(),
                inp,
            };
            drive::<L, _>(&src, m, x, rows, panels, sink);
        }
        WeightFormat::Q4_0 | WeightFormat::Q4_1 => {
            let (scales, offsets, bytes) = (m.f32s.as_ptr(), m.offsets.as_ptr(), m.bytes.as_ptr());
            if m.format == WeightFormat::Q4_1 {
                let src = Q4Src::<true> {
                    scales,
                    offsets,
                    bytes,
                    blocks,
                };
                drive::<L, _>(&src, m, x, rows, panels, sink);
            } else {
                let src = Q4Src::<false> {
                    scales,
                    offsets,
                    bytes,
                    blocks,
                };
                drive::<L, _>(&src, m, x, rows, panels, sink);
            }
        }
        WeightFormat::Q8_0 => {
            let src = Q8Src {
                scales: m.f32s.as_ptr(),
                bytes: m.bytes.as_ptr(),
                blocks,
            };
            drive::<L, _>(&src, m, x, rows, panels, sink);
        }
    }
}

/// Few rows: weights converted in registers, straight from storage. More rows than a
/// tile: a group of panels is converted once into f32 scratch and every row tile reads
/// the scratch (the same values, so the same results).
///
/// Panels go in groups of 4 for a single row (four independent accumulator chains hide
/// the FMA latency) and of `L::PANEL_GROUP` otherwise.
#[inline(always)]
unsafe fn drive<L: Lanes, S: Source<L> + Source<L::Lo> + Source<L::Hi>>(
    src: &S,
    m: &PackedMatrix,
    x: &[f32],
    rows: usize,
    panels: Range<usize>,
    sink: &dyn TileSink,
) {
    // Half panels where whole ones would leave a tile short of `L::ROW_TILE` rows (few
    // accumulators, each converted weight serving few rows): measured on AVX2, 7–24
    // rows run at about 70% of the FMA peak in half panels, against 45–65% in whole
    // ones unless every tile is full (12, 18, 24 rows: 70–80%).
    if L::HALF_ROWS > 0
        && rows > L::ROW_TILE
        && rows <= 2 * L::HALF_ROWS
        && !rows.is_multiple_of(L::ROW_TILE)
        && m.format != WeightFormat::F32
    {
        half_tiles::<L, S>(src, m.inp, x, rows, panels, sink);
        return;
    }
    if rows > L::ROW_TILE && rows <= L::WIDE_ROWS && m.format != WeightFormat::F32 {
        // One tile of every row against one panel at a time: each weight is converted
        // once, in registers, for all the rows (rather than written to scratch and
        // read back by two tiles).
        for p in panels {
            wide_tile::<L, S>(src, m.inp, x, rows, p, sink);
        }
        return;
    }
    let convert = rows > L::ROW_TILE && m.format != WeightFormat::F32;
    // Enough independent accumulators to hide the FMA latency: four panels for one
    // row, at least two for two rows, the register tile for more. (On AVX2, whose
    // tile is one panel, two panels of three rows spilled: 31–42 GFLOP/s against
    // 57–68 for one panel, measured on Q4_1, bf16 and f32.)
    let group = match rows {
        1 => 4,
        r if 3 * r <= L::ROW_TILE => L::PANEL_GROUP.max(2),
        _ => L::PANEL_GROUP,
    };
    let mut scratch = Vec::new();
    let mut p0 = panels.start;
    while p0 < panels.end {
        let np = group.min(panels.end - p0);
        if convert {
            scratch.resize(np * m.inp * PANEL, 0f32);
            widen_panels::<L, S>(src, m.inp, p0, np, &mut scratch);
            let local = F32Src {
                base: scratch.as_ptr(),
                inp: m.inp,
            };
            row_tiles::<L, F32Src>(&local, m.inp, x, rows, 0, p0, np, sink);
        } else {
            row_tiles::<L, S>(src, m.inp, x, rows, p0, p0, np, sink);
        }
        p0 += np;
    }
}

/// Writes panels `p0..p0 + np` as f32 `[j][k][16]` into `dst`.
#[inline(always)]
unsafe fn widen_panels<L: Lanes, S: Source<L>>(
    src: &S,
    inp: usize,
    p0: usize,
    np: usize,
    dst: &mut [f32],
) {
    let d = dst.as_mut_ptr();
    let blocks = inp / BLOCK;
    for j in 0..np {
        for b in 0..blocks {
            // Panels are converted one after another.
            let (pa, ba) = block_ahead(p0 + j, b, blocks, 1);
            src.prefetch(pa, ba);
            let c = src.consts(p0 + j, b);
            for t in 0..16 {
                let (wa, wb) = src.pair(&c, p0 + j, b, t);
                let at = d.add((j * inp + b * BLOCK + 2 * t) * PANEL);
                L::store(at, wa);
                L::store(at.add(PANEL), wb);
            }
        }
        for k in inp / BLOCK * BLOCK..inp {
            L::store(d.add((j * inp + k) * PANEL), src.single(p0 + j, k));
        }
    }
}

/// Every row tile against source panels `sp..sp + np`, reported to the sink as
/// panels `p0..p0 + np`.
#[inline(always)]
#[allow(clippy::too_many_arguments)]
unsafe fn row_tiles<L: Lanes, S: Source<L>>(
    src: &S,
    inp: usize,
    x: &[f32],
    rows: usize,
    sp: usize,
    p0: usize,
    np: usize,
    sink: &dyn TileSink,
) {
    for (r0, nr) in equal_tiles(rows, L::ROW_TILE) {
        let xr = x.as_ptr().add(r0 * inp);
        let mut out = [[0f32; PANEL]; MAX_TILE];
        macro_rules! run {
            ($np:literal, $nr:literal) => {
                tile::<L, S, $np, $nr>(src, inp, xr, sp, &mut out)
            };
        }
        match (np, nr) {
            (4, _) => run!(4, 1),
            (3, _) => run!(3, 1),
            (2, 1) => run!(2, 1),
            (2, 2) => run!(2, 2),
            (2, 3) => run!(2, 3),
            (2, 4) => run!(2, 4),
            (2, 5) => run!(2, 5),
            (2, 6) => run!(2, 6),
            (2, 7) => run!(2, 7),
            (2, _) => run!(2, 8),
            (_, 1) => run!(1, 1),
            (_, 2) => run!(1, 2),
            (_, 3) => run!(1, 3),
            (_, 4) => run!(1, 4),
            (_, 5) => run!(1, 5),
            (_, 6) => run!(1, 6),
            (_, 7) => run!(1, 7),
            _ => run!(1, 8),
        }
        sink.tile(r0, nr, p0, np, &out[..np * nr]);
    }
}

/// `rows` cut into the fewest tiles of at most `most` rows, as equal as they can be
/// (8 rows of at most 6 as 4 + 4, not 6 + 2: a short last tile has too few
/// accumulators to keep the FMA units busy): each tile's first row and row count.
#[inline(always)]
fn equal_tiles(rows: usize, most: usize) -> impl Iterator<Item = (usize, usize)> {
    let tiles = rows.div_ceil(most);
    (0..tiles).map(move |t| {
        let r0 = rows * t / tiles;
        (r0, rows * (t + 1) / tiles - r0)
    })
}

/// All `rows` (`L::ROW_TILE < rows ≤ L::WIDE_ROWS`) against panel `p`, as one tile.
#[inline(always)]
unsafe fn wide_tile<L: Lanes, S: Source<L>>(
    src: &S,
    inp: usize,
    x: &[f32],
    rows: usize,
    p: usize,
    sink: &dyn TileSink,
) {
    let mut out = [[0f32; PANEL]; MAX_TILE];
    let xr = x.as_ptr();
    match rows {
        9 => tile::<L, S, 1, 9>(src, inp, xr, p, &mut out),
        10 => tile::<L, S, 1, 10>(src, inp, xr, p, &mut out),
        11 => tile::<L, S, 1, 11>(src, inp, xr, p, &mut out),
        12 => tile::<L, S, 1, 12>(src, inp, xr, p, &mut out),
        13 => tile::<L, S, 1, 13>(src, inp, xr, p, &mut out),
        14 => tile::<L, S, 1, 14>(src, inp, xr, p, &mut out),
        15 => tile::<L, S, 1, 15>(src, inp, xr, p, &mut out),
        16 => tile::<L, S, 1, 16>(src, inp, xr, p, &mut out),
        17 => tile::<L, S, 1, 17>(src, inp, xr, p, &mut out),
        18 => tile::<L, S, 1, 18>(src, inp, xr, p, &mut out),
        19 => tile::<L, S, 1, 19>(src, inp, xr, p, &mut out),
        20 => tile::<L, S, 1, 20>(src, inp, xr, p, &mut out),
        21 => tile::<L, S, 1, 21>(src, inp, xr, p, &mut out),
        22 => tile::<L, S, 1, 22>(src, inp, xr, p, &mut out),
        23 => tile::<L, S, 1, 23>(src, inp, xr, p, &mut out),
        24 => tile::<L, S, 1, 24>(src, inp, xr, p, &mut out),
        _ => unreachable!("a wide tile holds 9 to 24 rows, not {rows}"),
    }
    sink.tile(0, rows, p, 1, &out[..rows]);
}

/// Every row against panels `panels` as tiles of at most `L::HALF_ROWS` rows (equal
/// tiles), each tile one panel at a time in two passes of half panels, `L::Lo` then
/// `L::Hi`: the weights are converted in registers, once per tile.
#[inline(always)]
unsafe fn half_tiles<L: Lanes, S: Source<L::Lo> + Source<L::Hi>>(
    src: &S,
    inp: usize,
    x: &[f32],
    rows: usize,
    panels: Range<usize>,
    sink: &dyn TileSink,
) {
    for p in panels {
        for (r0, nr) in equal_tiles(rows, L::HALF_ROWS) {
            let xr = x.as_ptr().add(r0 * inp);
            let mut out = [[0f32; PANEL]; MAX_TILE];
            macro_rules! run {
                ($nr:literal) => {{
                    tile::<L::Lo, S, 1, $nr>(src, inp, xr, p, &mut out);
                    tile::<L::Hi, S, 1, $nr>(src, inp, xr, p, &mut out);
                }};
            }
            match nr {
                1 => run!(1),
                2 => run!(2),
                3 => run!(3),
                4 => run!(4),
                5 => run!(5),
                6 => run!(6),
                7 => run!(7),
                8 => run!(8),
                9 => run!(9),
                10 => run!(10),
                11 => run!(11),
                12 => run!(12),
                _ => unreachable!("a half-panel tile holds 1 to 12 rows, not {nr}"),
            }
            sink.tile(r0, nr, p, 1, &out[..nr]);
        }
    }
}

/// `NR` rows × `NP` panels; `out[r * NP + j]` receives row `r`'s 16 outputs of panel `j`.
#[inline(always)]
unsafe fn tile<L: Lanes, S: Source<L>, const NP: usize, const NR: usize>(
    src: &S,
    inp: usize,
    x: *const f32,
    p0: usize,
    out: &mut [[f32; PANEL]; MAX_TILE],
) {
    let mut acc = [[L::zero(); NP]; NR];
    let blocks = inp / BLOCK;
    for b in 0..blocks {
        for j in 0..NP {
            // Past this panel's end: its place in the group the member takes next.
            let (pa, ba) = block_ahead(p0 + j, b, blocks, NP);
            src.prefetch(pa, ba);
        }
        let consts: [S::Consts; NP] = std::array::from_fn(|j| src.consts(p0 + j, b));
        for t in 0..16 {
            let k = b * BLOCK + 2 * t;
            let mut wa = [L::zero(); NP];
            let mut wb = [L::zero(); NP];
            for j in 0..NP {
                (wa[j], wb[j]) = src.pair(&consts[j], p0 + j, b, t);
            }
            for (r, acc_r) in acc.iter_mut().enumerate() {
                let xa = L::splat(*x.add(r * inp + k));
                let xb = L::splat(*x.add(r * inp + k + 1));
                for j in 0..NP {
                    acc_r[j] = L::fmadd(xa, wa[j], acc_r[j]);
                    acc_r[j] = L::fmadd(xb, wb[j], acc_r[j]);
                }
            }
        }
    }
    for k in inp / BLOCK * BLOCK..inp {
        for j in 0..NP {
            let w = src.single(p0 + j, k);
            for (r, acc_r) in acc.iter_mut().enumerate() {
                acc_r[j] = L::fmadd(L::splat(*x.add(r * inp + k)), w, acc_r[j]);
            }
        }
    }
    for (r, acc_r) in acc.iter().enumerate() {
        for (j, a) in acc_r.iter().enumerate() {
            L::store(out[r * NP + j].as_mut_ptr(), *a);
        }
    }
}

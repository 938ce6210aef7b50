//! [`Lanes`]: sixteen f32 lanes on one instruction set, the vocabulary the matmul
//! loop (`tile.rs`), attention's row loops (`rows.rs`) and the weight sources
//! (`source.rs`) are written in once; `scalar.rs`, `avx2.rs` and `avx512.rs`
//! implement it.

/// Sixteen f32 lanes (one panel) on one instruction set. Every method is `unsafe`
/// because it may use instructions the caller must have checked the CPU has, and
/// reads through raw pointers the caller keeps in bounds.
pub(super) trait Lanes {
    type V: Copy;
    /// Rows a tile holds when there are several (so the accumulators of
    /// `PANEL_GROUP × ROW_TILE` vectors stay in registers).
    const ROW_TILE: usize;
    /// Panels a tile holds when there are several rows.
    const PANEL_GROUP: usize;
    /// Most rows one single-panel tile holds (its accumulators in registers), used
    /// between one tile and two so converted weights need no scratch; 0: never.
    const WIDE_ROWS: usize;
    /// Most rows one tile of half panels ([`Self::Lo`], then [`Self::Hi`]) holds, for
    /// instruction sets whose registers fit too few rows of whole panels to convert
    /// each weight in registers for them all; 0: never.
    const HALF_ROWS: usize;
    /// The lanes of a panel's first and second eight outputs (`Self` where
    /// `HALF_ROWS` is 0).
    type Lo: Lanes;
    type Hi: Lanes;
    unsafe fn zero() -> Self::V;
    unsafe fn load(at: *const f32) -> Self::V;
    unsafe fn store(at: *mut f32, v: Self::V);
    unsafe fn splat(x: f32) -> Self::V;
    /// `a · b + c`, rounded once.
    unsafe fn fmadd(a: Self::V, b: Self::V, c: Self::V) -> Self::V;
    /// `a · b + c`, rounded twice (product, then sum).
    unsafe fn mul_add_twice(a: Self::V, b: Self::V, c: Self::V) -> Self::V;
    unsafe fn widen_bf16(at: *const u16) -> Self::V;
    unsafe fn widen_f16(at: *const u16) -> Self::V;
    /// Sixteen bytes of Q4 nibble pairs as the weights at `k` (low) and `k + 1` (high):
    /// `(q − 8)·d` without an offset, `q·d + m` with one. The scales `d` are f16
    /// values (GGUF stores them so), which makes `q·d` exact in f32: a variant may
    /// compute `q·d + m` as one fma, the same single rounding as multiply-then-add.
    unsafe fn q4_pair<const OFFSET: bool>(
        at: *const u8,
        d: Self::V,
        m: Self::V,
    ) -> (Self::V, Self::V);
    /// Sixteen signed bytes as `q·d`.
    unsafe fn q8(at: *const u8, d: Self::V) -> Self::V;
}

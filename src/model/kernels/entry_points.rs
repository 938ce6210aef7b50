//! `entry_points!`: the functions one instruction set's file (`scalar.rs`,
//! `avx2.rs`, `avx512.rs`) exports, the generic loops compiled with its features.

/// The entry points of one instruction set: [`gemm`] and `rows::weighted_sum` on its
/// [`Lanes`], compiled with its target features (given as a string, none for scalar)
/// so the generic code inlines into them with those instructions enabled.
///
/// Each generated function is `unsafe`: the CPU must run the features (see
/// `Isa::available`); the bounds are asserted inside the generic code.
macro_rules! entry_points {
    ($lanes:ty $(, $feature:literal)?) => {
        /// # Safety
        /// The CPU runs this instruction set; bounds are asserted by `tile::gemm`.
        $(#[target_feature(enable = $feature)])?
        pub(super) unsafe fn gemm(
            m: &super::packed::PackedMatrix,
            x: &[f32],
            rows: usize,
            panels: std::ops::Range<usize>,
            sink: &dyn super::TileSink,
        ) {
            super::tile::gemm::<$lanes>(m, x, rows, panels, sink)
        }

        /// # Safety
        /// The CPU runs this instruction set; bounds are asserted by
        /// `rows::weighted_sum`.
        $(#[target_feature(enable = $feature)])?
        pub(super) unsafe fn weighted_sum<T: super::KvElem>(
            rows: super::Rows<T>,
            offset: usize,
            probs: &[f32],
            scale: f32,
            out: &mut [f32],
        ) {
            super::rows::weighted_sum::<$lanes, T>(rows, offset, probs, scale, out)
        }
    };
}
pub(super) use entry_points;

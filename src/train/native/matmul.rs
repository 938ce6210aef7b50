//! The backward's two matrix products on row-major f32 slices, through the `gemm`
//! crate (candle's CPU matmul, already in the tree): for a linear layer
//! `Y = X · Wᵀ` with `W [out, in]`, the input's gradient `dX = dY · W` and the
//! weight's `dW += dYᵀ · X`. Strides let both read `W`, `dY` and `X` where they lie:
//! nothing is transposed or copied. `gemm` splits the work over rayon's threads and
//! runs near the machine's f32 peak at these shapes.

use gemm::{gemm, Parallelism};

/// A matrix operand where it lies: `data[i · row_stride + j · col_stride]` is element
/// `(i, j)` of a `rows × cols` matrix (a transpose is the same data, strides swapped).
#[derive(Clone, Copy)]
pub struct View<'a> {
    /// The values, read in place; must hold every element the strides reach.
    pub data: &'a [f32],
    /// Number of rows of the matrix this view reads.
    pub rows: usize,
    /// Number of columns.
    pub cols: usize,
    /// Distance in `data`, in f32 values, from element `(i, j)` to `(i + 1, j)`.
    pub row_stride: usize,
    /// Distance in `data`, in f32 values, from element `(i, j)` to `(i, j + 1)`.
    pub col_stride: usize,
}

impl<'a> View<'a> {
    /// A row-major `rows × cols` matrix.
    pub fn rows(data: &'a [f32], rows: usize, cols: usize) -> Self {
        View {
            data,
            rows,
            cols,
            row_stride: cols,
            col_stride: 1,
        }
    }

    /// The transpose, reading the same values.
    pub fn t(self) -> Self {
        View {
            rows: self.cols,
            cols: self.rows,
            row_stride: self.col_stride,
            col_stride: self.row_stride,
            ..self
        }
    }

    /// Whether every element lies inside `data`.
    fn fits(&self) -> bool {
        self.rows == 0
            || self.cols == 0
            || (self.rows - 1) * self.row_stride + (self.cols - 1) * self.col_stride
                < self.data.len()
    }
}

/// Threads a product runs on: rayon's, or this one (inside a parallel loop).
#[derive(Clone, Copy, PartialEq, Eq)]
pub enum Threads {
    /// Split the product over rayon's pool (a product called from sequential code).
    Rayon,
    /// Run on the calling thread only (a product inside a rayon task, so the pool is
    /// not oversubscribed).
    This,
}

/// `out (+)= a · b` into the row-major `out` (`a.rows × b.cols`); added to what `out`
/// holds when `accumulate`. The one entry to `gemm` every product of the backward
/// takes.
pub fn product(a: View, b: View, out: &mut [f32], accumulate: bool, threads: Threads) {
    let (m, k, n) = (a.rows, a.cols, b.cols);
    assert!(
        b.rows == k && a.fits() && b.fits() && out.len() >= m * n,
        "product shapes"
    );
    if m == 0 || n == 0 {
        return;
    }
    let parallelism = match (threads, rayon::current_num_threads()) {
        (Threads::This, _) | (_, 0 | 1) => Parallelism::None,
        (Threads::Rayon, t) => Parallelism::Rayon(t),
    };
    // SAFETY: `fits` and the length check bound every index gemm reads or writes.
    unsafe {
        gemm(
            m,
            n,
            k,
            out.as_mut_ptr(),
            1,
            n as isize,
            accumulate,
            a.data.as_ptr(),
            a.col_stride as isize,
            a.row_stride as isize,
            b.data.as_ptr(),
            b.col_stride as isize,
            b.row_stride as isize,
            1.0,
            1.0,
            false,
            false,
            false,
            parallelism,
        );
    }
}

/// `dx (+)= dy · w`: `dy [rows, out]`, `w [out, in]`, `dx [rows, in]`; added to what
/// `dx` holds when `accumulate`.
pub fn input_grad(
    dy: &[f32],
    w: &[f32],
    rows: usize,
    out: usize,
    inp: usize,
    dx: &mut [f32],
    accumulate: bool,
) {
    let (dy, w) = (View::rows(dy, rows, out), View::rows(w, out, inp));
    product(dy, w, dx, accumulate, Threads::Rayon);
}

/// `dw += dyᵀ · x`: `dy [rows, out]`, `x [rows, in]`, `dw [out, in]`.
pub fn weight_grad(dy: &[f32], x: &[f32], rows: usize, out: usize, inp: usize, dw: &mut [f32]) {
    let (dy, x) = (View::rows(dy, rows, out), View::rows(x, rows, inp));
    product(dy.t(), x, dw, true, Threads::Rayon);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn both_products_match_the_loops() {
        let (rows, out, inp) = (5, 3, 4);
        let f = |i: usize| ((i * 37 % 11) as f32 - 5.0) / 4.0;
        let dy: Vec<f32> = (0..rows * out).map(f).collect();
        let w: Vec<f32> = (0..out * inp).map(|i| f(i + 3)).collect();
        let x: Vec<f32> = (0..rows * inp).map(|i| f(i + 7)).collect();
        let mut dx = vec![1f32; rows * inp];
        input_grad(&dy, &w, rows, out, inp, &mut dx, true);
        let mut dw = vec![0.5f32; out * inp];
        weight_grad(&dy, &x, rows, out, inp, &mut dw);
        for r in 0..rows {
            for i in 0..inp {
                let want: f32 = 1.0
                    + (0..out)
                        .map(|o| dy[r * out + o] * w[o * inp + i])
                        .sum::<f32>();
                assert!((dx[r * inp + i] - want).abs() < 1e-5);
            }
        }
        for o in 0..out {
            for i in 0..inp {
                let want: f32 = 0.5
                    + (0..rows)
                        .map(|r| dy[r * out + o] * x[r * inp + i])
                        .sum::<f32>();
                assert!((dw[o * inp + i] - want).abs() < 1e-5);
            }
        }
    }
}

//! The backward's two matrix products on row-major f32 slices, through the `gemm`
//! crate (candle's CPU matmul, already in the tree): for a linear layer
//! `Y = X · Wᵀ` with `W [out, in]`, the input's gradient `dX = dY · W` and the
//! weight's `dW += dYᵀ · X`. Strides let both read `W`, `dY` and `X` where they lie:
//! nothing is transposed or copied. `gemm` splits the work over rayon's threads and
//! runs near the machine's f32 peak at these shapes.

use gemm::{gemm, Parallelism};

fn parallelism() -> Parallelism {
    match rayon::current_num_threads() {
        0 | 1 => Parallelism::None,
        n => Parallelism::Rayon(n),
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
    assert!(dy.len() >= rows * out && w.len() >= out * inp && dx.len() >= rows * inp);
    if rows == 0 {
        return;
    }
    // SAFETY: the asserts bound every index gemm reads or writes under these strides.
    unsafe {
        gemm(
            rows,
            inp,
            out,
            dx.as_mut_ptr(),
            1,
            inp as isize,
            accumulate,
            dy.as_ptr(),
            1,
            out as isize,
            w.as_ptr(),
            1,
            inp as isize,
            1.0,
            1.0,
            false,
            false,
            false,
            parallelism(),
        );
    }
}

/// `dw += dyᵀ · x`: `dy [rows, out]`, `x [rows, in]`, `dw [out, in]`.
pub fn weight_grad(dy: &[f32], x: &[f32], rows: usize, out: usize, inp: usize, dw: &mut [f32]) {
    assert!(dy.len() >= rows * out && x.len() >= rows * inp && dw.len() >= out * inp);
    if rows == 0 {
        return;
    }
    // SAFETY: as in `input_grad`; `dyᵀ` is `dy` read with its strides swapped.
    unsafe {
        gemm(
            out,
            inp,
            rows,
            dw.as_mut_ptr(),
            1,
            inp as isize,
            true,
            dy.as_ptr(),
            out as isize,
            1,
            x.as_ptr(),
            1,
            inp as isize,
            1.0,
            1.0,
            false,
            false,
            false,
            parallelism(),
        );
    }
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

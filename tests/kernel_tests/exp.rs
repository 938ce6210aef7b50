//! The vectorised elementwise functions against libm, bit for bit, on every variant:
//! softmax's f32 `exp` (glibc's `expf` algorithm), sampling's f64 `exp` (glibc's `exp`),
//! over every exponent range of their vector paths, at their edges and for every slice
//! length's tail; and SwiGLU, whose `exp`s go through the f32 kernel, against its
//! scalar formula.

use super::variants;

#[test]
fn vectorised_exp_equals_f32_exp_bit_for_bit() {
    use treegrpo::model::kernels::exp_in_place_with;
    // Every 61st f32 bit pattern below 100 in magnitude, both signs (about 36M
    // values; softmax feeds `score − max ≤ 0`, the positive side is checked too),
    // then the edges of the vector path and values past them.
    let mut xs: Vec<f32> = Vec::new();
    for sign in [0u32, 0x8000_0000] {
        let mut bits = 0u32;
        while bits < 100f32.to_bits() {
            xs.push(f32::from_bits(bits | sign));
            bits += 61;
        }
    }
    let limit = 88f32.to_bits();
    for b in limit - 64..limit + 64 {
        xs.extend([f32::from_bits(b), -f32::from_bits(b)]);
    }
    xs.extend([
        0.0,
        -0.0,
        f32::MIN_POSITIVE,
        -f32::MIN_POSITIVE,
        -103.28,
        -103.97,
        -104.0,
        88.72,
        88.73,
        f32::INFINITY,
        f32::NEG_INFINITY,
        f32::MAX,
        f32::MIN,
    ]);
    for isa in variants() {
        let mut got = xs.clone();
        exp_in_place_with(isa, &mut got);
        for (x, g) in xs.iter().zip(&got) {
            assert_eq!(
                g.to_bits(),
                x.exp().to_bits(),
                "{isa:?}: exp({x:e}) = {g:e}"
            );
        }
        let mut nan = [f32::NAN; 17];
        exp_in_place_with(isa, &mut nan);
        assert!(nan.iter().all(|v| v.is_nan()), "{isa:?}");
        // Every tail length: the vector body and the scalar remainder agree.
        for len in 0..40 {
            let mut part: Vec<f32> = (0..len).map(|i| -(i as f32) * 0.731).collect();
            let expected: Vec<u32> = part.iter().map(|v| v.exp().to_bits()).collect();
            exp_in_place_with(isa, &mut part);
            let got: Vec<u32> = part.iter().map(|v| v.to_bits()).collect();
            assert_eq!(got, expected, "{isa:?} length {len}");
        }
    }
}

#[test]
fn vectorised_f64_exp_equals_f64_exp_bit_for_bit() {
    use treegrpo::model::kernels::exp_f64_in_place_with;
    // Random mantissas at every exponent from below the vector path (|x| < 2^-54) to
    // past it (|x| ≥ 512), both signs (about 3M values), then its edges and specials.
    let mut xs: Vec<f64> = Vec::new();
    let mut state = 0x9e37_79b9_7f4a_7c15u64;
    for top in 0x3c0u64..0x40c {
        for _ in 0..20_000 {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            let bits = (top << 52) | (state & ((1 << 52) - 1));
            xs.extend([f64::from_bits(bits), -f64::from_bits(bits)]);
        }
    }
    for edge in [2f64.powi(-54), 512.0, 709.78, 745.2] {
        let b = edge.to_bits();
        for d in b - 4..b + 4 {
            xs.extend([f64::from_bits(d), -f64::from_bits(d)]);
        }
    }
    xs.extend([
        0.0,
        -0.0,
        f64::MIN_POSITIVE,
        -f64::MIN_POSITIVE,
        f64::INFINITY,
        f64::NEG_INFINITY,
        f64::MAX,
        f64::MIN,
    ]);
    for isa in variants() {
        let mut got = xs.clone();
        exp_f64_in_place_with(isa, &mut got);
        for (x, g) in xs.iter().zip(&got) {
            assert_eq!(
                g.to_bits(),
                x.exp().to_bits(),
                "{isa:?}: exp({x:e}) = {g:e}"
            );
        }
        let mut nan = [f64::NAN; 9];
        exp_f64_in_place_with(isa, &mut nan);
        assert!(nan.iter().all(|v| v.is_nan()), "{isa:?}");
        // Every tail length: the vector body and the scalar remainder agree.
        for len in 0..20 {
            let mut part: Vec<f64> = (0..len).map(|i| -(i as f64) * 0.731).collect();
            let expected: Vec<u64> = part.iter().map(|v| v.exp().to_bits()).collect();
            exp_f64_in_place_with(isa, &mut part);
            let got: Vec<u64> = part.iter().map(|v| v.to_bits()).collect();
            assert_eq!(got, expected, "{isa:?} length {len}");
        }
    }
}

#[test]
fn swiglu_equals_the_scalar_formula_bit_for_bit() {
    use treegrpo::model::ops::swiglu;
    // Gates over the range activations take and past the vector `exp`'s edges (|g| ≥
    // 88 goes to libm one by one), in lengths that leave every chunk remainder.
    let edges = [
        0.0,
        -0.0,
        87.9,
        88.0,
        88.8,
        -88.8,
        -104.0,
        200.0,
        -200.0,
        f32::INFINITY,
    ];
    for len in [0usize, 1, 15, 63, 64, 65, 130, 1536] {
        let gate: Vec<f32> = (0..len)
            .map(|i| match i % 7 {
                0 => edges[(i / 7) % edges.len()],
                k => ((i * 37 % 101) as f32 - 50.0) * 0.173 * k as f32,
            })
            .collect();
        let up: Vec<f32> = (0..len).map(|i| 1.0 - (i % 13) as f32 * 0.31).collect();
        let expected: Vec<u32> = gate
            .iter()
            .zip(&up)
            .map(|(&g, &u)| (g / (1.0 + (-g).exp()) * u).to_bits())
            .collect();
        let mut got = gate.clone();
        swiglu(&mut got, &up);
        let got: Vec<u32> = got.iter().map(|v| v.to_bits()).collect();
        assert_eq!(got, expected, "length {len}");
    }
}

use super::*;
use crate::cpu::{MatmulPrecision, Matrix, MatrixData, linear, linear_rows, linear_rows_serial};

fn seq(n: usize, seed: u32) -> Vec<f32> {
    (0..n)
        .map(|i| {
            let h = (i as u32).wrapping_mul(2654435761) ^ seed.wrapping_mul(40503);
            // Values with full f32 mantissas, so rounding to bf16 matters.
            (h % 100_003) as f32 / 50_001.5 - 1.0 + (h >> 20) as f32 * 1e-7
        })
        .collect()
}

fn bf16_matrix(n: usize, k: usize, seed: u32) -> Matrix {
    let data = seq(n * k, seed).into_iter().map(bf16::from_f32).collect();
    let mut w = Matrix::new(n, k, MatrixData::Bf16(data));
    w.set_precision(MatmulPrecision::Bf16);
    w
}

/// The documented operation written out directly: `half`'s rounding for the inputs, then per
/// lane the odd product, then the even one, over chunks of 32, and the fold of the f32 kernel.
fn reference(x: &[f32], w: &[bf16]) -> f32 {
    let k = x.len();
    let bits = |v: Option<u16>| {
        let v = v.unwrap_or(0);
        let v = if v & 0x7f80 == 0 { v & 0x8000 } else { v };
        f32::from_bits(u32::from(v) << 16)
    };
    let ftz = |v: f32| if v.is_subnormal() { 0.0f32.copysign(v) } else { v };
    let xi = |i: usize| x.get(i).map(|&v| bf16::from_f32(v).to_bits());
    let wi = |i: usize| w.get(i).map(|v| v.to_bits());
    let mut acc = [0.0f32; 16];
    for c in (0..k).step_by(32) {
        for (l, a) in acc.iter_mut().enumerate() {
            let (odd, even) = (c + 2 * l + 1, c + 2 * l);
            *a = ftz(*a + bits(xi(odd)) * bits(wi(odd)));
            *a = ftz(*a + bits(xi(even)) * bits(wi(even)));
        }
    }
    super::fold(acc)
}

fn weights(w: &Matrix) -> &[bf16] {
    match w.data() {
        MatrixData::Bf16(v) => v,
        MatrixData::F32(_) => unreachable!(),
    }
}

#[test]
fn rounding_is_to_nearest_even() {
    let specials = [0.0, -0.0, 1.0, f32::INFINITY, f32::NEG_INFINITY, f32::MAX, f32::MIN_POSITIVE];
    let ties =
        [f32::from_bits(0x3f80_8000), f32::from_bits(0x3f81_8000), f32::from_bits(0x3f80_8001)];
    for v in specials.into_iter().chain(ties).chain(seq(10_000, 9)) {
        assert_eq!(round_to_bf16(v), bf16::from_f32(v).to_bits(), "{v:e}");
    }
    assert!(bf16::from_bits(round_to_bf16(f32::NAN)).is_nan());
}

#[test]
fn every_output_is_the_documented_dot_on_this_cpu() {
    // k = 40 and 1000 leave a tail chunk; 37 weight rows end in partial tiles.
    for (k, n) in [(40, 37), (1024, 9), (1000, 5)] {
        let w = bf16_matrix(n, k, 3);
        for m in [1, 3, 4, 6, 9] {
            let x = seq(m * k, 4);
            let mut out = vec![0.0; m * n];
            linear(&x, &w, &mut out);
            for r in 0..m {
                for c in 0..n {
                    let want = reference(&x[r * k..(r + 1) * k], &weights(&w)[c * k..(c + 1) * k]);
                    assert_eq!(out[r * n + c].to_bits(), want.to_bits(), "k {k} m {m} ({r}, {c})");
                }
            }
        }
    }
}

#[test]
fn the_portable_kernel_gives_the_same_bits() {
    let (k, n, m) = (72, 13, 7);
    let w = bf16_matrix(n, k, 5);
    let x = seq(m * k, 6);
    let xb: Vec<u16> = x.iter().map(|&v| round_to_bf16(v)).collect();
    let mut portable = vec![0.0; m * n];
    // SAFETY: `portable` holds `m` rows of `n`, exclusively borrowed.
    unsafe { block(&xb, k, weights(&w), 0..n, OutView::new(&mut portable, n)) };
    let mut dispatched = vec![0.0; m * n];
    linear(&x, &w, &mut dispatched);
    assert_eq!(portable, dispatched);
}

#[test]
fn a_row_does_not_depend_on_its_batch() {
    // Large enough to split across threads and, at 600 rows of k = 1024, into row panels.
    let (k, n) = (1024, 96);
    let w = bf16_matrix(n, k, 7);
    let x = seq(600 * k, 8);
    let mut alone = vec![0.0; n];
    linear_rows(&x, &[5], &w, &mut alone);
    for m in [6, 7, 8, 33, 64, 600] {
        let mut all = vec![0.0; m * n];
        linear(&x[..m * k], &w, &mut all);
        assert_eq!(all[5 * n..6 * n], alone, "batch of {m}");
        let mut serial = vec![0.0; m * n];
        linear_rows_serial(&x, &(0..m).collect::<Vec<_>>(), &w, &mut serial);
        assert_eq!(serial, all, "serial, batch of {m}");
    }
}

#[test]
fn bf16_products_stay_within_the_inputs_rounding_of_f32_ones() {
    let (k, n, m) = (512, 24, 4);
    let bf = bf16_matrix(n, k, 11);
    let mut exact = bf.clone();
    exact.set_precision(MatmulPrecision::F32);
    let x = seq(m * k, 12);
    let (mut a, mut b) = (vec![0.0; m * n], vec![0.0; m * n]);
    linear(&x, &bf, &mut a);
    linear(&x, &exact, &mut b);
    let mut differs = 0;
    for r in 0..m {
        for c in 0..n {
            // Each input moves by at most 2^-9 of itself; the sums' own rounding is far smaller.
            let row = &x[r * k..(r + 1) * k];
            let w = &weights(&bf)[c * k..(c + 1) * k];
            let scale: f32 = row.iter().zip(w).map(|(x, w)| (x * w.to_f32()).abs()).sum();
            let (got, want) = (a[r * n + c], b[r * n + c]);
            assert!((got - want).abs() <= scale * 2f32.powi(-9) + 1e-5, "({r}, {c}) {got} {want}");
            differs += usize::from(got != want);
        }
    }
    assert!(differs > 0, "bf16 products gave exactly the f32 results: the mode did nothing");
}

#[test]
fn f32_storage_ignores_the_bf16_precision() {
    let mut w = Matrix::from_f32(2, 3, vec![0.1; 6]);
    w.set_precision(MatmulPrecision::Bf16);
    assert_eq!(w.precision(), MatmulPrecision::F32);
    assert_eq!("bf16".parse(), Ok(MatmulPrecision::Bf16));
    assert!("fp8".parse::<MatmulPrecision>().is_err());
}

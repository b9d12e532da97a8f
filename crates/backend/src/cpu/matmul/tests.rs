use super::*;

fn seq(n: usize, seed: u32) -> Vec<f32> {
    (0..n)
        .map(|i| (((i as u32).wrapping_mul(2654435761) ^ seed) % 1000) as f32 / 500.0 - 1.0)
        .collect()
}

fn naive_dot(a: &[f32], b: &[f32]) -> f32 {
    let mut acc = [0.0f32; LANES];
    for (i, (x, y)) in a.iter().zip(b).enumerate() {
        acc[i % LANES] += x * y;
    }
    fold(acc)
}

/// `linear(x, w)`, checking every output against [`naive_dot`] of its rows (`wv`: `w`'s values).
fn linear_matching_dots(x: &[f32], w: &Matrix, wv: &[f32]) -> Vec<f32> {
    let (n, k) = (w.rows(), w.cols());
    let m = x.len() / k;
    let mut all = vec![0.0; m * n];
    linear(x, w, &mut all);
    for r in 0..m {
        for c in 0..n {
            let want = naive_dot(&x[r * k..(r + 1) * k], &wv[c * k..(c + 1) * k]);
            assert_eq!(all[r * n + c], want, "k {k} n {n} m {m} row {r} col {c}");
        }
    }
    all
}

#[test]
fn dot_has_the_documented_order() {
    for len in [1, 7, 16, 33, 100] {
        let (a, b) = (seq(len, 1), seq(len, 2));
        assert_eq!(dot(&a, &b), naive_dot(&a, &b), "len {len}");
    }
}

#[test]
fn every_output_equals_its_dot_whatever_the_batch_and_tiling() {
    for (k, n) in [(96, 300), (33, 7), (16, 5)] {
        let w = Matrix::from_f32(n, k, seq(n * k, 3));
        let wv = seq(n * k, 3);
        // Row counts that end on each mix of 6-row, 4-row and single-row tiles.
        for m in [1, 3, 4, 6, 7, 8, 9, 10, 11, 64] {
            let x = seq(m * k, 4);
            let all = linear_matching_dots(&x, &w, &wv);
            let mut gathered = vec![0.0; n];
            linear_rows(&x, &[m - 1], &w, &mut gathered);
            assert_eq!(gathered, all[(m - 1) * n..]);
        }
    }
}

#[test]
fn long_inputs_run_in_row_panels_with_unchanged_bits() {
    // k = 8192: panels of 16 rows (tiles of 6 + 6 + 4 rows), so 37 rows run as 16 + 16 + 5 (the
    // last a 4-row tile plus a leftover row) and 34 rows end on a 2-row panel, which takes the
    // streaming walk.
    let (k, n) = (8192, 9);
    let panel = PANEL_BYTES / (k * size_of::<f32>());
    assert_eq!(panel, 16);
    let wv = seq(n * k, 5);
    let w = Matrix::from_f32(n, k, wv.clone());
    for m in [37, 34] {
        linear_matching_dots(&seq(m * k, 6), &w, &wv);
    }
}

#[test]
fn bf16_weights_give_the_same_bits_as_their_f32_widening() {
    // 37 weight rows: one at a time for 1 and 3 input rows; for 6 and 8, tiles of 4 weight rows
    // (against 6 input rows, or twice 4) then single rows.
    let (k, n) = (40, 37);
    let halfs: Vec<bf16> = seq(n * k, 5).into_iter().map(bf16::from_f32).collect();
    let wide: Vec<f32> = halfs.iter().map(|h| h.to_f32()).collect();
    let narrow = Matrix::new(n, k, MatrixData::Bf16(halfs));
    let wide_rows = wide.clone();
    let wide = Matrix::from_f32(n, k, wide);
    for m in [1, 3, 6, 8] {
        let x = seq(m * k, 6);
        let (mut a, mut b) = (vec![0.0; m * n], vec![0.0; m * n]);
        linear(&x, &narrow, &mut a);
        linear(&x, &wide, &mut b);
        assert_eq!(a, b, "m {m}");
        for c in 0..n {
            assert_eq!(a[c], naive_dot(&x[..k], &wide_rows[c * k..(c + 1) * k]));
        }
    }
}

#[test]
fn lane_weighted_sum_is_the_transposed_product() {
    let (keys, d) = (37, 24);
    let values = seq(keys * d, 11);
    let mut transposed = vec![0.0; keys * d];
    for j in 0..keys {
        for c in 0..d {
            transposed[c * keys + j] = values[j * d + c];
        }
    }
    let p = seq(keys, 12);
    let mut want = vec![0.0; d];
    linear(&p, &Matrix::from_f32(d, keys, transposed), &mut want);
    let mut got = vec![0.0; d];
    let row = |j: usize| &values[j * d..(j + 1) * d];
    lane_weighted_sum(&p, row, 0, &mut Vec::new(), &mut got);
    assert_eq!(got, want);
    // Five leading zero weights are the same sum with the lanes shifted by five.
    let padded: Vec<f32> = [0.0; 5].into_iter().chain(p.iter().copied()).collect();
    let mut padded_t = vec![0.0; (keys + 5) * d];
    for j in 0..keys {
        for c in 0..d {
            padded_t[c * (keys + 5) + j + 5] = values[j * d + c];
        }
    }
    linear(&padded, &Matrix::from_f32(d, keys + 5, padded_t), &mut want);
    lane_weighted_sum(&p, row, 5, &mut Vec::new(), &mut got);
    assert_eq!(got, want);
}

#[test]
fn serial_products_equal_the_threaded_ones() {
    let (k, n, m) = (256, 1000, 5);
    let w = Matrix::from_f32(n, k, seq(n * k, 9));
    let x = seq(m * k, 10);
    let rows = [4, 0, 2];
    let (mut a, mut b) = (vec![0.0; 3 * n], vec![0.0; 3 * n]);
    linear_rows(&x, &rows, &w, &mut a);
    linear_rows_serial(&x, &rows, &w, &mut b);
    assert_eq!(a, b);
}

#[test]
fn large_products_split_across_threads_exactly() {
    let (k, n, m) = (256, 1000, 5);
    let w = Matrix::from_f32(n, k, seq(n * k, 7));
    let x = seq(m * k, 8);
    let mut out = vec![0.0; m * n];
    linear(&x, &w, &mut out);
    let wv = seq(n * k, 7);
    for r in 0..m {
        for c in (0..n).step_by(97) {
            assert_eq!(out[r * n + c], naive_dot(&x[r * k..(r + 1) * k], &wv[c * k..(c + 1) * k]));
        }
    }
}

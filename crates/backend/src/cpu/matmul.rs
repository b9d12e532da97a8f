//! Dense matrix products with a fixed reduction order.
//!
//! Every output element is one call of [`dot`] over the full inner dimension, whatever the number
//! of rows and however the work is split across threads. Threads split output rows or columns,
//! never the reduction, so the result of a row does not depend on the rest of the batch.

use super::PAR_THRESHOLD;
use rayon::prelude::*;

const LANES: usize = 16;

/// `sum(a[i] * b[i])`, accumulated in 16 interleaved partial sums folded by a fixed pairwise tree.
/// The order depends only on the length, so equal inputs give bitwise-equal results.
#[inline]
pub fn dot(a: &[f32], b: &[f32]) -> f32 {
    assert_eq!(a.len(), b.len(), "dot: length mismatch");
    let mut acc = [0.0f32; LANES];
    let (ca, cb) = (a.chunks_exact(LANES), b.chunks_exact(LANES));
    let (ra, rb) = (ca.remainder(), cb.remainder());
    for (x, y) in ca.zip(cb) {
        for i in 0..LANES {
            acc[i] += x[i] * y[i];
        }
    }
    for i in 0..ra.len() {
        acc[i] += ra[i] * rb[i];
    }
    let mut width = LANES / 2;
    while width > 0 {
        for i in 0..width {
            acc[i] += acc[i + width];
        }
        width /= 2;
    }
    acc[0]
}

/// `out[m, n] = x[m, k] · w[n, k]^T`: a linear layer without bias over `m` rows.
pub fn linear(x: &[f32], w: &[f32], k: usize, out: &mut [f32]) {
    assert!(
        k > 0 && x.len().is_multiple_of(k) && w.len().is_multiple_of(k),
        "linear: bad inner dimension {k}"
    );
    let m = x.len() / k;
    let n = w.len() / k;
    assert_eq!(out.len(), m * n, "linear: output is {} values, expected {m}x{n}", out.len());
    let row = |(xr, or): (&[f32], &mut [f32])| {
        for (o, wr) in or.iter_mut().zip(w.chunks_exact(k)) {
            *o = dot(xr, wr);
        }
    };
    if m * n * k < PAR_THRESHOLD {
        x.chunks_exact(k).zip(out.chunks_exact_mut(n)).for_each(row);
    } else if m == 1 {
        // One row: split the output columns across threads.
        let cols = n.div_ceil(rayon::current_num_threads() * 4).max(8);
        out.par_chunks_mut(cols).enumerate().for_each(|(c, oc)| {
            let ws = &w[c * cols * k..(c * cols + oc.len()) * k];
            for (o, wr) in oc.iter_mut().zip(ws.chunks_exact(k)) {
                *o = dot(x, wr);
            }
        });
    } else {
        x.par_chunks_exact(k).zip(out.par_chunks_exact_mut(n)).for_each(row);
    }
}

/// Like [`linear`], for rows of `x` picked by `rows` (gathered MoE tokens): `out[i] = x[rows[i]] w^T`.
pub fn linear_rows(x: &[f32], rows: &[usize], w: &[f32], k: usize, out: &mut [f32]) {
    let n = w.len() / k;
    assert_eq!(out.len(), rows.len() * n, "linear_rows: bad output size");
    let row = |(&r, or): (&usize, &mut [f32])| {
        let xr = &x[r * k..(r + 1) * k];
        for (o, wr) in or.iter_mut().zip(w.chunks_exact(k)) {
            *o = dot(xr, wr);
        }
    };
    if rows.len() * n * k < PAR_THRESHOLD {
        rows.iter().zip(out.chunks_exact_mut(n)).for_each(row);
    } else {
        rows.par_iter().zip(out.par_chunks_exact_mut(n)).for_each(row);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn seq(n: usize, seed: u32) -> Vec<f32> {
        (0..n)
            .map(|i| (((i as u32).wrapping_mul(2654435761) ^ seed) % 1000) as f32 / 500.0 - 1.0)
            .collect()
    }

    #[test]
    fn dot_matches_naive_sum_closely() {
        for len in [1, 7, 16, 33, 100] {
            let (a, b) = (seq(len, 1), seq(len, 2));
            let naive: f64 = a.iter().zip(&b).map(|(x, y)| (*x as f64) * (*y as f64)).sum();
            assert!((dot(&a, &b) as f64 - naive).abs() < 1e-4, "len {len}");
        }
    }

    #[test]
    fn a_row_does_not_depend_on_the_batch() {
        let (k, n) = (96, 300);
        let w = seq(n * k, 3);
        let x = seq(64 * k, 4);
        let mut all = vec![0.0; 64 * n];
        linear(&x, &w, k, &mut all);
        for r in [0, 17, 63] {
            let mut one = vec![0.0; n];
            linear(&x[r * k..(r + 1) * k], &w, k, &mut one);
            assert_eq!(one, all[r * n..(r + 1) * n], "row {r}");
            let mut gathered = vec![0.0; n];
            linear_rows(&x, &[r], &w, k, &mut gathered);
            assert_eq!(gathered, one);
        }
    }
}

//! Dense matrix products with a fixed reduction order.
//!
//! Every output element is the [`dot`] of an input row and a weight row over the full inner
//! dimension: 16 interleaved partial sums, folded by a fixed pairwise tree. The tiled kernel
//! computes several outputs at once (reusing each loaded input and weight chunk) but gives every
//! output exactly that sequence of operations, and threads split output rows or columns, never the
//! reduction. So a row's result does not depend on the rest of the batch, on the tiling, on the
//! thread count or on the instruction set the kernel was dispatched to (no FMA contraction).

use super::{Matrix, MatrixData, PAR_THRESHOLD};
use half::bf16;
use rayon::prelude::*;

const LANES: usize = 16;
/// Weight rows per tile.
const NR: usize = 4;
/// Input rows per tile.
const MR: usize = 4;
/// Weight rows per tile when fewer than `MR` input rows stream the weights once.
const NS: usize = 8;

/// A weight element the kernels widen to `f32` (exactly).
trait Elem: Copy + Send + Sync {
    fn f(self) -> f32;

    /// Loads 16 elements (lanes outside `mask` read as zero) widened to `f32`.
    ///
    /// # Safety
    /// The CPU has AVX-512F/BW/VL/DQ, and the masked elements at `ptr` are readable.
    #[cfg(target_arch = "x86_64")]
    unsafe fn load(ptr: *const Self, mask: u16) -> std::arch::x86_64::__m512;
}

impl Elem for f32 {
    #[inline(always)]
    fn f(self) -> f32 {
        self
    }

    #[cfg(target_arch = "x86_64")]
    #[inline]
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512dq")]
    unsafe fn load(ptr: *const Self, mask: u16) -> std::arch::x86_64::__m512 {
        // SAFETY: the caller guarantees the masked elements are readable.
        unsafe { std::arch::x86_64::_mm512_maskz_loadu_ps(mask, ptr) }
    }
}

impl Elem for bf16 {
    #[inline(always)]
    fn f(self) -> f32 {
        f32::from_bits((self.to_bits() as u32) << 16)
    }

    #[cfg(target_arch = "x86_64")]
    #[inline]
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512dq")]
    unsafe fn load(ptr: *const Self, mask: u16) -> std::arch::x86_64::__m512 {
        use std::arch::x86_64::*;
        // SAFETY: the caller guarantees the masked elements are readable; bf16 is 16 bits wide.
        let halves = unsafe { _mm256_maskz_loadu_epi16(mask, ptr.cast()) };
        // bf16 is the top half of an f32: widening is a shift, exact.
        _mm512_castsi512_ps(_mm512_slli_epi32::<16>(_mm512_cvtepu16_epi32(halves)))
    }
}

#[inline(always)]
fn fold(mut acc: [f32; LANES]) -> f32 {
    let mut width = LANES / 2;
    while width > 0 {
        for i in 0..width {
            acc[i] += acc[i + width];
        }
        width /= 2;
    }
    acc[0]
}

/// `sum(a[i] * b[i])` in the fixed order every kernel here uses.
#[inline]
pub fn dot(a: &[f32], b: &[f32]) -> f32 {
    assert_eq!(a.len(), b.len(), "dot: length mismatch");
    let mut out = [0.0];
    #[cfg(target_arch = "x86_64")]
    if super::avx512_available() {
        // SAFETY: the CPU supports the instructions the kernel is compiled for.
        unsafe { avx512::dot(a, b, &mut out) };
        return out[0];
    }
    tile::<f32, 1, 1>(&[a], &[b], &mut [&mut out[..]], 0, std::ptr::null());
    out[0]
}

/// `out[d] = Σ_j p[j] * row(j)[d]` over `j in 0..p.len()`, bit for bit what [`linear`] gives for
/// the input row `p` against the matrix whose row `d` is `(row(0)[d], row(1)[d], ...)`, without
/// building that transpose: term `j` accumulates in lane `(j + lane_offset) % 16`, in order of
/// `j`, and the lanes fold by the same tree. A `lane_offset` of `s % 16` gives the bits of the
/// same sum over `s` leading zero weights (which add nothing). `lanes` is scratch.
pub fn lane_weighted_sum<'a>(
    p: &[f32],
    row: impl Fn(usize) -> &'a [f32],
    lane_offset: usize,
    lanes: &mut Vec<f32>,
    out: &mut [f32],
) {
    lanes.clear();
    lanes.resize(LANES * out.len(), 0.0);
    #[cfg(target_arch = "x86_64")]
    if super::avx512_available() {
        // SAFETY: the CPU supports the instructions the kernel is compiled for.
        return unsafe { avx512::lane_weighted_sum(p, row, lane_offset, lanes, out) };
    }
    lane_weighted_sum_body(p, row, lane_offset, lanes, out)
}

#[inline(always)]
fn lane_weighted_sum_body<'a>(
    p: &[f32],
    row: impl Fn(usize) -> &'a [f32],
    lane_offset: usize,
    lanes: &mut [f32],
    out: &mut [f32],
) {
    let d = out.len();
    for (j, &w) in p.iter().enumerate() {
        let l = (j + lane_offset) % LANES;
        let v = row(j);
        assert_eq!(v.len(), d, "lane_weighted_sum: row width");
        lanes[l * d..(l + 1) * d].iter_mut().zip(v).for_each(|(y, &x)| *y += w * x);
    }
    let mut width = LANES / 2;
    while width > 0 {
        let (low, high) = lanes.split_at_mut(width * d);
        low.iter_mut().zip(&high[..width * d]).for_each(|(y, &x)| *y += x);
        width /= 2;
    }
    out.copy_from_slice(&lanes[..d]);
}

/// Computes the `M x N` outputs of input rows `xs` against weight rows `ws`, writing
/// `out[m][col + n]`.
#[inline(always)]
fn tile<W: Elem, const M: usize, const N: usize>(
    xs: &[&[f32]; M],
    ws: &[&[W]; N],
    out: &mut [&mut [f32]; M],
    col: usize,
    _next: *const W,
) {
    let k = xs[0].len();
    let mut acc = [[[0.0f32; LANES]; N]; M];
    let full = k / LANES * LANES;
    let mut c = 0;
    while c < full {
        let mut wv = [[0.0f32; LANES]; N];
        for n in 0..N {
            for l in 0..LANES {
                wv[n][l] = ws[n][c + l].f();
            }
        }
        for m in 0..M {
            let x = &xs[m][c..c + LANES];
            for n in 0..N {
                for l in 0..LANES {
                    acc[m][n][l] += x[l] * wv[n][l];
                }
            }
        }
        c += LANES;
    }
    for l in 0..k - full {
        for m in 0..M {
            for n in 0..N {
                acc[m][n][l] += xs[m][full + l] * ws[n][full + l].f();
            }
        }
    }
    for m in 0..M {
        for n in 0..N {
            out[m][col + n] = fold(acc[m][n]);
        }
    }
}

/// All outputs of `rows` (input rows) against weight rows `cols`, written to `out` (`out[i]` is
/// the output row of `rows[i]`; weight row `cols.start + j` lands at index `j`). Weight tiles are
/// the outer loop so a tile stays in cache while every input row passes over it.
macro_rules! block_body {
    ($tile:ident, $x:ident, $k:ident, $rows:ident, $w:ident, $cols:ident, $out:ident) => {{
        let base = $cols.start;
        let xrow = |i: usize| &$x[$rows[i] * $k..($rows[i] + 1) * $k];
        let wrow = |j: usize| &$w[j * $k..(j + 1) * $k];
        let none = std::ptr::null::<W>();
        let mut n = $cols.start;
        if $rows.len() < MR {
            // Decode shapes: few input rows, so the weights stream from memory once. Wider tiles
            // keep more rows in flight, and each tile prefetches the one after it.
            while n + NS <= $cols.end {
                let ws: [&[W]; NS] = std::array::from_fn(|j| wrow(n + j));
                let next =
                    if n + 2 * NS <= $cols.end { $w[(n + NS) * $k..].as_ptr() } else { none };
                for i in 0..$rows.len() {
                    $tile::<W, 1, NS>(&[xrow(i)], &ws, &mut [&mut *$out[i]], n - base, next);
                }
                n += NS;
            }
        }
        while n < $cols.end {
            let nr = ($cols.end - n).min(NR);
            // The first pass over a weight tile brings it from memory: it prefetches the next.
            let next = if n + 2 * NR <= $cols.end { $w[(n + NR) * $k..].as_ptr() } else { none };
            let mut m = 0;
            while m < $rows.len() {
                let next = if m == 0 { next } else { none };
                let mr = ($rows.len() - m).min(MR);
                if mr == MR && nr == NR {
                    let xs = [xrow(m), xrow(m + 1), xrow(m + 2), xrow(m + 3)];
                    let ws = [wrow(n), wrow(n + 1), wrow(n + 2), wrow(n + 3)];
                    let (a, rest) = $out[m..].split_at_mut(1);
                    let (b, rest) = rest.split_at_mut(1);
                    let (c, d) = rest.split_at_mut(1);
                    $tile::<W, 4, 4>(
                        &xs,
                        &ws,
                        &mut [&mut *a[0], &mut *b[0], &mut *c[0], &mut *d[0]],
                        n - base,
                        next,
                    );
                } else if nr == NR {
                    let ws = [wrow(n), wrow(n + 1), wrow(n + 2), wrow(n + 3)];
                    for i in m..m + mr {
                        let next = if i == 0 { next } else { none };
                        $tile::<W, 1, 4>(&[xrow(i)], &ws, &mut [&mut *$out[i]], n - base, next);
                    }
                } else {
                    for i in m..m + mr {
                        for j in n..n + nr {
                            $tile::<W, 1, 1>(
                                &[xrow(i)],
                                &[wrow(j)],
                                &mut [&mut *$out[i]],
                                j - base,
                                none,
                            );
                        }
                    }
                }
                m += mr;
            }
            n += nr;
        }
    }};
}

fn block<W: Elem>(
    x: &[f32],
    k: usize,
    rows: &[usize],
    w: &[W],
    cols: std::ops::Range<usize>,
    out: &mut [&mut [f32]],
) {
    block_body!(tile, x, k, rows, w, cols, out)
}

/// Splits the weight rows into chunks across threads; each chunk computes every input row.
fn run<W: Elem>(x: &[f32], k: usize, rows: &[usize], w: &[W], n: usize, out: &mut [f32]) {
    let m = rows.len();
    let work = m * n * k;
    if work < PAR_THRESHOLD {
        let mut outs: Vec<&mut [f32]> = out.chunks_exact_mut(n).collect();
        dispatch(x, k, rows, w, 0..n, &mut outs);
        return;
    }
    let threads = rayon::current_num_threads().max(1);
    // Chunks of whole tiles, a few per thread for balance.
    let chunk = n.div_ceil(threads * 4).next_multiple_of(NR).max(NR);
    let parts: Vec<(usize, Vec<f32>)> = (0..n.div_ceil(chunk))
        .into_par_iter()
        .map(|c| {
            let cols = c * chunk..((c + 1) * chunk).min(n);
            let mut packed = vec![0.0f32; m * cols.len()];
            let mut outs: Vec<&mut [f32]> = packed.chunks_exact_mut(cols.len()).collect();
            dispatch(x, k, rows, w, cols, &mut outs);
            (c, packed)
        })
        .collect();
    for (c, packed) in parts {
        let start = c * chunk;
        let width = packed.len() / m;
        for (i, row) in packed.chunks_exact(width).enumerate() {
            out[i * n + start..i * n + start + width].copy_from_slice(row);
        }
    }
}

/// Runs the AVX-512 kernel where the CPU has it, else the portable one (which the compiler
/// vectorises for the baseline instruction set). Both perform the same operations in the same
/// order, so they agree bit for bit.
fn dispatch<W: Elem>(
    x: &[f32],
    k: usize,
    rows: &[usize],
    w: &[W],
    cols: std::ops::Range<usize>,
    out: &mut [&mut [f32]],
) {
    #[cfg(target_arch = "x86_64")]
    if super::avx512_available() {
        // SAFETY: the CPU supports the instructions the kernel is compiled for.
        return unsafe { avx512::block(x, k, rows, w, cols, out) };
    }
    block(x, k, rows, w, cols, out)
}

#[cfg(target_arch = "x86_64")]
mod avx512 {
    //! AVX-512 tiles: 16 lanes per register, one register per partial-sum vector of the portable
    //! kernel, multiply then add (no FMA, to keep the portable kernel's rounding).

    use super::{Elem, LANES, MR, NR, NS};
    use std::arch::x86_64::*;

    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512dq")]
    pub(super) unsafe fn block<W: Elem>(
        x: &[f32],
        k: usize,
        rows: &[usize],
        w: &[W],
        cols: std::ops::Range<usize>,
        out: &mut [&mut [f32]],
    ) {
        block_body!(tile, x, k, rows, w, cols, out)
    }

    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512dq")]
    pub(super) unsafe fn lane_weighted_sum<'a>(
        p: &[f32],
        row: impl Fn(usize) -> &'a [f32],
        lane_offset: usize,
        lanes: &mut [f32],
        out: &mut [f32],
    ) {
        super::lane_weighted_sum_body(p, row, lane_offset, lanes, out)
    }

    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512dq")]
    pub(super) unsafe fn dot(a: &[f32], b: &[f32], out: &mut [f32; 1]) {
        tile::<f32, 1, 1>(&[a], &[b], &mut [&mut out[..]], 0, std::ptr::null());
    }

    #[inline]
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512dq")]
    fn tile<W: Elem, const M: usize, const N: usize>(
        xs: &[&[f32]; M],
        ws: &[&[W]; N],
        out: &mut [&mut [f32]; M],
        col: usize,
        next: *const W,
    ) {
        let k = xs[0].len();
        let full = k / LANES * LANES;
        // Bytes of the next tile to prefetch per step: as many as this tile consumes.
        let ahead = N * LANES * size_of::<W>();
        let mut acc = [[_mm512_setzero_ps(); N]; M];
        let mut wv = [_mm512_setzero_ps(); N];
        let mut c = 0;
        while c < full {
            if !next.is_null() {
                // The next tile's rows follow this one's in memory: walk them at the same pace.
                let at = next.cast::<u8>().wrapping_add(c * N * size_of::<W>());
                let mut line = 0;
                while line < ahead {
                    // A prefetch never faults, whatever the address.
                    _mm_prefetch::<_MM_HINT_T0>(at.wrapping_add(line).cast());
                    line += 64;
                }
            }
            for n in 0..N {
                // SAFETY: `c + LANES <= k`, the length of every weight row.
                wv[n] = unsafe { W::load(ws[n].as_ptr().add(c), 0xffff) };
            }
            for m in 0..M {
                // SAFETY: as above, for the input rows.
                let xv = unsafe { _mm512_loadu_ps(xs[m].as_ptr().add(c)) };
                for n in 0..N {
                    acc[m][n] = _mm512_add_ps(acc[m][n], _mm512_mul_ps(xv, wv[n]));
                }
            }
            c += LANES;
        }
        if full < k {
            // The tail: masked lanes keep their partial sums untouched, like the portable loop.
            let mask: __mmask16 = (1u32 << (k - full)) as u16 - 1;
            for n in 0..N {
                // SAFETY: masked loads read only the `k - full` valid elements.
                wv[n] = unsafe { W::load(ws[n].as_ptr().add(full), mask) };
            }
            for m in 0..M {
                // SAFETY: as above.
                let xv = unsafe { _mm512_maskz_loadu_ps(mask, xs[m].as_ptr().add(full)) };
                for n in 0..N {
                    acc[m][n] =
                        _mm512_mask_add_ps(acc[m][n], mask, acc[m][n], _mm512_mul_ps(xv, wv[n]));
                }
            }
        }
        for m in 0..M {
            for n in 0..N {
                out[m][col + n] = fold16(acc[m][n]);
            }
        }
        let _ = (MR, NR, NS);
    }

    /// [`fold`] in registers: the same pairwise tree (lane `i` plus lane `i + width`, halving the
    /// width), one vector add per level.
    #[inline]
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512dq")]
    fn fold16(v: __m512) -> f32 {
        let s8 = _mm256_add_ps(_mm512_castps512_ps256(v), _mm512_extractf32x8_ps::<1>(v));
        let s4 = _mm_add_ps(_mm256_castps256_ps128(s8), _mm256_extractf128_ps::<1>(s8));
        let s2 = _mm_add_ps(s4, _mm_movehl_ps(s4, s4));
        _mm_cvtss_f32(_mm_add_ss(s2, _mm_shuffle_ps::<1>(s2, s2)))
    }
}

fn check(x: &[f32], rows: &[usize], w: &Matrix, out: &[f32]) {
    let k = w.cols();
    assert!(k > 0, "linear: empty inner dimension");
    assert!(rows.iter().all(|&r| (r + 1) * k <= x.len()), "linear: input row out of range");
    assert_eq!(out.len(), rows.len() * w.rows(), "linear: output size");
}

/// `out[m, n] = x[m, :] · w[n, :]` for every row of `x` (`[m, w.cols()]`): a linear layer
/// without bias.
pub fn linear(x: &[f32], w: &Matrix, out: &mut [f32]) {
    let k = w.cols();
    assert!(
        k > 0 && x.len().is_multiple_of(k),
        "linear: input is not a whole number of rows of {k}"
    );
    let rows: Vec<usize> = (0..x.len() / k).collect();
    linear_rows(x, &rows, w, out);
}

/// Like [`linear`], for the rows of `x` listed in `rows` (gathered MoE tokens):
/// `out[i] = x[rows[i]] · w^T`.
pub fn linear_rows(x: &[f32], rows: &[usize], w: &Matrix, out: &mut [f32]) {
    check(x, rows, w, out);
    if rows.is_empty() {
        return;
    }
    match w.data() {
        MatrixData::F32(v) => run(x, w.cols(), rows, v, w.rows(), out),
        MatrixData::Bf16(v) => run(x, w.cols(), rows, v, w.rows(), out),
    }
}

/// Like [`linear_rows`], all on the calling thread: for callers that already split their work
/// across threads (one MoE expert per task), where a nested split would only add handoffs.
pub fn linear_rows_serial(x: &[f32], rows: &[usize], w: &Matrix, out: &mut [f32]) {
    check(x, rows, w, out);
    if rows.is_empty() {
        return;
    }
    let n = w.rows();
    let mut outs: Vec<&mut [f32]> = out.chunks_exact_mut(n).collect();
    match w.data() {
        MatrixData::F32(v) => dispatch(x, w.cols(), rows, v, 0..n, &mut outs),
        MatrixData::Bf16(v) => dispatch(x, w.cols(), rows, v, 0..n, &mut outs),
    }
}

/// Like [`linear_rows`], for `f32` weights given as `w.len() / k` rows of `k` (products whose
/// right-hand side is built per step, such as attention's keys and values).
pub fn linear_rows_f32(x: &[f32], rows: &[usize], w: &[f32], k: usize, out: &mut [f32]) {
    assert!(k > 0 && w.len().is_multiple_of(k), "linear: weights are not rows of {k}");
    assert!(rows.iter().all(|&r| (r + 1) * k <= x.len()), "linear: input row out of range");
    let n = w.len() / k;
    assert_eq!(out.len(), rows.len() * n, "linear: output size");
    if !rows.is_empty() {
        run(x, k, rows, w, n, out);
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

    fn naive_dot(a: &[f32], b: &[f32]) -> f32 {
        let mut acc = [0.0f32; LANES];
        for (i, (x, y)) in a.iter().zip(b).enumerate() {
            acc[i % LANES] += x * y;
        }
        fold(acc)
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
            for m in [1, 3, 4, 9, 64] {
                let x = seq(m * k, 4);
                let mut all = vec![0.0; m * n];
                linear(&x, &w, &mut all);
                for r in 0..m {
                    for c in 0..n {
                        let want = naive_dot(&x[r * k..(r + 1) * k], &wv[c * k..(c + 1) * k]);
                        assert_eq!(all[r * n + c], want, "k {k} n {n} m {m} row {r} col {c}");
                    }
                }
                let mut gathered = vec![0.0; n];
                linear_rows(&x, &[m - 1], &w, &mut gathered);
                assert_eq!(gathered, all[(m - 1) * n..]);
            }
        }
    }

    #[test]
    fn bf16_weights_give_the_same_bits_as_their_f32_widening() {
        // 37 weight rows: streaming tiles of `NS`, then 4-wide tiles, then single rows.
        let (k, n) = (40, 37);
        let halfs: Vec<bf16> = seq(n * k, 5).into_iter().map(bf16::from_f32).collect();
        let wide: Vec<f32> = halfs.iter().map(|h| h.to_f32()).collect();
        let narrow = Matrix::new(n, k, MatrixData::Bf16(halfs));
        let wide_rows = wide.clone();
        let wide = Matrix::from_f32(n, k, wide);
        for m in [1, 3, 6] {
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
                assert_eq!(
                    out[r * n + c],
                    naive_dot(&x[r * k..(r + 1) * k], &wv[c * k..(c + 1) * k])
                );
            }
        }
    }
}

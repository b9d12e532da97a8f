//! Dense matrix products with a fixed reduction order.
//!
//! Every output element is the [`dot`] of an input row and a weight row over the full inner
//! dimension: 16 interleaved partial sums, folded by a fixed pairwise tree. The tiled kernel
//! computes several outputs at once (reusing each loaded input and weight chunk) but gives every
//! output exactly that sequence of operations, and threads split output rows or columns, never the
//! reduction. So a row's result does not depend on the rest of the batch, on the tiling, on the
//! thread count or on the instruction set the kernel was dispatched to (no FMA contraction).

use super::{MatmulPrecision, Matrix, MatrixData, PAR_THRESHOLD};
use half::bf16;
use rayon::prelude::*;

const LANES: usize = 16;
/// Weight rows per tile.
const NR: usize = 4;
/// Input rows per tile.
const MR: usize = 4;
/// Input rows per tile where enough rows remain: each widened weight chunk then serves six rows
/// (widening costs as much as a multiply), and the 24 accumulators, 4 weight vectors and the
/// input vector still fit AVX-512's 32 registers. Not where it would leave 2 or 3 rows, which
/// 4-row tiles cover better (8 rows: two 4-row tiles).
const MR_WIDE: usize = 6;

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
    let view = OutView::new(&mut out, 1);
    #[cfg(target_arch = "x86_64")]
    if super::avx512_available() {
        // SAFETY: the CPU supports the instructions the kernel is compiled for; output (0, 0) is
        // `out`.
        unsafe { avx512::dot(a, b, view) };
        return out[0];
    }
    // SAFETY: output (0, 0) is `out`.
    unsafe { tile::<f32, 1, 1>(&[a], &[b], view, (0, 0), std::ptr::null()) };
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

/// Computes the `M x N` outputs of input rows `xs` against weight rows `ws`, writing output
/// `(row + m, col + n)` of `out`.
///
/// # Safety
/// Those outputs lie inside `out` and no other thread writes them meanwhile.
#[inline(always)]
unsafe fn tile<W: Elem, const M: usize, const N: usize>(
    xs: &[&[f32]; M],
    ws: &[&[W]; N],
    out: OutView,
    (row, col): (usize, usize),
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
    for (m, acc) in acc.iter().enumerate() {
        for (n, &acc) in acc.iter().enumerate() {
            // SAFETY: the caller's contract.
            unsafe { out.write(row + m, col + n, fold(acc)) };
        }
    }
}

/// Where a product's outputs go: output `(i, j)` at `ptr + i * stride + j`. The tasks of one
/// product share copies of a view and write disjoint columns.
#[derive(Clone, Copy)]
struct OutView {
    ptr: *mut f32,
    stride: usize,
}

// SAFETY: a view is only handed to tasks that write disjoint outputs, within the lifetime of the
// exclusive borrow it was made from (see `run`).
unsafe impl Send for OutView {}
unsafe impl Sync for OutView {}

impl OutView {
    /// A view of `out` as rows of `stride`.
    fn new(out: &mut [f32], stride: usize) -> Self {
        Self { ptr: out.as_mut_ptr(), stride }
    }

    /// The same view from output row `rows` on.
    ///
    /// # Safety
    /// Row `rows` lies inside (or just past the end of) the buffer the view was made from.
    unsafe fn skip_rows(self, rows: usize) -> Self {
        // SAFETY: the caller's contract.
        Self { ptr: unsafe { self.ptr.add(rows * self.stride) }, stride: self.stride }
    }

    /// # Safety
    /// `(row, col)` lies inside the buffer the view was made from, which is still borrowed, and
    /// no other thread writes it meanwhile.
    #[inline(always)]
    unsafe fn write(self, row: usize, col: usize, value: f32) {
        // SAFETY: the caller's contract.
        unsafe { *self.ptr.add(row * self.stride + col) = value };
    }
}

/// All outputs of `rows` (input rows) against weight rows `cols`: output `(i, j)` is input row
/// `rows[i]` against weight row `j`. Weight tiles are the outer loop so a tile stays in cache
/// while every input row passes over it. Expands inside an `unsafe fn` whose contract covers the
/// outputs `(0..rows.len(), cols)` of `$out`.
macro_rules! block_body {
    ($tile:ident, $x:ident, $k:ident, $rows:ident, $w:ident, $cols:ident, $out:ident) => {{
        let xrow = |i: usize| &$x[$rows[i] * $k..($rows[i] + 1) * $k];
        let wrow = |j: usize| &$w[j * $k..(j + 1) * $k];
        let none = std::ptr::null::<W>();
        let mut n = $cols.start;
        // SAFETY (every tile call): the tiles cover outputs `(0..rows.len(), cols)`, which the
        // enclosing function's contract gives this call alone.
        if $rows.len() < MR {
            // Decode shapes: few input rows, so the product streams its weights from memory once
            // and is bound by how fast they arrive. One weight row at a time walks memory in
            // order, which the hardware prefetchers follow at the full bandwidth; tiles of several
            // rows read as many interleaved streams 2 KiB apart, which they follow less well
            // (see docs/performance.md). The first input row's pass prefetches the bytes
            // `DECODE_PREFETCH` further on, which keeps more lines in flight than the
            // prefetchers alone. A row's bits do not depend on the tile.
            while n < $cols.end {
                let ahead = $w.as_ptr().wrapping_add(n * $k + DECODE_PREFETCH / size_of::<W>());
                for i in 0..$rows.len() {
                    let next = if i == 0 { ahead } else { none };
                    unsafe { $tile::<W, 1, 1>(&[xrow(i)], &[wrow(n)], $out, (i, n), next) };
                }
                n += 1;
            }
        }
        while n < $cols.end {
            let nr = ($cols.end - n).min(NR);
            // The first pass over a weight tile brings it from memory: it prefetches the next.
            let next = if n + 2 * NR <= $cols.end { $w[(n + NR) * $k..].as_ptr() } else { none };
            let mut m = 0;
            while m < $rows.len() {
                let next = if m == 0 { next } else { none };
                let left = $rows.len() - m;
                if nr == NR && left >= MR_WIDE && !(2..MR).contains(&(left - MR_WIDE)) {
                    let xs = std::array::from_fn::<_, MR_WIDE, _>(|i| xrow(m + i));
                    let ws = [wrow(n), wrow(n + 1), wrow(n + 2), wrow(n + 3)];
                    unsafe { $tile::<W, MR_WIDE, NR>(&xs, &ws, $out, (m, n), next) };
                    m += MR_WIDE;
                    continue;
                }
                let mr = left.min(MR);
                if mr == MR && nr == NR {
                    let xs = [xrow(m), xrow(m + 1), xrow(m + 2), xrow(m + 3)];
                    let ws = [wrow(n), wrow(n + 1), wrow(n + 2), wrow(n + 3)];
                    unsafe { $tile::<W, 4, 4>(&xs, &ws, $out, (m, n), next) };
                } else if nr == NR {
                    let ws = [wrow(n), wrow(n + 1), wrow(n + 2), wrow(n + 3)];
                    for i in m..m + mr {
                        let next = if i == 0 { next } else { none };
                        unsafe { $tile::<W, 1, 4>(&[xrow(i)], &ws, $out, (i, n), next) };
                    }
                } else {
                    for i in m..m + mr {
                        for j in n..n + nr {
                            unsafe { $tile::<W, 1, 1>(&[xrow(i)], &[wrow(j)], $out, (i, j), none) };
                        }
                    }
                }
                m += mr;
            }
            n += nr;
        }
    }};
}

/// # Safety
/// Outputs `(0..rows.len(), cols)` of `out` lie in its buffer and are this call's alone.
unsafe fn block<W: Elem>(
    x: &[f32],
    k: usize,
    rows: &[usize],
    w: &[W],
    cols: std::ops::Range<usize>,
    out: OutView,
) {
    block_body!(tile, x, k, rows, w, cols, out)
}

/// Splits the weight rows into chunks across threads; each chunk computes every input row and
/// writes its own columns of `out` in place.
fn run<W: Elem>(x: &[f32], k: usize, rows: &[usize], w: &[W], n: usize, out: &mut [f32]) {
    let m = rows.len();
    assert_eq!(out.len(), m * n, "linear: output size");
    let view = OutView::new(out, n);
    if m * n * k < PAR_THRESHOLD {
        // SAFETY: `out` holds `m` rows of `n`, exclusively borrowed.
        return unsafe { dispatch(x, k, rows, w, 0..n, view) };
    }
    let threads = rayon::current_num_threads().max(1);
    // Chunks of whole tiles, a few per thread for balance.
    let chunk = n.div_ceil(threads * 4).next_multiple_of(NR).max(NR);
    (0..n.div_ceil(chunk)).into_par_iter().for_each(|c| {
        let cols = c * chunk..((c + 1) * chunk).min(n);
        // SAFETY: `out` holds `m` rows of `n` and stays borrowed until every chunk is done;
        // chunks write disjoint column ranges.
        unsafe { dispatch(x, k, rows, w, cols, view) };
    });
}

/// Runs the AVX-512 kernel where the CPU has it, else the portable one (which the compiler
/// vectorises for the baseline instruction set). Both perform the same operations in the same
/// order, so they agree bit for bit.
///
/// # Safety
/// Outputs `(0..rows.len(), cols)` of `out` lie in its buffer and are this call's alone.
unsafe fn dispatch<W: Elem>(
    x: &[f32],
    k: usize,
    rows: &[usize],
    w: &[W],
    cols: std::ops::Range<usize>,
    out: OutView,
) {
    // Input rows in panels that stay in the core's cache while every weight tile passes over
    // them; otherwise a long prompt's rows are re-read from the shared cache once per tile.
    let panel = (PANEL_BYTES / (k * size_of::<f32>())).max(MR).next_multiple_of(MR);
    for (p, rows) in rows.chunks(panel).enumerate() {
        // SAFETY: panel `p`'s outputs are rows `p * panel..` of the caller's outputs.
        let out = unsafe { out.skip_rows(p * panel) };
        #[cfg(target_arch = "x86_64")]
        if super::avx512_available() {
            // SAFETY: the CPU supports the instructions the kernel is compiled for; the outputs
            // are as the caller promised.
            unsafe { avx512::block(x, k, rows, w, cols.clone(), out) };
            continue;
        }
        // SAFETY: as the caller promised.
        unsafe { block(x, k, rows, w, cols.clone(), out) }
    }
}

/// How far ahead of the weight row it reads a decode-shaped product prefetches, in bytes (the
/// best of 1, 4 and 16 KiB in `cargo bench -p routed-backend --bench stream`).
const DECODE_PREFETCH: usize = 4 << 10;

/// Bytes of input rows per panel of [`dispatch`]: a quarter of a 2 MiB L2, leaving room for the
/// weight tiles and the outputs.
const PANEL_BYTES: usize = 512 << 10;

#[cfg(target_arch = "x86_64")]
mod avx512;
mod bf16_dot;

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
    linear_rows(x, &identity_rows(x.len() / k), w, out);
}

/// `0..m` as a row list for [`linear_rows`], borrowed from a static table for the row counts of
/// decode steps (no allocation per product).
pub fn identity_rows(m: usize) -> std::borrow::Cow<'static, [usize]> {
    const SMALL: usize = 256;
    static IDENTITY: [usize; SMALL] = {
        let mut t = [0; SMALL];
        let mut i = 0;
        while i < SMALL {
            t[i] = i;
            i += 1;
        }
        t
    };
    match m <= SMALL {
        true => std::borrow::Cow::Borrowed(&IDENTITY[..m]),
        false => std::borrow::Cow::Owned((0..m).collect()),
    }
}

/// Like [`linear`], for the rows of `x` listed in `rows` (gathered MoE tokens):
/// `out[i] = x[rows[i]] · w^T`.
pub fn linear_rows(x: &[f32], rows: &[usize], w: &Matrix, out: &mut [f32]) {
    check(x, rows, w, out);
    if rows.is_empty() {
        return;
    }
    match (w.data(), w.precision()) {
        (MatrixData::F32(v), _) => run(x, w.cols(), rows, v, w.rows(), out),
        (MatrixData::Bf16(v), MatmulPrecision::F32) => run(x, w.cols(), rows, v, w.rows(), out),
        (MatrixData::Bf16(v), MatmulPrecision::Bf16) => {
            bf16_dot::run(x, w.cols(), rows, v, w.rows(), out, false)
        }
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
    let view = OutView::new(out, n);
    // SAFETY: `check` made `out` exactly `rows.len()` rows of `n`, exclusively borrowed.
    unsafe {
        match (w.data(), w.precision()) {
            (MatrixData::F32(v), _) => dispatch(x, w.cols(), rows, v, 0..n, view),
            (MatrixData::Bf16(v), MatmulPrecision::F32) => {
                dispatch(x, w.cols(), rows, v, 0..n, view)
            }
            (MatrixData::Bf16(v), MatmulPrecision::Bf16) => {
                bf16_dot::run(x, w.cols(), rows, v, n, out, true)
            }
        }
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
mod tests;

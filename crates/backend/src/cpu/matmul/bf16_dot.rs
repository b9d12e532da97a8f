//! Products in bf16 precision ([`MatmulPrecision::Bf16`]): each input row is rounded to bf16
//! (to nearest, ties to even) and multiplied with the bf16 weights by the AVX-512 BF16 dot
//! product, `VDPBF16PS`, which does twice the multiplications of the `f32` kernel per
//! instruction and needs no widening of the weights.
//!
//! The reduction order is as fixed as the `f32` kernel's: output lane `l` (of 16) takes, from
//! each chunk of 32 elements in order, first the product of element `2l + 1`, then that of
//! element `2l` (each product exact, each addition rounded to nearest even, bf16 subnormal inputs
//! read as zero and subnormal sums flushed to zero, as the instruction is documented to do), and
//! the lanes fold by the same pairwise tree. A row's bits therefore never depend on the batch, the
//! tiling or the thread count. Without the instruction the portable kernel performs the same
//! operations one lane at a time (slowly: the mode is for CPUs that have it); a test checks the
//! two agree bit for bit where the instruction exists.
//!
//! [`MatmulPrecision::Bf16`]: crate::cpu::MatmulPrecision::Bf16

use super::{MR, NR, OutView, PANEL_BYTES, fold};
use crate::cpu::PAR_THRESHOLD;
use half::bf16;
use rayon::prelude::*;
use std::cell::Cell;

/// Elements per chunk: one 512-bit register of bf16.
const CHUNK: usize = 32;

thread_local! {
    /// Each thread's rounded input rows, reused so that no product allocates once warm.
    static ROUNDED: Cell<Vec<u16>> = const { Cell::new(Vec::new()) };
}

/// `f32` to bf16 bits, to nearest with ties to even (NaN stays a quiet NaN). Branch-free, so
/// that a row's worth vectorises.
#[inline(always)]
pub(crate) fn round_to_bf16(v: f32) -> u16 {
    let bits = v.to_bits();
    let rounded = bits.wrapping_add(0x7fff + ((bits >> 16) & 1)) >> 16;
    let quiet_nan = (bits >> 16) | 0x40;
    (if bits & 0x7fff_ffff > 0x7f80_0000 { quiet_nan } else { rounded }) as u16
}

#[inline(always)]
fn round_slice_body(x: &[f32], out: &mut [u16]) {
    out.iter_mut().zip(x).for_each(|(o, &v)| *o = round_to_bf16(v));
}

/// Rounds `x` into `out` (as long).
fn round_slice(x: &[f32], out: &mut [u16]) {
    #[cfg(target_arch = "x86_64")]
    if super::super::avx512_available() {
        #[target_feature(enable = "avx512f,avx512bw")]
        unsafe fn avx512(x: &[f32], out: &mut [u16]) {
            round_slice_body(x, out)
        }
        // SAFETY: the CPU has AVX-512F/BW.
        return unsafe { avx512(x, out) };
    }
    round_slice_body(x, out)
}

/// Rounds the input rows `rows` of `x` (rows of `k`) into `out`, gathered: row `i` of `out` is
/// `x[rows[i]]`.
fn round_rows(x: &[f32], k: usize, rows: &[usize], out: &mut Vec<u16>) {
    out.clear();
    out.resize(rows.len() * k, 0);
    for (dst, &r) in out.chunks_exact_mut(k).zip(rows) {
        round_slice(&x[r * k..(r + 1) * k], dst);
    }
}

/// The rows of `x` listed in `rows` against `w` (`n` rows of `k`) into `out` (`rows.len()` rows
/// of `n`); splits the weight rows across the thread pool unless `serial`.
pub(super) fn run(
    x: &[f32],
    k: usize,
    rows: &[usize],
    w: &[bf16],
    n: usize,
    out: &mut [f32],
    serial: bool,
) {
    let m = rows.len();
    assert_eq!(out.len(), m * n, "linear: output size");
    // Taken, not borrowed: a task this thread runs while it waits for the split below may do a
    // product of its own (it then finds an empty buffer and fills that).
    let mut xb = ROUNDED.take();
    round_rows(x, k, rows, &mut xb);
    let view = OutView::new(out, n);
    if serial || m * n * k < PAR_THRESHOLD {
        // SAFETY: `out` holds `m` rows of `n`, exclusively borrowed.
        unsafe { dispatch(&xb, k, w, 0..n, view) };
    } else {
        let threads = rayon::current_num_threads().max(1);
        let chunk = n.div_ceil(threads * 4).next_multiple_of(NR).max(NR);
        (0..n.div_ceil(chunk)).into_par_iter().for_each(|c| {
            let cols = c * chunk..((c + 1) * chunk).min(n);
            // SAFETY: `out` stays borrowed until every chunk is done; chunks write disjoint
            // column ranges.
            unsafe { dispatch(&xb, k, w, cols, view) };
        });
    }
    ROUNDED.set(xb);
}

/// Rows in panels that stay in the core's cache, each on the BF16 kernel where the CPU has it.
///
/// # Safety
/// Outputs `(0..xb.len() / k, cols)` of `out` lie in its buffer and are this call's alone.
unsafe fn dispatch(xb: &[u16], k: usize, w: &[bf16], cols: std::ops::Range<usize>, out: OutView) {
    let panel = (PANEL_BYTES / (k * size_of::<u16>())).max(MR).next_multiple_of(MR);
    for (p, xb) in xb.chunks(panel * k).enumerate() {
        // SAFETY: panel `p`'s outputs are rows `p * panel..` of the caller's outputs.
        let out = unsafe { out.skip_rows(p * panel) };
        #[cfg(target_arch = "x86_64")]
        if super::super::avx512_bf16_available() {
            // SAFETY: the CPU has the instructions; the outputs are as the caller promised.
            unsafe { avx512::block(xb, k, w, cols.clone(), out) };
            continue;
        }
        // SAFETY: as the caller promised.
        unsafe { block(xb, k, w, cols.clone(), out) };
    }
}

/// Every input row of `xb` against weight rows `cols`: one weight row at a time for decode shapes
/// (as the `f32` kernel), 4 x 4 tiles otherwise. Expands inside an `unsafe fn` whose contract
/// covers outputs `(0..xb.len() / k, cols)` of `$out`.
macro_rules! bf16_block_body {
    ($tile:ident, $xb:ident, $k:ident, $w:ident, $cols:ident, $out:ident) => {{
        let m = $xb.len() / $k;
        let xrow = |i: usize| &$xb[i * $k..(i + 1) * $k];
        let wrow = |j: usize| &$w[j * $k..(j + 1) * $k];
        let none = std::ptr::null::<bf16>();
        let mut n = $cols.start;
        // SAFETY (every tile call): the tiles cover outputs `(0..m, cols)`, which the enclosing
        // function's contract gives this call alone.
        // `$rows` input rows from `$i` against weight rows `$ws` (an array) from `$j`, in one
        // tile: each weight chunk loaded once for every input row, `rows x N` accumulators.
        macro_rules! tiles {
            ($rows:expr, $i:expr, $ws:expr, $j:expr, $next:expr) => {
                match $rows {
                    1 => unsafe { $tile::<1, _>(&[xrow($i)], $ws, $out, ($i, $j), $next) },
                    2 => unsafe {
                        $tile::<2, _>(&[xrow($i), xrow($i + 1)], $ws, $out, ($i, $j), $next)
                    },
                    3 => unsafe {
                        let xs = [xrow($i), xrow($i + 1), xrow($i + 2)];
                        $tile::<3, _>(&xs, $ws, $out, ($i, $j), $next)
                    },
                    _ => unsafe {
                        let xs = [xrow($i), xrow($i + 1), xrow($i + 2), xrow($i + 3)];
                        $tile::<4, _>(&xs, $ws, $out, ($i, $j), $next)
                    },
                }
            };
        }
        if m < MR {
            // Decode shapes: one weight row at a time, in memory order (see the f32 kernel).
            while n < $cols.end {
                tiles!(m, 0, &[wrow(n)], n, none);
                n += 1;
            }
        }
        while n < $cols.end {
            if $cols.end - n < NR {
                for i in (0..m).step_by(MR) {
                    for j in n..$cols.end {
                        tiles!((m - i).min(MR), i, &[wrow(j)], j, none);
                    }
                }
                break;
            }
            let ws = [wrow(n), wrow(n + 1), wrow(n + 2), wrow(n + 3)];
            // The first pass over a weight tile brings it from memory: it prefetches the next
            // one at the same pace (4 interleaved rows defeat the hardware prefetchers).
            let next = match n + 2 * NR <= $cols.end {
                true => $w[(n + NR) * $k..].as_ptr(),
                false => none,
            };
            for i in (0..m).step_by(MR) {
                tiles!((m - i).min(MR), i, &ws, n, if i == 0 { next } else { none });
            }
            n += NR;
        }
    }};
}

/// # Safety
/// Outputs `(0..xb.len() / k, cols)` of `out` lie in its buffer and are this call's alone.
unsafe fn block(xb: &[u16], k: usize, w: &[bf16], cols: std::ops::Range<usize>, out: OutView) {
    bf16_block_body!(tile, xb, k, w, cols, out)
}

/// A bf16 value as the instruction reads it: subnormals as zero of the same sign.
#[inline(always)]
fn widen(v: u16) -> f32 {
    match v & 0x7f80 {
        0 => f32::from_bits(u32::from(v & 0x8000) << 16),
        _ => f32::from_bits(u32::from(v) << 16),
    }
}

/// A sum as the instruction writes it: subnormals flushed to zero of the same sign.
#[inline(always)]
fn flush(v: f32) -> f32 {
    match v.is_subnormal() {
        true => f32::from_bits(v.to_bits() & 0x8000_0000),
        false => v,
    }
}

/// The portable tile: `VDPBF16PS` one lane at a time.
///
/// # Safety
/// Outputs `(row..row + M, col..col + N)` of `out` lie in its buffer and are this call's alone.
#[inline(always)]
unsafe fn tile<const M: usize, const N: usize>(
    xs: &[&[u16]; M],
    ws: &[&[bf16]; N],
    out: OutView,
    (row, col): (usize, usize),
    _next: *const bf16,
) {
    let k = xs[0].len();
    let mut acc = [[[0.0f32; CHUNK / 2]; N]; M];
    // Elements past `k` read as +0, like the masked loads of the AVX-512 kernel.
    let at = |v: &[u16], i: usize| v.get(i).copied().unwrap_or(0);
    for c in (0..k).step_by(CHUNK) {
        for m in 0..M {
            for n in 0..N {
                let w = |i: usize| ws[n].get(i).map_or(0, |v| v.to_bits());
                for (l, a) in acc[m][n].iter_mut().enumerate() {
                    let (odd, even) = (c + 2 * l + 1, c + 2 * l);
                    *a = flush(*a + widen(at(xs[m], odd)) * widen(w(odd)));
                    *a = flush(*a + widen(at(xs[m], even)) * widen(w(even)));
                }
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

#[cfg(target_arch = "x86_64")]
mod avx512 {
    use super::{CHUNK, MR, NR, OutView};
    use half::bf16;
    use std::arch::x86_64::*;

    /// # Safety
    /// The CPU has AVX-512F/BW/VL/DQ and BF16; outputs `(0..xb.len() / k, cols)` of `out` lie
    /// in its buffer and are this call's alone.
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512dq,avx512bf16")]
    pub(super) unsafe fn block(
        xb: &[u16],
        k: usize,
        w: &[bf16],
        cols: std::ops::Range<usize>,
        out: OutView,
    ) {
        bf16_block_body!(tile, xb, k, w, cols, out)
    }

    /// 32 bf16 values from `ptr` (lanes outside `mask` read as +0).
    ///
    /// # Safety
    /// The CPU has AVX-512BW and BF16; the masked elements at `ptr` are readable.
    #[inline]
    #[target_feature(enable = "avx512f,avx512bw,avx512bf16")]
    unsafe fn load(ptr: *const u16, mask: __mmask32) -> __m512bh {
        // SAFETY: the caller's contract.
        let v = unsafe { _mm512_maskz_loadu_epi16(mask, ptr.cast()) };
        // SAFETY: both are 512 bits of plain data.
        unsafe { std::mem::transmute::<__m512i, __m512bh>(v) }
    }

    /// # Safety
    /// The CPU has the instructions; outputs `(row..row + M, col..col + N)` of `out` lie in its
    /// buffer and are this call's alone.
    #[inline]
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512dq,avx512bf16")]
    unsafe fn tile<const M: usize, const N: usize>(
        xs: &[&[u16]; M],
        ws: &[&[bf16]; N],
        out: OutView,
        (row, col): (usize, usize),
        next: *const bf16,
    ) {
        let k = xs[0].len();
        let mut acc = [[_mm512_setzero_ps(); N]; M];
        let mut step = |c: usize, mask: __mmask32| {
            if !next.is_null() {
                // The next tile's rows follow this one's: walk them as fast as these are read.
                let at = next.cast::<u8>().wrapping_add(c * N * size_of::<bf16>());
                for line in 0..N {
                    // A prefetch never faults, whatever the address.
                    _mm_prefetch::<_MM_HINT_T0>(at.wrapping_add(line * 64).cast());
                }
            }
            // SAFETY (loads): rows are `k` long; the mask covers only elements below `k`.
            let wv: [__m512bh; N] =
                std::array::from_fn(|n| unsafe { load(ws[n].as_ptr().add(c).cast(), mask) });
            for m in 0..M {
                let xv = unsafe { load(xs[m].as_ptr().add(c), mask) };
                for n in 0..N {
                    acc[m][n] = _mm512_dpbf16_ps(acc[m][n], xv, wv[n]);
                }
            }
        };
        let full = k / CHUNK * CHUNK;
        let mut c = 0;
        while c < full {
            step(c, !0);
            c += CHUNK;
        }
        if full < k {
            step(full, (1u32 << (k - full)) - 1);
        }
        for (m, acc) in acc.iter().enumerate() {
            for (n, &acc) in acc.iter().enumerate() {
                // SAFETY: the caller's contract.
                unsafe { out.write(row + m, col + n, super::super::avx512::fold16(acc)) };
            }
        }
        let _ = (MR, NR);
    }
}

#[cfg(test)]
#[path = "bf16_dot_tests.rs"]
mod tests;

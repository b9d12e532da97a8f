//! AVX-512 tiles: 16 lanes per register, one register per partial-sum vector of the portable
//! kernel, multiply then add (no FMA, to keep the portable kernel's rounding).

use super::{DECODE_PREFETCH, Elem, LANES, MR, MR_WIDE, NR, OutView};
use std::arch::x86_64::*;

/// # Safety
/// The CPU has AVX-512F/BW/VL/DQ; outputs `(0..rows.len(), cols)` of `out` lie in its buffer and
/// are this call's alone.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512dq")]
pub(super) unsafe fn block<W: Elem>(
    x: &[f32],
    k: usize,
    rows: &[usize],
    w: &[W],
    cols: std::ops::Range<usize>,
    out: OutView,
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

/// # Safety
/// The CPU has AVX-512F/BW/VL/DQ; output `(0, 0)` of `out` is this call's alone.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512dq")]
pub(super) unsafe fn dot(a: &[f32], b: &[f32], out: OutView) {
    // SAFETY: the caller's contract.
    unsafe { tile::<f32, 1, 1>(&[a], &[b], out, (0, 0), std::ptr::null()) };
}

/// The AVX-512 build of the portable `tile`: the same operations in the same order.
///
/// # Safety
/// Outputs `(row..row + M, col..col + N)` of `out` lie in its buffer and are this call's alone.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512dq")]
unsafe fn tile<W: Elem, const M: usize, const N: usize>(
    xs: &[&[f32]; M],
    ws: &[&[W]; N],
    out: OutView,
    (row, col): (usize, usize),
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
    for (m, acc) in acc.iter().enumerate() {
        for (n, &acc) in acc.iter().enumerate() {
            // SAFETY: the caller's contract.
            unsafe { out.write(row + m, col + n, fold16(acc)) };
        }
    }
    let _ = (MR, NR);
}

/// [`fold`] in registers: the same pairwise tree (lane `i` plus lane `i + width`, halving the
/// width), one vector add per level.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512dq")]
pub(super) fn fold16(v: __m512) -> f32 {
    let s8 = _mm256_add_ps(_mm512_castps512_ps256(v), _mm512_extractf32x8_ps::<1>(v));
    let s4 = _mm_add_ps(_mm256_castps256_ps128(s8), _mm256_extractf128_ps::<1>(s8));
    let s2 = _mm_add_ps(s4, _mm_movehl_ps(s4, s4));
    _mm_cvtss_f32(_mm_add_ss(s2, _mm_shuffle_ps::<1>(s2, s2)))
}

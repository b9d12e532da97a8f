//! Why decode-shaped products walk their weights one row at a time: the bandwidth a batch-1
//! product gets out of memory with each access pattern, against a plain streaming read of the
//! same bytes, interleaved round by round on the same buffer (an LM head's worth, 311 MB of bf16,
//! well past the caches):
//!
//! * `read`: every thread sums its half of the buffer in order (the machine's bandwidth);
//! * `linear`: the engine's `linear` with one input row (one weight row at a time);
//! * `8 rows`: tiles of 8 weight rows walked together in 16-element steps (8 streams 2 KiB
//!   apart), the layout decode products used before, with and without software prefetch of the
//!   next tile.
//!
//! `cargo bench -p routed-backend --bench stream` (x86-64 with AVX-512; prints nothing useful
//! elsewhere).

use half::bf16;
use routed_backend::cpu::{Matrix, MatrixData, linear};
use std::time::Instant;

const K: usize = 1024;
const N: usize = 151_936;
const ROUNDS: usize = 15;

#[cfg(target_arch = "x86_64")]
mod kernels {
    use super::K;
    use std::arch::x86_64::*;

    /// Sums `w` as integers, in order: a pure streaming read.
    #[target_feature(enable = "avx512f")]
    pub unsafe fn read(w: &[u16]) -> u32 {
        let mut acc = [_mm512_setzero_si512(); 4];
        for c in w.chunks_exact(128) {
            for (j, a) in acc.iter_mut().enumerate() {
                // SAFETY: 4 x 32 elements lie in the 128-element chunk.
                *a = _mm512_add_epi32(*a, unsafe {
                    _mm512_loadu_si512(c[32 * j..].as_ptr().cast())
                });
            }
        }
        let s =
            _mm512_add_epi32(_mm512_add_epi32(acc[0], acc[1]), _mm512_add_epi32(acc[2], acc[3]));
        _mm512_reduce_add_epi32(s) as u32
    }

    /// One input row against tiles of 8 weight rows walked together, 16 elements at a time.
    #[target_feature(enable = "avx512f,avx512bw")]
    pub unsafe fn rows8(w: &[u16], x: &[f32], out: &mut [f32], prefetch: bool) {
        let rows = w.len() / K;
        for n in (0..rows - rows % 8).step_by(8) {
            let base = w[n * K..].as_ptr();
            let next = (n + 16 <= rows).then(|| w[(n + 8) * K..].as_ptr());
            let mut acc = [_mm512_setzero_ps(); 8];
            for c in (0..K).step_by(16) {
                if let (true, Some(next)) = (prefetch, next) {
                    for line in 0..4 {
                        let at = next.cast::<u8>().wrapping_add(c * 16 + line * 64);
                        _mm_prefetch::<_MM_HINT_T0>(at.cast());
                    }
                }
                // SAFETY: `c + 16 <= K`, inside every row of the tile.
                let xv = unsafe { _mm512_loadu_ps(x.as_ptr().add(c)) };
                for (r, a) in acc.iter_mut().enumerate() {
                    let h = unsafe { _mm256_loadu_si256(base.add(r * K + c).cast()) };
                    let wv = _mm512_castsi512_ps(_mm512_slli_epi32::<16>(_mm512_cvtepu16_epi32(h)));
                    *a = _mm512_add_ps(*a, _mm512_mul_ps(xv, wv));
                }
            }
            for (r, a) in acc.iter().enumerate() {
                out[n + r] = _mm512_reduce_add_ps(*a);
            }
        }
    }
}

/// Runs `f` on each half of the rows, one thread each; returns the seconds it took.
fn halves(f: impl Fn(std::ops::Range<usize>) + Sync) -> f64 {
    let t = Instant::now();
    std::thread::scope(|s| {
        s.spawn(|| f(0..N / 2));
        f(N / 2..N);
    });
    t.elapsed().as_secs_f64()
}

fn main() {
    #[cfg(target_arch = "x86_64")]
    if is_x86_feature_detected!("avx512f") && is_x86_feature_detected!("avx512bw") {
        run();
        return;
    }
    println!("stream: needs x86-64 with AVX-512");
}

#[cfg(target_arch = "x86_64")]
fn run() {
    let raw: Vec<u16> = (0..N * K).map(|i| 0x3c00 + (i * 7919 % 251) as u16).collect();
    let x: Vec<f32> = (0..K).map(|i| (i % 13) as f32 * 0.1).collect();
    let w = Matrix::new(N, K, MatrixData::Bf16(raw.iter().map(|&b| bf16::from_bits(b)).collect()));
    let mut out = vec![0.0f32; N];
    let out_ptr = out.as_mut_ptr() as usize;
    let bytes = (N * K * 2) as f64;
    let names = ["read", "linear", "8 rows, prefetch", "8 rows"];
    let mut gbs = vec![Vec::new(); names.len()];
    rayon::ThreadPoolBuilder::new().num_threads(2).build_global().ok();
    for _ in 0..ROUNDS {
        let secs = [
            // SAFETY (all): the CPU has AVX-512F/BW (checked by the caller); each thread writes
            // only its own half of `out`.
            halves(|r| {
                std::hint::black_box(unsafe { kernels::read(&raw[r.start * K..r.end * K]) });
            }),
            {
                let t = Instant::now();
                linear(&x, &w, &mut out);
                t.elapsed().as_secs_f64()
            },
            halves(|r| unsafe {
                let o = std::slice::from_raw_parts_mut((out_ptr as *mut f32).add(r.start), r.len());
                kernels::rows8(&raw[r.start * K..r.end * K], &x, o, true)
            }),
            halves(|r| unsafe {
                let o = std::slice::from_raw_parts_mut((out_ptr as *mut f32).add(r.start), r.len());
                kernels::rows8(&raw[r.start * K..r.end * K], &x, o, false)
            }),
        ];
        for (g, s) in gbs.iter_mut().zip(secs) {
            g.push(bytes / s / 1e9);
        }
    }
    let median = |v: &[f64]| {
        let mut v = v.to_vec();
        v.sort_by(f64::total_cmp);
        v[v.len() / 2]
    };
    println!("{ROUNDS} interleaved rounds, 2 threads, {:.0} MB of bf16 weights", bytes / 1e6);
    for (name, g) in names.iter().zip(&gbs) {
        let ratios: Vec<f64> = g.iter().zip(&gbs[0]).map(|(a, b)| a / b).collect();
        let (lo, hi) = ratios.iter().fold((f64::MAX, 0.0f64), |(l, h), &r| (l.min(r), h.max(r)));
        println!(
            "{name:>17}: {:5.1} GB/s median; of the read, per round: median {:.2} (min {lo:.2}, max {hi:.2})",
            median(g),
            median(&ratios)
        );
    }
}

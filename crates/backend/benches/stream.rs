//! Why decode-shaped products walk their weights one row at a time: the bandwidth a batch-1
//! product gets out of memory with each access pattern, against a plain streaming read of the
//! same bytes, interleaved round by round on the same buffer (an LM head's worth, 311 MB of bf16,
//! well past the caches, backed by transparent huge pages as the loader asks for the weights):
//!
//! * `read`: every thread sums its half of the buffer in order (the machine's bandwidth);
//! * `linear`: the engine's `linear` with one input row (one weight row at a time);
//! * `... 4 KiB pages`: the same two on an ordinary allocation;
//! * `8 rows`: tiles of 8 weight rows walked together in 16-element steps (8 streams 2 KiB
//!   apart), the layout decode products used before, with and without software prefetch of the
//!   next tile;
//! * `1 row`: the engine's walk written out, then with a software prefetch of the line 1, 4 or
//!   16 KiB ahead of the one being read.
//!
//! `cargo bench -p routed-backend --bench stream` (x86-64 with AVX-512; prints nothing useful
//! elsewhere).

use half::bf16;
use routed_backend::cpu::{Matrix, MatrixData, linear, streamed_vec};
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

    /// One input row against one weight row at a time (the engine's decode walk), prefetching
    /// the line `ahead` bytes further on as each line is consumed (none when `ahead` is 0).
    #[target_feature(enable = "avx512f,avx512bw")]
    pub unsafe fn rows1(w: &[u16], x: &[f32], out: &mut [f32], ahead: usize) {
        for (n, row) in w.chunks_exact(K).enumerate() {
            let mut acc = _mm512_setzero_ps();
            for c in (0..K).step_by(16) {
                if ahead > 0 && c % 32 == 0 {
                    let at = row.as_ptr().cast::<u8>().wrapping_add(c * 2 + ahead);
                    _mm_prefetch::<_MM_HINT_T0>(at.cast());
                }
                // SAFETY: `c + 16 <= K`, inside the row.
                let xv = unsafe { _mm512_loadu_ps(x.as_ptr().add(c)) };
                let h = unsafe { _mm256_loadu_si256(row.as_ptr().add(c).cast()) };
                let wv = _mm512_castsi512_ps(_mm512_slli_epi32::<16>(_mm512_cvtepu16_epi32(h)));
                acc = _mm512_add_ps(acc, _mm512_mul_ps(xv, wv));
            }
            out[n] = _mm512_reduce_add_ps(acc);
        }
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
    let plain: Vec<u16> = (0..N * K).map(|i| 0x3c00 + (i * 7919 % 251) as u16).collect();
    let raw = huge_copy(&plain);
    let x: Vec<f32> = (0..K).map(|i| (i % 13) as f32 * 0.1).collect();
    let plain_bf16: Vec<bf16> = plain.iter().map(|&b| bf16::from_bits(b)).collect();
    let w = Matrix::new(N, K, MatrixData::Bf16(huge_copy(&plain_bf16)));
    let w_plain = Matrix::new(N, K, MatrixData::Bf16(plain_bf16));
    let mut out = vec![0.0f32; N];
    let out_ptr = out.as_mut_ptr() as usize;
    let bytes = (N * K * 2) as f64;
    let names = [
        "read",
        "read, 4 KiB pages",
        "linear",
        "linear, 4 KiB pages",
        "8 rows, prefetch",
        "8 rows",
        "1 row",
        "1 row, +1 KiB",
        "1 row, +4 KiB",
        "1 row, +16 KiB",
    ];
    let mut gbs = vec![Vec::new(); names.len()];
    rayon::ThreadPoolBuilder::new().num_threads(2).build_global().ok();
    let read = |w: &[u16]| {
        halves(|r| {
            // SAFETY: the CPU has AVX-512F (checked by the caller).
            std::hint::black_box(unsafe { kernels::read(&w[r.start * K..r.end * K]) });
        })
    };
    let engine = |w: &Matrix, out: &mut [f32]| {
        let t = Instant::now();
        linear(&x, w, out);
        t.elapsed().as_secs_f64()
    };
    let rows1 = |ahead: usize| {
        halves(|r| unsafe {
            let o = std::slice::from_raw_parts_mut((out_ptr as *mut f32).add(r.start), r.len());
            kernels::rows1(&raw[r.start * K..r.end * K], &x, o, ahead)
        })
    };
    for _ in 0..ROUNDS {
        let secs = [
            read(&raw),
            read(&plain),
            engine(&w, &mut out),
            engine(&w_plain, &mut out),
            // SAFETY (all): the CPU has AVX-512F/BW (checked by the caller); each thread writes
            // only its own half of `out`.
            halves(|r| unsafe {
                let o = std::slice::from_raw_parts_mut((out_ptr as *mut f32).add(r.start), r.len());
                kernels::rows8(&raw[r.start * K..r.end * K], &x, o, true)
            }),
            halves(|r| unsafe {
                let o = std::slice::from_raw_parts_mut((out_ptr as *mut f32).add(r.start), r.len());
                kernels::rows8(&raw[r.start * K..r.end * K], &x, o, false)
            }),
            rows1(0),
            rows1(1 << 10),
            rows1(4 << 10),
            rows1(16 << 10),
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
    println!(
        "{ROUNDS} interleaved rounds, 2 threads, {:.0} MB of bf16 weights; {}",
        bytes / 1e6,
        anon_huge_pages()
    );
    for (name, g) in names.iter().zip(&gbs) {
        let ratios: Vec<f64> = g.iter().zip(&gbs[0]).map(|(a, b)| a / b).collect();
        let (lo, hi) = ratios.iter().fold((f64::MAX, 0.0f64), |(l, h), &r| (l.min(r), h.max(r)));
        println!(
            "{name:>19}: {:5.1} GB/s median; of the read, per round: median {:.2} (min {lo:.2}, max {hi:.2})",
            median(g),
            median(&ratios)
        );
    }
}

/// A copy of `v` in a buffer that asks for transparent huge pages, as the weight loader's do.
fn huge_copy<T: Copy>(v: &[T]) -> Vec<T> {
    let mut out = streamed_vec(v.len());
    out.extend_from_slice(v);
    out
}

/// The process's anonymous memory in huge pages, as the kernel reports it.
fn anon_huge_pages() -> String {
    std::fs::read_to_string("/proc/self/smaps_rollup")
        .ok()
        .and_then(|s| s.lines().find(|l| l.starts_with("AnonHugePages")).map(str::to_owned))
        .map_or_else(
            || "huge pages unknown".into(),
            |l| l.split_whitespace().collect::<Vec<_>>().join(" "),
        )
}

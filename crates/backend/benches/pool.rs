//! What a parallel region costs beyond its work, with the pool's workers left to sleep between
//! regions and with them kept spinning by `with_hot_workers`:
//! `cargo bench -p routed-backend --bench pool`.
//!
//! Each region follows some serial work on one thread (as a step's norms and routing do) and then
//! splits busy work into 8 tasks across a 2-thread pool. The two modes alternate, 7 rounds each.

use rayon::prelude::*;
use routed_backend::cpu::with_hot_workers;
use std::time::{Duration, Instant};

/// Busy work on this thread for `micros`.
fn work(micros: f64) {
    let until = Instant::now() + Duration::from_secs_f64(micros * 1e-6);
    while Instant::now() < until {
        std::hint::spin_loop();
    }
}

/// Microseconds per region beyond its serial and parallel work.
fn overhead(serial: f64, parallel: f64, hot: bool) -> f64 {
    const REGIONS: usize = 500;
    let burst = || {
        for _ in 0..REGIONS {
            work(serial);
            // 8 tasks over 2 threads: `parallel` microseconds per thread.
            (0..8).into_par_iter().for_each(|_| work(parallel / 4.0));
        }
    };
    let started = Instant::now();
    if hot {
        with_hot_workers(burst)
    } else {
        rayon::scope(|_| burst())
    }
    started.elapsed().as_secs_f64() * 1e6 / REGIONS as f64 - serial - parallel
}

fn main() {
    let pool = rayon::ThreadPoolBuilder::new().num_threads(2).build().expect("a 2-thread pool");
    println!("serial us  parallel us  overhead per region, us: workers sleep / kept spinning");
    for (serial, parallel) in [(0.0, 20.0), (5.0, 20.0), (20.0, 20.0), (20.0, 100.0), (50.0, 50.0)]
    {
        let (mut cold, mut hot) = (Vec::new(), Vec::new());
        for _ in 0..7 {
            cold.push(pool.install(|| overhead(serial, parallel, false)));
            hot.push(pool.install(|| overhead(serial, parallel, true)));
        }
        let median = |v: &mut Vec<f64>| {
            v.sort_by(f64::total_cmp);
            v[v.len() / 2]
        };
        println!(
            "{serial:>9.0} {parallel:>12.0} {:>14.1} / {:.1}",
            median(&mut cold),
            median(&mut hot)
        );
    }
}

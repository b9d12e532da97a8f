//! Heap allocations of the whole engine's decode steps (scheduler, cache manager, executor,
//! runner, worker, routing copy worker, routing host-cache, delivery thread and the streams),
//! counted across every thread of the process: a step may allocate for the step, but not for
//! every sequence in it. Runs on the device `ROUTED_TEST_DEVICE` names (the CUDA worker's host
//! side on the simulator or a GPU).

mod common;

use common::{engine, greedy};
use futures_util::StreamExt;
use routed::{GenerateRequest, RequestEvent};
use routed_test_support::{Counting, num_allocations};

#[global_allocator]
static GLOBAL: Counting = Counting;

/// Allocations per decode step while `num_seqs` requests (a 4-token prompt each) decode in
/// lockstep: counted between the first request's token `FROM` and its token `TO` arriving, so
/// prefill, start-up and each request's end (its final text decoded) fall outside the window.
async fn allocations_per_step(handle: &routed::EngineHandle, num_seqs: u32) -> f64 {
    const FROM: u32 = 8;
    const TO: u32 = 40;
    let mut streams = Vec::new();
    for i in 0..num_seqs {
        // Distinct prompts: no prefix hits between the requests.
        let prompt = vec![5 + i, 200 + i, 300 + i, 7];
        let request = GenerateRequest::new(prompt, greedy(TO + 8));
        streams.push(handle.submit(request).await.expect("submitted"));
    }
    let drains = streams.into_iter().enumerate().map(|(i, mut stream)| async move {
        let (mut num_tokens, mut window) = (0, (0, 0));
        while let Some(event) = stream.next().await {
            match event {
                RequestEvent::Token(_) => num_tokens += 1,
                RequestEvent::Finished(_) => {}
                RequestEvent::Error(e) => panic!("{e}"),
            }
            if i == 0 && num_tokens == FROM && window.0 == 0 {
                window.0 = num_allocations();
            }
            if i == 0 && num_tokens == TO && window.1 == 0 {
                window.1 = num_allocations();
            }
        }
        assert_eq!(num_tokens, TO + 8);
        window
    });
    let windows = futures_util::future::join_all(drains).await;
    let (from, to) = windows[0];
    (to - from) as f64 / f64::from(TO - FROM)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_decode_step_allocates_nothing_for_every_sequence() {
    let handle = engine("qwen3_moe", |c| {
        c.block_size = 16;
        c.max_num_seqs = 64;
        c.num_kv_blocks = Some(512);
    });
    // Warm up the engine's buffers.
    allocations_per_step(&handle, 64).await;
    let few = allocations_per_step(&handle, 8).await;
    let many = allocations_per_step(&handle, 64).await;
    let per_seq = (many - few) / 56.0;
    eprintln!("allocations a decode step: {few:.1} at 8 sequences, {many:.1} at 64");
    // What a sequence allocates comes with a new block (its grant's blocks, its new shared
    // table, its routing rows: 3 in 16 steps) and with lists that double as it grows (its
    // output, the cache manager's tokens, block hashes and table): about half an allocation a
    // step. One allocation made for every sequence every step would add 1.
    assert!(
        per_seq < 1.0,
        "{per_seq:.2} allocations per sequence per step ({few:.1} a step at 8 sequences, \
         {many:.1} at 64): something is allocated for every sequence every step"
    );
    handle.shutdown().await;
}

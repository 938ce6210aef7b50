#!/usr/bin/env bash
# The llama.cpp peer (feature `llamacpp`): its tests, then, with --bench, decode and
# prefill speed of both engines measured in one run, side by side with the ratios.
# Not part of .ci/run: the `llama-cpp-2` crate builds llama.cpp's C++ source with
# cmake (about ten minutes on a 2-core machine) and needs cmake and libclang:
#
#   apt-get install -y cmake libclang-dev
#
#   scripts/peer-llamacpp.sh            # build with the feature, run the peer's tests
#   scripts/peer-llamacpp.sh --bench    # also: treegrpo bench at batch 1, 32, 64 + prefill
#
# llama.cpp gets this CPU's SIMD extensions the way its own native build would
# (GGML_NATIVE): llama-cpp-sys-2 turns GGML_NATIVE off unless rustc itself targets
# `native`, which would change our binary too, so the extensions are passed as the
# GGML_* cmake options it forwards, read from /proc/cpuinfo. llama-cpp-sys-2 reruns
# cmake only when a GGML_* variable it saw before changes: after adding one, run
# `cargo clean -p llama-cpp-sys-2 --release` first.
set -euo pipefail
cd "$(dirname "$0")/.."
# The main target directory: llama-cpp-2 changes no feature of our other
# dependencies, so switching the feature on rebuilds only this crate and llama.cpp.
export CARGO_TARGET_DIR="${PEER_TARGET_DIR:-$HOME/.cache/treegrpo-target}"
export CARGO_TERM_COLOR=never

flags=$(grep -m1 '^flags' /proc/cpuinfo || true)
has() { [[ " $flags " == *" $1 "* ]]; }
has avx512f && export GGML_AVX512=ON
has avx512vbmi && export GGML_AVX512_VBMI=ON
has avx512_vnni && export GGML_AVX512_VNNI=ON
has avx512_bf16 && export GGML_AVX512_BF16=ON
has avx_vnni && export GGML_AVX_VNNI=ON
has bmi2 && export GGML_BMI2=ON
env | grep '^GGML_' | sort | sed 's/^/   llama.cpp build: /' || true

echo "== cargo test --release --features llamacpp --test peer_llamacpp_tests (target: $CARGO_TARGET_DIR)"
cargo test --release --features llamacpp --test peer_llamacpp_tests -- --nocapture

if [ "${1:-}" = "--bench" ]; then
  echo "== treegrpo bench: decode and prefill, ours beside llama.cpp's"
  cargo run --release --features llamacpp -- bench --prompts 1 --only chain-4 \
    --decode-batches 1,32,64 --prefill-tokens 256 --json
fi

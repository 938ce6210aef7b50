#!/usr/bin/env bash
# Builds the fuzz targets (fuzz/, libFuzzer) with coverage instrumentation on the
# stable toolchain and runs each for a bounded time over its committed corpus.
#
#   scripts/fuzz.sh [SECONDS_PER_TARGET] [TARGET...]
#
# Defaults: 30 s each, every target (gguf_header tokenizer action jsonl server).
# Inputs that widen coverage go to a scratch corpus outside the clone; with
# FUZZ_KEEP=1 they are merged (minimised) into the committed fuzz/corpus/TARGET. A
# crash stops the run, its input saved under fuzz/artifacts/TARGET/ — turn it into a
# regression test (tests/fuzz_regression_tests.rs) and fix it.
#
# No AddressSanitizer (that needs a nightly compiler): the parsers are safe Rust, so
# what the fuzzer hunts is panics, aborts, overflows (overflow checks are on) and
# runaway allocations (-rss_limit_mb), which libFuzzer reports without it.
set -euo pipefail
cd "$(dirname "$0")/.."
SECONDS_EACH=${1:-30}
shift || true
TARGETS=("$@")
[ ${#TARGETS[@]} -gt 0 ] || TARGETS=(gguf_header tokenizer action jsonl server)
export CARGO_TARGET_DIR="${TREEGRPO_FUZZ_TARGET_DIR:-$HOME/.cache/treegrpo-fuzz-target}"
HOST=$(rustc -vV | sed -n 's/^host: //p')
# What cargo-fuzz passes for coverage-guided libFuzzer, minus the sanitizer. With an
# explicit --target these flags reach the targets' crates, not build scripts.
export RUSTFLAGS="-Cpasses=sancov-module -Cllvm-args=-sanitizer-coverage-level=4 \
-Cllvm-args=-sanitizer-coverage-inline-8bit-counters -Cllvm-args=-sanitizer-coverage-pc-table \
-Cllvm-args=-sanitizer-coverage-trace-compares --cfg fuzzing \
-Ctarget-feature=+avx2,+fma,+f16c"
(cd fuzz && cargo build --release --target "$HOST" --bins)
SCRATCH="$CARGO_TARGET_DIR/fuzz-corpus"
for t in "${TARGETS[@]}"; do
  mkdir -p "fuzz/corpus/$t" "fuzz/artifacts/$t" "$SCRATCH/$t"
  echo "== fuzz $t for ${SECONDS_EACH}s"
  log="$CARGO_TARGET_DIR/fuzz-$t.log"
  rc=0
  "$CARGO_TARGET_DIR/$HOST/release/$t" -max_total_time="$SECONDS_EACH" -timeout=20 \
    -rss_limit_mb=4096 -max_len=65536 -print_final_stats=1 \
    -artifact_prefix="fuzz/artifacts/$t/" "$SCRATCH/$t" "fuzz/corpus/$t" >"$log" 2>&1 || rc=$?
  grep -E 'stat::number_of_executed_units|stat::new_units_added|^#[0-9]+ +DONE' "$log" || true
  if [ "$rc" -ne 0 ]; then
    tail -40 "$log" >&2
    echo "fuzz $t failed (exit $rc); the input is under fuzz/artifacts/$t/" >&2
    exit 1
  fi
  if [ "${FUZZ_KEEP:-0}" = 1 ]; then
    "$CARGO_TARGET_DIR/$HOST/release/$t" -merge=1 "fuzz/corpus/$t" "$SCRATCH/$t" >"$log.merge" 2>&1
    echo "kept $(ls "fuzz/corpus/$t" | wc -l) inputs in fuzz/corpus/$t"
  fi
done

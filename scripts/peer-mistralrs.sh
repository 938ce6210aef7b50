#!/usr/bin/env bash
# The mistral.rs peer (feature `mistralrs`): its smoke tests, then, with --bench, the
# whole `treegrpo bench` with the peer's rows beside ours. Not part of .ci/run: building
# mistral.rs 0.8.1 (in release, shared by its tests and the bench) adds about half an
# hour on a 2-core machine; the bench's peer rows add about fifteen minutes.
#
#   scripts/peer-mistralrs.sh            # build with the feature, run the peer's tests
#   scripts/peer-mistralrs.sh --bench    # also: treegrpo bench --prompts 16 --json
#   scripts/peer-mistralrs.sh --bench --only chain-4,mistralrs-chain-4 --prompts 4
#                                        # the bench with these arguments instead
#
# The peer build gets a target directory of its own, so switching the feature on and
# off does not rebuild the main one.
set -euo pipefail
cd "$(dirname "$0")/.."
export CARGO_TARGET_DIR="${PEER_TARGET_DIR:-$HOME/.cache/treegrpo-peer-target}"
export CARGO_TERM_COLOR=never

# The test and the binary in one release build: cargo unifies the features of
# mistral.rs's dependencies per invocation, and a separate `cargo run` (no
# dev-dependencies) resolved them differently and compiled mistral.rs a second time
# (half an hour each on 2 cores). The bench then runs the binary that build made.
echo "== cargo build --release --features mistralrs (target: $CARGO_TARGET_DIR)"
cargo build --release --features mistralrs --test peer_mistralrs_tests --bin treegrpo
echo "== cargo test --release --features mistralrs --test peer_mistralrs_tests"
cargo test --release --features mistralrs --test peer_mistralrs_tests

if [ "${1:-}" = "--bench" ]; then
  shift
  echo "== treegrpo bench with the mistral.rs peer"
  if [ "$#" -eq 0 ]; then
    set -- --prompts 16 --max-step-tokens 64 --json
  fi
  "$CARGO_TARGET_DIR/release/treegrpo" bench "$@"
fi

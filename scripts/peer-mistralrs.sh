#!/usr/bin/env bash
# The mistral.rs peer (feature `mistralrs`): its smoke tests, then, with --bench, the
# whole `treegrpo bench` with the peer's rows beside ours. Not part of .ci/run: building
# mistral.rs 0.8.1 (in release, shared by its tests and the bench) adds about half an
# hour on a 2-core machine; the bench's peer rows add about fifteen minutes.
#
#   scripts/peer-mistralrs.sh            # build with the feature, run the peer's tests
#   scripts/peer-mistralrs.sh --bench    # also: treegrpo bench --prompts 16 --json
#
# The peer build gets a target directory of its own, so switching the feature on and
# off does not rebuild the main one.
set -euo pipefail
cd "$(dirname "$0")/.."
export CARGO_TARGET_DIR="${PEER_TARGET_DIR:-$HOME/.cache/treegrpo-peer-target}"
export CARGO_TERM_COLOR=never

# --release for the tests too: the bench below then reuses the same mistral.rs build
# (a debug-profile test build and a release run each compiled it, an hour in all).
echo "== cargo test --release --features mistralrs --test peer_mistralrs_tests (target: $CARGO_TARGET_DIR)"
cargo test --release --features mistralrs --test peer_mistralrs_tests

if [ "${1:-}" = "--bench" ]; then
  echo "== treegrpo bench with the mistral.rs peer"
  cargo run --release --features mistralrs -- bench --prompts 16 --max-step-tokens 64 --json
fi

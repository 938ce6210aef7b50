#!/usr/bin/env bash
# Tree-GRPO against chain GRPO from the same warm start: (2,2,1) trees vs G=4 chains,
# several seeds each, eval reward against cumulative computed tokens, one plot.
# Not part of .ci/run (it trains for a long while).
#
#   scripts/tree-vs-chain.sh OUT [TASK] [SEEDS] [STEPS]
#     OUT     folder for the warm-start checkpoint, the runs and compare.svg
#     TASK    calc (default) or search-qa
#     SEEDS   seeds per arm (default 3)
#     STEPS   RL steps per run (default 4)
#
# Every run starts from one `treegrpo sft` checkpoint, so the arms differ only in how
# they sample: trees (M=2, N=2, L=1: 6 leaves a prompt, sharing prefixes) or 4
# independent chains. Both use the same prompts per step, update flags and eval set.
set -euo pipefail
cd "$(dirname "$0")/.."
OUT=${1:?usage: scripts/tree-vs-chain.sh OUT [TASK] [SEEDS] [STEPS]}
TASK=${2:-calc}
SEEDS=${3:-3}
STEPS=${4:-4}
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$HOME/.cache/treegrpo-target}"
cargo build --release
BIN="$CARGO_TARGET_DIR/release/treegrpo"
mkdir -p "$OUT"
COMMON=(--task "$TASK" --steps "$STEPS" --prompts-per-step 4 --lr 1e-5
        --max-step-tokens 64 --turns 2 --eval-prompts 20 --eval-every 1
        --checkpoint-every 0)
if [ ! -f "$OUT/warm/config.json" ]; then
  "$BIN" sft --task "$TASK" --examples 32 --epochs 1 --turns 2 --out "$OUT/warm"
fi
runs=()
for seed in $(seq 1 "$SEEDS"); do
  "$BIN" train --model "$OUT/warm" "${COMMON[@]}" --seed "$seed" --out "$OUT/tree-2-2-1-seed$seed"
  "$BIN" train --model "$OUT/warm" "${COMMON[@]}" --seed "$seed" --chains 4 --out "$OUT/chain-4-seed$seed"
  runs+=("$OUT/tree-2-2-1-seed$seed" "$OUT/chain-4-seed$seed")
done
"$BIN" plot "${runs[@]}" --out "$OUT/compare.svg"
echo "wrote $OUT/compare.svg"

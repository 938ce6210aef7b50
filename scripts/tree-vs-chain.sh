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
#   Environment: FIRST_SEED (skip the seeds before it), PROMPTS (prompts per step, default 4), LR (default 1e-5), EVAL
#   (test questions per evaluation, default 20),
#   KEEP_CHECKPOINTS=1 to keep each run's final checkpoint (1.6 GB each; removed by
#   default once the run's log is written, so six runs do not fill the disk).
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
mkdir -p "$OUT"
# The runs use a copy of the binary, so a rebuild while they train changes nothing.
cp "$CARGO_TARGET_DIR/release/treegrpo" "$OUT/treegrpo"
BIN="$OUT/treegrpo"
PROMPTS=${PROMPTS:-4}
LR=${LR:-1e-5}
COMMON=(--task "$TASK" --steps "$STEPS" --prompts-per-step "$PROMPTS" --lr "$LR"
        --max-step-tokens 64 --turns 2 --eval-prompts "${EVAL:-20}" --eval-every 1
        --checkpoint-every 0)
if [ ! -f "$OUT/warm/config.json" ]; then
  "$BIN" sft --task "$TASK" --examples 32 --epochs 1 --turns 2 --out "$OUT/warm"
fi
# FIRST_SEED=K skips the seeds before K (their runs are already in OUT).
for seed in $(seq "${FIRST_SEED:-1}" "$SEEDS"); do
  "$BIN" train --model "$OUT/warm" "${COMMON[@]}" --seed "$seed" --out "$OUT/tree-2-2-1-seed$seed"
  "$BIN" train --model "$OUT/warm" "${COMMON[@]}" --seed "$seed" --chains 4 --out "$OUT/chain-4-seed$seed"
  if [ "${KEEP_CHECKPOINTS:-0}" != 1 ]; then
    rm -rf "$OUT/tree-2-2-1-seed$seed/checkpoint" "$OUT/chain-4-seed$seed/checkpoint"
  fi
done
runs=()
for seed in $(seq 1 "$SEEDS"); do
  runs+=("$OUT/tree-2-2-1-seed$seed" "$OUT/chain-4-seed$seed")
done
"$BIN" plot "${runs[@]}" --out "$OUT/compare.svg"
python3 scripts/tree-vs-chain-summary.py "$OUT" > "$OUT/summary.txt"
rm -f "$OUT/treegrpo"
echo "wrote $OUT/compare.svg and $OUT/summary.txt"

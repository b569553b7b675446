#!/usr/bin/env bash
# SFT training speed: the fast-numerics SFT command of the shipped default model
# (python/sglang_dsv41/assets/deepseek-v4.1-tiny/training.json) for a fixed number of steps, on this
# tree and optionally on another source tree (BASE: a directory holding that tree's python/ and
# sgl-kernel/), alternating ROUNDS times so the spread between runs of one tree is visible.
#
#   bash benchmark/sft_speed.sh [--base DIR] [--steps 200] [--rounds 2] [--results FILE.md]
#
# Prints one row per run (tree, round, steps/s as sft reports it: steps over training seconds) and,
# with --results, writes the table with date, device, versions and the command.
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
BASE="" STEPS=200 ROUNDS=2 RESULTS=""
while [ $# -gt 0 ]; do
  case "$1" in
    --base) BASE=$2; shift 2 ;; --steps) STEPS=$2; shift 2 ;; --rounds) ROUNDS=$2; shift 2 ;;
    --results) RESULTS=$2; shift 2 ;; *) echo "unknown argument $1" >&2; exit 2 ;;
  esac
done
TMP=$(mktemp -d)
OUTER_PYTHONPATH=${PYTHONPATH:-}
trees=("this:$ROOT")
[ -n "$BASE" ] && trees+=("base:$BASE")
rows=()
for round in $(seq 1 "$ROUNDS"); do
  for entry in "${trees[@]}"; do
    name=${entry%%:*} dir=${entry#*:}
    export PYTHONPATH="$dir/python:$dir/sgl-kernel${OUTER_PYTHONPATH:+:$OUTER_PYTHONPATH}"
    [ -d "$TMP/start-$name" ] || python -m sglang_dsv41.tiny --preset mini-digits --out "$TMP/start-$name" >/dev/null
    python -m sglang_dsv41.train.sft --model "$TMP/start-$name" --out "$TMP/out-$name-$round" --device cuda --fast \
      --cuda-graph --pad-to 26 --batch 1024 --lr 3e-3 --warmup 0.03 --levels 1:1,2:4 --steps "$STEPS" \
      --eval-n 50 --log-every 50 --bar-interval 60 > "$TMP/log-$name-$round" 2>&1 || { tail -20 "$TMP/log-$name-$round"; exit 1; }
    sps=$(python -c "import json,sys; print(json.load(open(sys.argv[1]))['steps_per_second'])" "$TMP/out-$name-$round/training.json")
    rows+=("| $name | $round | $STEPS | $sps |")
    echo "$name round $round: $sps steps/s"
  done
done
table=$(printf '%s\n' "| tree | round | steps | steps/s |" "|---|---|---|---|" "${rows[@]}")
echo "$table"
if [ -n "$RESULTS" ]; then
  dev=$(python -c "import torch; print(torch.cuda.get_device_name())")
  ver=$(python -c "import torch, triton; print(f'torch {torch.__version__}, triton {triton.__version__}')")
  commit=$(git -C "$ROOT" rev-parse --short HEAD 2>/dev/null || echo unknown)
  { echo "# SFT training speed (fast numerics, CUDA graph), $(date -u +%F)"; echo
    echo "- command: \`bash benchmark/sft_speed.sh ${BASE:+--base $BASE }--steps $STEPS --rounds $ROUNDS\`"
    echo "- device: $dev; $ver; this tree at commit $commit${BASE:+; base tree: $BASE}"
    echo "- SFT flags (training.json's, --steps $STEPS instead of the time limit): --fast --cuda-graph --pad-to 26 --batch 1024 --lr 3e-3 --warmup 0.03 --levels 1:1,2:4"
    echo; echo "$table"; } > "$RESULTS"
  echo "wrote $RESULTS"
fi

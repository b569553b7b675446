#!/usr/bin/env bash
# RL (GRPO/DAPO) on rollouts from a real SGLang server on the CPU: launch the server, run
# `python -m sglang_dsv41.train.rl` for STEPS steps, write the reward/mismatch PNG and the results
# table into benchmark/results/, stop the server.
#
#   benchmark/rl_run.sh                       # 80 steps on the embedded default deepseek-v4.1-tiny
#   STEPS=3 MODEL=deepseek-v4.1-mini-random benchmark/rl_run.sh    # a quick check of the whole path
#
# Settings (environment, defaults in brackets): MODEL [deepseek-v4.1-tiny], STEPS [80],
# FAMILY [10-99,2-9,*] (train.rl --family: two-digit times one-digit), UNSEEN_LEVEL [2] (only the
# family's problems in level 2's test split, which the default's SFT data never held; empty: all) and
# HELDOUT_PERCENT [50] (the family's held-out share); rollouts from the family's train split, greedy
# evaluation on its held-out split; FAMILY empty: use LEVEL,
# LEVEL [2] and EVAL_LEVEL [2] (task levels, when FAMILY is empty), EVAL_N [100] (held-out greedy accuracy),
# EVAL_EVERY [10], PROMPTS [8] groups per step, N [8] samples per group, MAX_NEW [16] tokens, LR [1e-4],
# TEMPERATURE [1.0] sampling temperature (the loss trains the tempered policy),
# ROUNDS [3] dynamic-sampling rounds, R3 [0] (1: routing replay), SEED [0], PORT [30000],
# THREADS [1] torch threads of the server (OMP_NUM_THREADS) and of the trainer (--threads),
# OUT [rl_out/<date>-cpu-rl] (rl.jsonl, rl.png, server.log, weight-sync files),
# RESULTS [benchmark/results/<date>-cpu-rl] (.md table, .png curve).
#
# The server and the trainer run with the same torch thread count: on the CPU the forward's last bits
# depend on it, and train.rl checks at start that it reproduces the server's logprobs exactly
# (docs/rl.md). Why the family: the trained default answers its own level-2 train problems at temperature
# 1 without a miss (reward 1.0 on 192 samples: no group is informative) and level 3 never (reward 0);
# on the level-2 multiplications it was never trained on it is right about 38 % of the time greedily,
# with wrong answers that are near misses: groups of samples disagree, which the policy gradient needs.
# One thread each by default: SGLang's scheduler polls while idle and keeps a core busy,
# so on a 2-core machine a 2-thread trainer would share its cores with it.
set -euo pipefail
cd "$(dirname "$0")/.."

DATE=$(date -u +%Y-%m-%d)
MODEL=${MODEL:-deepseek-v4.1-tiny}
STEPS=${STEPS:-80}
FAMILY=${FAMILY-10-99,2-9,*}
UNSEEN_LEVEL=${UNSEEN_LEVEL-2}
HELDOUT_PERCENT=${HELDOUT_PERCENT:-50}
LEVEL=${LEVEL:-2}
EVAL_LEVEL=${EVAL_LEVEL:-2}
EVAL_N=${EVAL_N:-100}
EVAL_EVERY=${EVAL_EVERY:-10}
PROMPTS=${PROMPTS:-8}
N=${N:-8}
MAX_NEW=${MAX_NEW:-16}
LR=${LR:-1e-4}
TEMPERATURE=${TEMPERATURE:-1.0}
ROUNDS=${ROUNDS:-3}
R3=${R3:-0}
SEED=${SEED:-0}
THREADS=${THREADS:-1}
PORT=${PORT:-30000}
OUT=${OUT:-rl_out/${DATE}-cpu-rl}
RESULTS=${RESULTS:-benchmark/results/${DATE}-cpu-rl}

export ATEN_CPU_CAPABILITY=default
# The server's one RL flag sets deterministic numerics, raw logprobs, routed experts, full prefill and
# MKL's one code path (docs/rl.md); the trainer checks them at start and needs MKL's path exported too.
export MKL_CBWR=COMPATIBLE
mkdir -p "$OUT" "$(dirname "$RESULTS")"

OMP_NUM_THREADS=$THREADS setsid python -m sglang.launch_server --model "$MODEL" --host 127.0.0.1 \
    --port "$PORT" --rl-on-policy-target sglang_dsv41 >"$OUT/server.log" 2>&1 &
SERVER=$!
trap 'kill -TERM -- -$SERVER 2>/dev/null || true; sleep 3; kill -KILL -- -$SERVER 2>/dev/null || true' EXIT

URL=http://127.0.0.1:$PORT
for _ in $(seq 600); do
    if curl -sf -o /dev/null "$URL/health"; then break; fi
    if ! kill -0 "$SERVER" 2>/dev/null; then echo "server exited; see $OUT/server.log" >&2; tail -20 "$OUT/server.log" >&2; exit 1; fi
    sleep 1
done
curl -sf -o /dev/null "$URL/health" || { echo "server not healthy after 600 s; see $OUT/server.log" >&2; exit 1; }

EXTRA=()
[ "$R3" = 1 ] && EXTRA+=(--r3)
[ -n "$FAMILY" ] && EXTRA+=(--family "$FAMILY" --family-heldout-percent "$HELDOUT_PERCENT")
[ -n "$FAMILY" ] && [ -n "$UNSEEN_LEVEL" ] && EXTRA+=(--family-unseen-level "$UNSEEN_LEVEL")
python -m sglang_dsv41.train.rl --server "$URL" --model "$MODEL" --steps "$STEPS" --level "$LEVEL" \
    --eval-level "$EVAL_LEVEL" --eval-n "$EVAL_N" --eval-every "$EVAL_EVERY" --prompts "$PROMPTS" --n "$N" \
    --max-new-tokens "$MAX_NEW" --temperature "$TEMPERATURE" --lr "$LR" --max-rounds "$ROUNDS" --seed "$SEED" --threads "$THREADS" --out "$OUT" \
    --results "$RESULTS.md" "${EXTRA[@]}"
cp "$OUT/rl.png" "$RESULTS.png"
echo "wrote $RESULTS.md, $RESULTS.png (per-step log: $OUT/rl.jsonl)"

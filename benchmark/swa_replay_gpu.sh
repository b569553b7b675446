#!/bin/bash
# SWA bounded replay on one CUDA machine: decoder-replay prefill speed (release preset, 8 x 8K),
# prefix-hit TTFT (8K cached + 256 new, window KV per token slot vs request rings), and quality
# (small preset at 512/2K/8K, release preset at 512/2K). Tables go to LOGDIR/results.
#   bash benchmark/swa_replay_gpu.sh LOGDIR
set -o pipefail
dir=${1:?usage: benchmark/swa_replay_gpu.sh LOGDIR}
R=$dir/results
mkdir -p "$R"
export PYTHONUNBUFFERED=1
cd "$(dirname "$0")/.."
{
  nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
  python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__)"
} | tee "$dir/device.txt"
timeout 200 python3 benchmark/swa_replay.py speed --preset release --prompts 8 --prompt-len 8192 --results-dir "$R" 2>&1 | tail -8
timeout 90 python3 benchmark/swa_replay.py ttft --preset release --cached 8192 --new 256 --results-dir "$R" 2>&1 | tail -8
timeout 150 python3 benchmark/swa_replay.py quality --preset small --lens 512,2048,8192 --prompts 2 --gen 64 \
  --results-dir "$R" 2>&1 | tail -10
timeout 120 python3 benchmark/swa_replay.py quality --preset release --lens 512,2048 --prompts 1 --gen 64 \
  --results-dir "$R" 2>&1 | tail -8
ls -la "$R"

"""Compare greedy tokens generated on another device with this machine's reference forward.

    python benchmark/compare_greedy.py --model DIR --tokens gpu_tokens.json --prompts 8 --prompt-len 256 [--seed 0]

For every prompt the reference (CPU, teacher-forced on the other device's tokens) says at each step
whether that token is its own argmax, and if not, how far below the max its logit is (the decision
margin). Free-running greedy decoding of a random quantized model diverges across devices at
near-ties (guides/numerics.md); a mismatch at a wide margin would be a bug.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT / "python"), str(ROOT / "sgl-kernel")]

from sglang_dsv41.checkpoint.loader import load_model  # noqa: E402
from sglang_dsv41.reference.model import ReferenceModel  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", required=True)
    ap.add_argument("--tokens", required=True)
    ap.add_argument("--prompts", type=int, default=8)
    ap.add_argument("--prompt-len", type=int, default=256)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--cpu-tokens", help="tokens json from a CPU driver run, for free-running agreement")
    a = ap.parse_args()
    model = load_model(a.model, progress=False)
    ref = ReferenceModel(model)
    g = torch.Generator().manual_seed(a.seed)
    prompts = torch.randint(3, model.cfg.vocab_size, (a.prompts, a.prompt_len), generator=g).tolist()
    other = json.loads(Path(a.tokens).read_text())["tokens"]
    cpu = json.loads(Path(a.cpu_tokens).read_text())["tokens"] if a.cpu_tokens else None
    print("| prompt | steps | argmax agree (teacher-forced) | worst margin of a disagreement | free-running: first divergence |")
    print("|---|---|---|---|---|")
    for i, (p, toks) in enumerate(zip(prompts, other)):
        logits = ref.forward(torch.tensor(p + toks[:-1])).logits[len(p) - 1 :]
        best = logits.max(-1).values
        chosen = logits.gather(1, torch.tensor(toks).unsqueeze(1)).squeeze(1)
        agree = int((chosen == best).sum())
        worst = float((best - chosen).max())
        div = "-"
        if cpu is not None:
            div = next((str(j) for j, (x, y) in enumerate(zip(toks, cpu[i])) if x != y), "none")
        print(f"| {i} | {len(toks)} | {agree}/{len(toks)} | {worst:.4f} | {div} |")


if __name__ == "__main__":
    main()

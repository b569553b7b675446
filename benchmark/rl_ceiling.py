"""The supervised ceiling of an RL family: what fitting the training side does to the held-out side.

    python benchmark/rl_ceiling.py [--model deepseek-v4.1-tiny] [--steps 30] [--batch 32] [--lr 3e-4]
        [--out benchmark/results/DATE-cpu-rl-ceiling.md]

A policy gradient toward exact-match reward can at best make the policy emit the right answers of the
problems it is trained on: the cross-entropy on those answers is the same direction with the best
possible signal (every answer given, none sampled). So this script trains the trainable model
(train/trainable.py, the exact QAT forward, AdamW) by plain cross-entropy on a family's training pool
and measures greedy accuracy on its held-out split every `--eval-every` steps. If the held-out
accuracy does not rise when every training answer is handed over, an RL run on the same pool has
nothing general to find either: the limit is the model's generalization, not the RL loop.

Probes (each from the starting checkpoint; held-out accuracy is teacher-forced greedy, which equals
greedy decoding's exact match, train/sft.py):
  unseen-train     `10-99,2-9,*` restricted to level 2's test split (never in the SFT data), 50 % held
                   out: train on the other half (the pool `benchmark/rl_run.sh` samples from);
  unseen+seen      the same held-out problems; train on every other problem of the family, the ones
                   the SFT data held included;
  commuted         `2-9,10-99,*` (one-digit times two-digit, an operand order the SFT data never
                   showed), 50 % held out: train on the other half.
"""

from __future__ import annotations

import argparse
import os
import platform
import sys
import time
from pathlib import Path

import numpy as np
import torch

from sglang_dsv41.embedded import resolve_model_path
from sglang_dsv41.train import sft, task
from sglang_dsv41.train.rl import Family
from sglang_dsv41.train.trainable import load_trainable, trainable_parameters

PROBES = {
    "unseen-train": ("10-99,2-9,*", 2, False),
    "unseen+seen": ("10-99,2-9,*", 2, True),
    "commuted": ("2-9,10-99,*", None, False),
}
"""name -> (family, unseen level, train on the family's SFT-seen problems too)."""


def pools(spec: str, unseen_level: int | None, with_seen: bool, heldout_percent: int) -> tuple[list, list]:
    """-> (training problems, held-out problems) of a probe."""
    fam = Family.parse(spec, unseen_level, heldout_percent)
    train, held = fam.pool("train"), fam.pool("test")
    if with_seen:
        everything = Family.parse(spec, None, heldout_percent)
        keep = {(p.a, p.op, p.b) for p in held}
        train = [p for p in everything.pool("train") + everything.pool("test") if (p.a, p.op, p.b) not in keep]
    return train, held


def accuracy(model, renderer: task.ChatRenderer, probs: list[task.Problem], batch: int = 128) -> float:
    model.eval()
    right: list[bool] = []
    with torch.no_grad():
        for s in range(0, len(probs), batch):
            ids, mask, t = sft.collate([renderer.example(p.question, p.completion) for p in probs[s: s + batch]], "cpu")
            right += sft.batch_loss(model, ids, mask, t)[1].tolist()
    return sum(right) / len(right)


def probe(model_dir: str, name: str, a: argparse.Namespace) -> dict:
    spec, unseen, with_seen = PROBES[name]
    train, held = pools(spec, unseen, with_seen, a.heldout_percent)
    torch.manual_seed(a.seed)
    model = load_trainable(model_dir, device="cpu")
    renderer = task.ChatRenderer(model_dir)
    params = [p for _, p in trainable_parameters(model)]
    opt = torch.optim.AdamW(params, lr=a.lr, betas=(0.9, 0.99), weight_decay=0.0)
    rng = np.random.default_rng(a.seed)
    curve = [(0, None, accuracy(model, renderer, train[: a.train_eval_n]), accuracy(model, renderer, held))]
    print(f"{name}: {len(train)} train / {len(held)} held-out problems; step 0 held-out {curve[0][3]:.3f}", flush=True)
    t0 = time.perf_counter()
    for step in range(1, a.steps + 1):
        model.train()
        batch = [train[i] for i in rng.integers(0, len(train), a.batch)]
        ids, mask, t = sft.collate([renderer.example(p.question, p.completion) for p in batch], "cpu")
        loss, _ = sft.batch_loss(model, ids, mask, t)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        opt.step()
        if step % a.eval_every == 0 or step == a.steps:
            row = (step, loss.item(), accuracy(model, renderer, train[: a.train_eval_n]), accuracy(model, renderer, held))
            curve.append(row)
            print(f"{name}: step {step} loss {row[1]:.4f} train {row[2]:.3f} held-out {row[3]:.3f} "
                  f"({time.perf_counter() - t0:.0f} s)", flush=True)
    return {"name": name, "family": spec, "unseen": unseen, "with_seen": with_seen, "train_n": len(train),
            "held_n": len(held), "curve": curve, "seconds": time.perf_counter() - t0}


def write(path: Path, a: argparse.Namespace, results: list[dict]) -> None:
    lines = [f"# Supervised ceiling of the RL families, {time.strftime('%Y-%m-%d')}", "",
             f"- command: `python benchmark/rl_ceiling.py {' '.join(sys.argv[1:])}`",
             f"- device: cpu, {platform.processor() or platform.machine()}, {os.cpu_count()} CPU cores, "
             f"{torch.get_num_threads()} torch threads; torch {torch.__version__}; task generator v{task.GENERATOR_VERSION}",
             f"- model {a.model}; per probe: {a.steps} AdamW steps of {a.batch} problems (cross-entropy on the answer "
             f"tokens, lr {a.lr}), from the starting checkpoint; accuracy = greedy exact match (teacher-forced argmax)",
             f"- train accuracy over the first {a.train_eval_n} training problems", "",
             "| probe | family | train / held-out problems | held-out at step 0 | held-out best | held-out at the end "
             "| train at the end | s |", "|---|---|---|---|---|---|---|---|"]
    for r in results:
        c = r["curve"]
        fam = r["family"] + (f", level {r['unseen']} unseen only" if r["unseen"] else "")
        fam += " + the SFT-seen problems in training" if r["with_seen"] else ""
        lines.append(f"| {r['name']} | {fam} | {r['train_n']} / {r['held_n']} | {c[0][3]:.3f} | "
                     f"{max(x[3] for x in c[1:]):.3f} | {c[-1][3]:.3f} | {c[-1][2]:.3f} | {r['seconds']:.0f} |")
    lines += ["", "Per evaluation:", "", "| probe | step | loss | train | held-out |", "|---|---|---|---|---|"]
    for r in results:
        lines += [f"| {r['name']} | {s} | {'-' if loss is None else f'{loss:.4f}'} | {tr:.3f} | {h:.3f} |"
                  for s, loss, tr, h in r["curve"]]
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("\n".join(lines) + "\n")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--model", default="deepseek-v4.1-tiny")
    p.add_argument("--probes", default=",".join(PROBES), help=f"comma-separated, from {', '.join(PROBES)}")
    p.add_argument("--steps", type=int, default=30)
    p.add_argument("--batch", type=int, default=32)
    p.add_argument("--lr", type=float, default=3e-4)
    p.add_argument("--eval-every", type=int, default=5)
    p.add_argument("--train-eval-n", type=int, default=100)
    p.add_argument("--heldout-percent", type=int, default=50)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--out", default=f"benchmark/results/{time.strftime('%Y-%m-%d')}-cpu-rl-ceiling.md")
    a = p.parse_args()
    names = a.probes.split(",")
    if set(names) - set(PROBES):
        p.error(f"--probes: unknown {sorted(set(names) - set(PROBES))}; choose from {', '.join(PROBES)}")
    if min(a.steps, a.batch, a.eval_every, a.train_eval_n, a.threads) < 1:
        p.error("--steps, --batch, --eval-every, --train-eval-n and --threads must be >= 1")
    torch.set_num_threads(a.threads)
    model_dir = str(resolve_model_path(a.model))
    results = [probe(model_dir, n, a) for n in names]
    write(Path(a.out), a, results)
    print(f"wrote {a.out}")


if __name__ == "__main__":
    main()

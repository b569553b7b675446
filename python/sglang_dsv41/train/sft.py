"""Supervised training (QAT) on the arithmetic task, then export in the released layout.

    python -m sglang_dsv41.train.sft --model deepseek-v4.1-mini-random --out DIR \\
        [--steps 400] [--batch 32] [--lr 3e-3] [--levels 1:1,2:3] [--eval-level 2] [--eval-n 200]

Each step draws `batch` train-split problems (task.py; level weights from `--levels`), renders
prompt + target ids exactly as the server renders the chat request (ChatRenderer), right-pads them to
one even length and runs THE forward once over a `BatchDenseKV` with the QAT trainable model
(serving roundings with straight-through gradients). Loss: mean cross-entropy over the target tokens
(answer text and end-of-sentence). AdamW, linear warm-up then cosine decay over the steps or the
`--max-minutes` budget, gradient clipping.

Evaluation (`heldout_accuracy`): held-out (test-split) problems, greedy exact match, computed with
teacher forcing: greedy decoding produces the target ids exactly iff the argmax at every target
position is the target token, so one batched forward scores a whole set (the reward can only be
higher: another spelling of the right boxed number would also count). The exported directory gets
`training.json` (command, steps, time, accuracies, generator versions).

Data parallel: `torchrun --nproc-per-node K -m sglang_dsv41.train.sft ...` (gloo on CPU, NCCL with
`--device cuda`): every rank draws the same global batch, trains on its slice under DDP (train/ddp.py;
the loss is normalised by the global target count), and rank 0 evaluates and exports.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F
from tqdm import tqdm

from sglang_dsv41.layers.transformer import DeepseekV41
from sglang_dsv41.tokenizer.tiny_tokenizer import PAD_TOKEN_ID
from sglang_dsv41.train import ddp, task
from sglang_dsv41.train.batch_kv import BatchDenseKV
from sglang_dsv41.train.export import export_checkpoint
from sglang_dsv41.train.trainable import load_trainable, trainable_parameters


def collate(examples: list[tuple[list[int], list[int]]], device) -> tuple[torch.Tensor, torch.Tensor, int]:
    """[(prompt, target)] -> (ids int64 [B*T], target mask bool [B*T] (True where the row's token is a
    target), T). T = longest prompt + target, rounded up to even; padding is PAD_TOKEN_ID."""
    t = max(len(p) + len(y) for p, y in examples)
    t += t % 2
    ids = torch.full((len(examples), t), PAD_TOKEN_ID, dtype=torch.int64)
    mask = torch.zeros(len(examples), t, dtype=torch.bool)
    for i, (p, y) in enumerate(examples):
        ids[i, : len(p) + len(y)] = torch.tensor(p + y)
        mask[i, len(p): len(p) + len(y)] = True
    return ids.flatten().to(device), mask.flatten().to(device), t


def batch_logits(model: DeepseekV41, ids: torch.Tensor, t: int, forward=None) -> torch.Tensor:
    """ids [B*T] -> fp32 logits [B, T, vocab] (THE forward over a BatchDenseKV). `forward` calls the
    model (e.g. its DDP wrapper); default the model itself."""
    b = ids.numel() // t
    return (forward or model)(ids, BatchDenseKV(model.cfg, b, t, ids.device)).logits.view(b, t, -1)


def batch_ce(model: DeepseekV41, ids: torch.Tensor, mask: torch.Tensor, t: int, forward=None):
    """-> (summed target cross-entropy, target count, per-sequence all-targets-argmax-correct bool [B])."""
    logits = batch_logits(model, ids, t, forward)
    b = logits.size(0)
    ids2, mask2 = ids.view(b, t), mask.view(b, t)
    pred_logits, targets, tmask = logits[:, :-1], ids2[:, 1:], mask2[:, 1:]
    ce = F.cross_entropy(pred_logits.flatten(0, 1), targets.flatten(), reduction="none").view(b, t - 1)
    right = ((pred_logits.argmax(-1) == targets) | ~tmask).all(dim=1)
    return (ce * tmask).sum(), tmask.sum(), right


def batch_loss(model: DeepseekV41, ids: torch.Tensor, mask: torch.Tensor, t: int) -> tuple[torch.Tensor, torch.Tensor]:
    """-> (mean target cross-entropy, per-sequence all-targets-argmax-correct bool [B])."""
    total, n, right = batch_ce(model, ids, mask, t)
    return total / n, right


@torch.no_grad()
def heldout_accuracy(model: DeepseekV41, renderer: task.ChatRenderer, level: int, n: int, seed: int = 0,
                     batch: int = 50) -> dict[str, float]:
    """Greedy exact-match accuracy on n test-split problems of `level`, overall and per operator."""
    probs = task.problems(level, n, "test", seed)
    right: list[bool] = []
    for s in range(0, n, batch):
        chunk = probs[s: s + batch]
        ids, mask, t = collate([renderer.example(p.question, p.completion) for p in chunk], model.embed.weight.device)
        right += batch_loss(model, ids, mask, t)[1].tolist()
    out = {"all": sum(right) / len(right)}
    for op in task.OPS:
        sel = [r for p, r in zip(probs, right) if p.op == op]
        out[op] = sum(sel) / max(1, len(sel))
    return out


def parse_levels(spec: str) -> dict[int, float]:
    out = {}
    for part in spec.split(","):
        level, _, w = part.partition(":")
        out[int(level)] = float(w or 1)
    return out


def train(args: argparse.Namespace) -> dict | None:
    """Single process, or one rank of a `torchrun` launch (WORLD_SIZE > 1: DDP, each rank runs its
    slice of every global batch; rank 0 evaluates and exports)."""
    torch.manual_seed(args.seed)
    if args.threads:
        torch.set_num_threads(args.threads)
    rank, world = 0, int(os.environ.get("WORLD_SIZE", "1"))
    if world > 1:
        rank, world = ddp.init()
        if str(args.device).startswith("cuda"):
            args.device = f"cuda:{int(os.environ.get('LOCAL_RANK', rank))}"
            torch.cuda.set_device(args.device)
    model = load_trainable(args.model, device=args.device)
    forward = ddp.wrap(model, torch.device(args.device)) if world > 1 else model
    renderer = task.ChatRenderer(args.model)
    params = [p for _, p in trainable_parameters(model)]
    opt = torch.optim.AdamW(params, lr=args.lr, betas=(0.9, 0.95), weight_decay=0.0)
    budget = 60 * args.max_minutes

    def lr_at(step: int, elapsed: float) -> float:
        """Linear warm-up over 5% of the run, then cosine to 10%; progress is steps or time, whichever
        is further along (so a time-bounded run still ends decayed)."""
        progress = max(step / args.steps, elapsed / budget if budget else 0.0)
        warm = min(1.0, progress / 0.05) if progress < 0.05 else 1.0
        return args.lr * max(warm, 1e-3) * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * min(1.0, progress))))

    levels = parse_levels(args.levels)
    total = sum(levels.values())
    counts = {lv: max(1, round(args.batch * w / total)) for lv, w in levels.items()}
    t0 = time.perf_counter()
    bar = tqdm(range(args.steps), desc="sft", unit="step", file=sys.stderr, mininterval=args.bar_interval, disable=rank > 0)
    ema = None
    done = 0
    for step in bar:
        elapsed = time.perf_counter() - t0
        if budget and elapsed > budget:
            break
        for group in opt.param_groups:
            group["lr"] = lr_at(step, elapsed)
        probs = [p for lv, c in counts.items() for p in task.problems(lv, c, "train", seed=args.seed * 1_000_003 + step)]
        probs = ddp.shard(probs, rank, world) if world > 1 else probs
        ids, mask, t = collate([renderer.example(p.question, p.completion) for p in probs], args.device)
        total, n, right = batch_ce(model, ids, mask, t, forward)
        loss = total / n if world == 1 else total * world / ddp.global_count(n).to(total.device)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
        acc = right.float().mean().item()
        ema = (loss.item(), acc) if ema is None else (0.9 * ema[0] + 0.1 * loss.item(), 0.9 * ema[1] + 0.1 * acc)
        bar.set_postfix(loss=f"{ema[0]:.3f}", exact=f"{ema[1]:.2f}", lr=f"{opt.param_groups[0]['lr']:.1e}")
        done = step + 1
    train_s = time.perf_counter() - t0
    if world > 1:
        torch.distributed.destroy_process_group()
        if rank > 0:
            return None
    model.eval()
    acc = heldout_accuracy(model, renderer, args.eval_level, args.eval_n)
    out = export_checkpoint(model, args.out, args.model)
    from sglang_dsv41.tiny import GENERATOR_VERSION as TINY_VERSION

    summary = {
        "command": "python -m sglang_dsv41.train.sft " + " ".join(sys.argv[1:] if args.argv is None else args.argv),
        "source_model": str(args.model), "steps": done, "planned_steps": args.steps, "batch": args.batch, "lr": args.lr,
        "levels": args.levels, "seed": args.seed, "train_seconds": round(train_s, 1),
        "heldout": {"level": args.eval_level, "n": args.eval_n, "greedy_exact_match": acc},
        "task_generator_version": task.GENERATOR_VERSION, "tiny_generator_version": TINY_VERSION,
        "device": str(args.device), "processes": world, "torch": torch.__version__,
    }
    (Path(out) / "training.json").write_text(json.dumps(summary, indent=2) + "\n")
    return summary


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description="Supervised QAT training on the arithmetic task, exported in the released layout.")
    ap.add_argument("--model", default="deepseek-v4.1-mini-random", help="checkpoint dir or embedded alias to start from")
    ap.add_argument("--out", required=True, help="output checkpoint directory")
    ap.add_argument("--steps", type=int, default=400)
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--lr", type=float, default=3e-3)
    ap.add_argument("--levels", default="1:1,2:3", help="training levels with weights, e.g. 1:1,2:3")
    ap.add_argument("--eval-level", type=int, default=2)
    ap.add_argument("--eval-n", type=int, default=200)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--threads", type=int, default=0, help="torch CPU threads (0: torch's default)")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--bar-interval", type=float, default=0.1, help="seconds between progress bar updates")
    ap.add_argument("--max-minutes", type=float, default=0, help="stop training after this long (then evaluate and export)")
    args = ap.parse_args(argv)
    args.argv = argv
    if args.steps < 1 or args.batch < 1:
        ap.error("--steps and --batch must be >= 1")
    summary = train(args)
    if summary is not None:
        print(json.dumps(summary))


if __name__ == "__main__":
    main()

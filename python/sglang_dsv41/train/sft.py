"""Supervised training (QAT) on the arithmetic task, then export in the released layout.

    python -m sglang_dsv41.train.sft --model deepseek-v4.1-mini-random --out DIR \\
        [--steps 400] [--batch 32] [--lr 3e-3] [--levels 1:1,2:3] [--eval-level 2] [--eval-n 200]
        [--fast] [--exact-steps N] [--pad-to T] [--cuda-graph] [--max-minutes M]

`--fast` trains under the fast numerics policy (`NumericsPolicy.train(fast=True)`, sglang_dsv41/numerics.py:
the same parameters and the same weight / activation / KV roundings with straight-through
gradients, plain batched GEMMs, reductions and attention), then `--exact-steps` steps under
`NumericsPolicy.train()` (the serving numerics) at the final learning rate; held-out accuracy is reported in both numerics and the exported checkpoint is what
the exact forward computes. `--pad-to T` pads every batch to T tokens (one shape for the whole
run); with `--cuda-graph` (CUDA, fast, single process) the whole step is captured once and replayed
(graphed_step.py), and the run falls back to eager steps if the capture fails.

Each step draws `batch` train-split problems (task.py; level weights from `--levels`), renders
prompt + target ids exactly as the server renders the chat request (ChatRenderer), right-pads them to
one even length and runs THE forward once over a batch `DenseKV` with the QAT trainable model
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

import numpy as np
import torch
import torch.nn.functional as F
from tqdm import tqdm

from sglang_dsv41.layers.transformer import DeepseekV41
from sglang_dsv41.tokenizer.tiny_tokenizer import PAD_TOKEN_ID
from sglang_dsv41.train import ddp, task
from sglang_dsv41.numerics import NumericsPolicy, apply_numerics
from sglang_dsv41.reference.dense_kv import DenseKV
from sglang_dsv41.train.export import export_checkpoint
from sglang_dsv41.train.trainable import load_trainable, trainable_parameters


def collate(examples: list[tuple[list[int], list[int]]], device, pad_to: int = 0) -> tuple[torch.Tensor, torch.Tensor, int]:
    """[(prompt, target)] -> (ids int64 [B*T], target mask bool [B*T] (True where the row's token is a
    target), T). T = longest prompt + target rounded up to even, or `pad_to` (an error if shorter);
    padding is PAD_TOKEN_ID."""
    t = max(len(p) + len(y) for p, y in examples)
    t += t % 2
    if pad_to:
        if t > pad_to:
            raise ValueError(f"an example has {t} tokens, more than --pad-to {pad_to}")
        t = pad_to
    ids = np.full((len(examples), t), PAD_TOKEN_ID, dtype=np.int64)
    mask = np.zeros((len(examples), t), dtype=bool)
    for i, (p, y) in enumerate(examples):
        ids[i, : len(p) + len(y)] = p + y
        mask[i, len(p): len(p) + len(y)] = True
    return torch.from_numpy(ids).flatten().to(device), torch.from_numpy(mask).flatten().to(device), t


def make_kv(model: DeepseekV41, b: int, t: int, device, engram_ids: torch.Tensor | None = None) -> DenseKV:
    """The batch KV of B sequences of length t (its attention formulation is the model's policy)."""
    return DenseKV(model.cfg, t, device, batch=b, engram_ids=engram_ids)


def batch_logits(model: DeepseekV41, ids: torch.Tensor, t: int, forward=None, engram_ids=None) -> torch.Tensor:
    """ids [B*T] -> fp32 logits [B, T, vocab] (THE forward over a batch KV). `forward` calls the
    model (e.g. its DDP wrapper); default the model itself."""
    b = ids.numel() // t
    return (forward or model)(ids, make_kv(model, b, t, ids.device, engram_ids)).logits.view(b, t, -1)


def batch_ce(model: DeepseekV41, ids: torch.Tensor, mask: torch.Tensor, t: int, forward=None, engram_ids=None):
    """-> (summed target cross-entropy, target count, per-sequence all-targets-argmax-correct bool [B])."""
    logits = batch_logits(model, ids, t, forward, engram_ids)
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
    """Greedy exact-match accuracy on n test-split problems of `level`, overall and per operator
    (in the model's current numerics)."""
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


class Batches:
    """Train-split batches: `batch` problems per step (level weights), rendered once per distinct
    problem (the renderer is the server's chat encoding), collated to [B*T]."""

    def __init__(self, renderer: task.ChatRenderer, levels: dict[int, float], batch: int, seed: int, pad_to: int):
        total = sum(levels.values())
        self.counts = {lv: max(1, round(batch * w / total)) for lv, w in levels.items()}
        self.renderer, self.seed, self.pad_to = renderer, seed, pad_to
        self._cache: dict[task.Problem, tuple[list[int], list[int]]] = {}

    def problems(self, step: int) -> list[task.Problem]:
        return [p for lv, c in self.counts.items() for p in task.problems(lv, c, "train", seed=self.seed * 1_000_003 + step)]

    def collate(self, probs: list[task.Problem], device):
        ex = []
        for p in probs:
            if p not in self._cache:
                self._cache[p] = self.renderer.example(p.question, p.completion)
            ex.append(self._cache[p])
        return collate(ex, device, self.pad_to)


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
    log = (lambda msg: print(msg, file=sys.stderr, flush=True)) if rank == 0 else (lambda msg: None)
    model = load_trainable(args.model, device=args.device)
    apply_numerics(model, NumericsPolicy.train(fast=args.fast))  # CUDA: RoPE rows from device tables
    forward = ddp.wrap(model, torch.device(args.device)) if world > 1 else model
    renderer = task.ChatRenderer(args.model)
    params = [p for _, p in trainable_parameters(model)]
    graphed = args.cuda_graph and args.fast and world == 1 and str(args.device).startswith("cuda")
    if args.cuda_graph and not graphed:
        log("--cuda-graph needs --fast, --device cuda and one process: running eager steps")
    lr0 = torch.tensor(args.lr, device=args.device) if graphed else args.lr
    opt = torch.optim.AdamW(params, lr=lr0, betas=(0.9, 0.95), weight_decay=0.0, capturable=graphed)
    budget = 60 * args.max_minutes

    def lr_at(step: int, elapsed: float) -> float:
        """Linear warm-up over `--warmup` of the run, then cosine to 10%; progress is steps or time,
        whichever is further along (so a time-bounded run still ends decayed)."""
        progress = max(step / args.steps, elapsed / budget if budget else 0.0)
        warm = min(1.0, progress / args.warmup) if args.warmup > 0 else 1.0
        return args.lr * max(warm, 1e-3) * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * min(1.0, progress))))

    def set_lr(value: float) -> None:
        for group in opt.param_groups:
            if torch.is_tensor(group["lr"]):
                group["lr"].fill_(value)
            else:
                group["lr"] = value

    data = Batches(renderer, parse_levels(args.levels), args.batch, args.seed, args.pad_to)
    hasher = model.hasher

    def engram_of(ids: torch.Tensor, t: int) -> torch.Tensor | None:
        return hasher.hash_packed(ids, [t] * (ids.numel() // t)) if hasher is not None else None

    def loss_fn(ids, mask, engram):  # the graphed step's loss: one fixed shape [batch, pad_to]
        return batch_ce(model, ids, mask, args.pad_to, None, engram)

    t0 = time.perf_counter()
    bar = tqdm(range(args.steps), desc="sft", unit="step", file=sys.stderr, mininterval=args.bar_interval, disable=rank > 0)
    ema, done, history, runner = None, 0, [], None
    for step in bar:
        elapsed = time.perf_counter() - t0
        if budget and elapsed > budget:
            break
        set_lr(lr_at(step, elapsed))
        probs = data.problems(step)
        probs = ddp.shard(probs, rank, world) if world > 1 else probs
        ids, mask, t = data.collate(probs, args.device)
        if graphed and runner is None and args.pad_to:
            from sglang_dsv41.train.graphed_step import GraphedStep

            try:  # warm-up: this step's batch, three eager steps on a side stream, then the capture
                runner = GraphedStep(model, opt, params, len(probs), t, loss_fn)
                total, n, right = runner.warmup_and_capture([(ids, mask, engram_of(ids, t))] * 3)[-1]
                log(f"captured the training step as a CUDA graph ({time.perf_counter() - t0:.1f} s)")
            except Exception as exc:  # noqa: BLE001 - any capture failure: train eagerly instead
                log(f"CUDA graph capture failed ({type(exc).__name__}: {exc}); eager steps")
                graphed, runner = False, None
                opt.zero_grad(set_to_none=True)
                torch.cuda.synchronize()
                continue
        elif runner is not None:
            total, n, right = runner.step(ids, mask, engram_of(ids, t))
        else:
            total, n, right = batch_ce(model, ids, mask, t, forward)
            loss = total / n if world == 1 else total * world / ddp.global_count(n).to(total.device)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(params, 1.0)
            opt.step()
            opt.zero_grad(set_to_none=True)
        done = step + 1
        if step % args.log_every == 0 or done == args.steps:
            loss_v, acc = (total / n).item(), right.float().mean().item()
            ema = (loss_v, acc) if ema is None else (0.7 * ema[0] + 0.3 * loss_v, 0.7 * ema[1] + 0.3 * acc)
            bar.set_postfix(loss=f"{ema[0]:.3f}", exact=f"{ema[1]:.2f}", lr=f"{lr_at(step, elapsed):.1e}")
        if args.eval_every and rank == 0 and done % args.eval_every == 0:
            model.eval()
            acc = heldout_accuracy(model, renderer, args.eval_level, min(args.eval_n, 200))["all"]
            model.train()
            history.append({"step": done, "seconds": round(time.perf_counter() - t0, 1), "train_loss": round(ema[0], 4),
                            "heldout_level2": acc})
            log(f"step {done} {time.perf_counter() - t0:.0f}s loss {ema[0]:.4f} train-exact {ema[1]:.3f} held-out {acc:.3f}")
    train_s = time.perf_counter() - t0
    if world > 1:
        torch.distributed.destroy_process_group()
        if rank > 0:
            return None
    model.eval()
    acc_fast = heldout_accuracy(model, renderer, args.eval_level, args.eval_n) if args.fast else None
    exact_s, exact_done = 0.0, 0
    if args.fast:
        apply_numerics(model, NumericsPolicy.train())
        opt.zero_grad(set_to_none=True)
        model.train()
        t1 = time.perf_counter()
        set_lr(args.lr * args.exact_lr)
        for k in range(args.exact_steps):
            ids, mask, t = data.collate(data.problems(10**7 + k)[: args.exact_batch or None], args.device)
            total, n, right = batch_ce(model, ids, mask, t)
            (total / n).backward()
            torch.nn.utils.clip_grad_norm_(params, 1.0)
            opt.step()
            opt.zero_grad(set_to_none=True)
            exact_done += 1
            log(f"exact step {k + 1}/{args.exact_steps}: loss {(total / n).item():.4f} ({time.perf_counter() - t1:.1f} s)")
        exact_s = time.perf_counter() - t1
        model.eval()
    acc = heldout_accuracy(model, renderer, args.eval_level, args.eval_n)
    acc_l1 = heldout_accuracy(model, renderer, 1, min(args.eval_n, 100))
    out = export_checkpoint(model, args.out, args.model)
    from sglang_dsv41.tiny import GENERATOR_VERSION as TINY_VERSION

    summary = {
        "command": "python -m sglang_dsv41.train.sft " + " ".join(sys.argv[1:] if args.argv is None else args.argv),
        "source_model": str(args.model), "steps": done, "planned_steps": args.steps, "batch": args.batch, "lr": args.lr,
        "levels": args.levels, "seed": args.seed, "train_seconds": round(train_s, 1),
        "numerics": ("fast (NumericsPolicy.train(fast=True)) for the steps, then the exact QAT forward"
                     " (NumericsPolicy.train()) for exact_steps" if args.fast else "exact QAT forward (the serving numerics)"),
        "cuda_graph": bool(runner is not None), "exact_steps": exact_done, "exact_seconds": round(exact_s, 1),
        "steps_per_second": round(done / max(train_s, 1e-9), 3), "pad_to": args.pad_to,
        "heldout": {"level": args.eval_level, "n": args.eval_n, "greedy_exact_match": acc,
                    "greedy_exact_match_fast_numerics": acc_fast,
                    "level1_n": min(args.eval_n, 100), "level1_greedy_exact_match": acc_l1,
                    "criterion": "teacher-forced greedy: every target token is the argmax"},
        "history": history,
        "task_generator_version": task.GENERATOR_VERSION, "tiny_generator_version": TINY_VERSION,
        "device": str(args.device) + (f" ({torch.cuda.get_device_name()})" if str(args.device).startswith("cuda") else ""),
        "processes": world, "torch": torch.__version__,
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
    ap.add_argument("--warmup", type=float, default=0.05, help="fraction of the run with a linear learning-rate warm-up")
    ap.add_argument("--fast", action="store_true", help="train under the fast numerics policy, then --exact-steps exact steps")
    ap.add_argument("--exact-steps", type=int, default=0, help="exact QAT steps after a --fast run")
    ap.add_argument("--exact-batch", type=int, default=0, help="batch of the exact steps (0: --batch)")
    ap.add_argument("--exact-lr", type=float, default=0.1, help="learning rate of the exact steps, as a fraction of --lr")
    ap.add_argument("--pad-to", type=int, default=0, help="pad every batch to this many tokens (even; 0: per batch)")
    ap.add_argument("--cuda-graph", action="store_true", help="capture the fast step as a CUDA graph (needs --pad-to)")
    ap.add_argument("--eval-every", type=int, default=0, help="held-out accuracy (200 problems) every this many steps")
    ap.add_argument("--log-every", type=int, default=1, help="read the loss back every this many steps")
    args = ap.parse_args(argv)
    args.argv = argv
    if args.steps < 1 or args.batch < 1:
        ap.error("--steps and --batch must be >= 1")
    if args.pad_to % 2:
        ap.error("--pad-to must be even (a multiple of the compress ratio 2)")
    if args.cuda_graph and not args.pad_to:
        ap.error("--cuda-graph needs --pad-to (one batch shape)")
    summary = train(args)
    if summary is not None:
        print(json.dumps(summary))


if __name__ == "__main__":
    main()

"""Distil the DSpark drafter from its frozen backbone, then export the checkpoint with it.

    python -m sglang_dsv41.train.dspark --model deepseek-v4.1-tiny --out DIR [--stages 1] [--steps 1500]
        [--batch 64] [--lr 2e-3] [--levels 1:1,2:4] [--sequences 6000] [--eval-n 200] [--device cpu|cuda]

Data: train-split task problems (task.py, level weights `--levels`), rendered as the server renders
the chat request; the continuation of each prompt is the BACKBONE's own greedy output (the paged
driver, up to end-of-sentence), so the drafter learns to predict what the target will say. One
dense forward over every sequence records the drafter's input of every row (the stream means before
the target layers, `capture_draft`).

Training: the backbone (embedding and head included) is frozen; the DSpark stages are QAT-trainable
(`make_trainable(part="drafter")`: the serving roundings with straight-through gradients). A step
draws `--batch` sequences, makes every row a context row (`add_context` over a batch
`DenseDraftKV`), and drafts at every position whose anchor is a generated token; the Markov chain is
teacher-forced (step i's bias comes from the true token i), the loss is the cross-entropy of the
gamma step logits against the backbone's next gamma tokens (past the end: ignored). AdamW, cosine
decay, gradient clipping.

Evaluation: held-out (test-split) prompts through the paged runtime's speculative decoder
(runtime/speculative.py, greedy): mean accept length (committed tokens per verify, of gamma + 1)
and acceptance by draft position. The exported directory's `training.json` gets a "dspark" entry
(command, steps, time, losses, held-out acceptance); the backbone's bytes are unchanged.

If `--model` has no drafter, one with `--stages` stages (gamma 5, the last three layers as targets,
half the backbone's experts, Markov rank 32) is added with seeded random weights first.
"""

from __future__ import annotations

import argparse
import json
import math
import time
from pathlib import Path

import torch
import torch.nn.functional as F

from sglang_dsv41.checkpoint.loader import load_model
from sglang_dsv41.config import ModelConfig
from sglang_dsv41.embedded import resolve_model_path
from sglang_dsv41.layers.dspark import add_context, draft
from sglang_dsv41.reference.dense_draft_kv import DenseDraftKV
from sglang_dsv41.reference.dense_kv import DenseKV
from sglang_dsv41.tokenizer.tiny_tokenizer import PAD_TOKEN_ID
from sglang_dsv41.train import task
from sglang_dsv41.train.export import checkpoint_tensors, export_checkpoint
from sglang_dsv41.train.sft import parse_levels
from sglang_dsv41.train.trainable import make_trainable, trainable_parameters

IGNORE = -100


def with_drafter(source: str | Path, out: Path, stages: int, seed: int = 0) -> Path:
    """A copy of checkpoint `source` with a DSpark drafter of `stages` stages (seeded random
    weights) added to its config and tensors; the backbone's tensors are copied unchanged."""
    from sglang_dsv41.checkpoint.io import read_tensors, write_checkpoint
    from sglang_dsv41.tiny import random_tensors

    src = Path(resolve_model_path(source))
    raw = json.loads((src / "config.json").read_text())
    text = raw.get("text_config", raw)
    L, cfg0 = text["num_hidden_layers"], ModelConfig.from_hf(raw)
    text.update({
        "num_nextn_predict_layers": stages, "dspark_block_size": 5, "dspark_noise_token_id": cfg0.vocab_size - 2,
        "dspark_target_layer_ids": list(range(max(0, L - 3), L)), "dspark_markov_rank": 32,
        "dspark_n_routed_experts": max(1, cfg0.moe.n_routed_experts // 2),
        "dspark_num_experts_per_tok": max(1, cfg0.moe.n_activated_experts // 2),
        "compress_ratios": list(text["compress_ratios"][:L]) + [0] * stages,
    })
    cfg = ModelConfig.from_hf(raw)
    tensors = read_tensors(src, cfg0, progress=False)
    tensors.update({k: v for k, v in random_tensors(cfg, seed).items() if k.startswith("mtp.")})
    out.mkdir(parents=True, exist_ok=True)
    for f in src.iterdir():
        if f.is_file() and not f.name.endswith(".safetensors") and not f.name.endswith(".index.json"):
            (out / f.name).write_bytes(f.read_bytes())
    write_checkpoint(out, tensors, cfg)
    (out / "config.json").write_text(json.dumps(raw, indent=2) + "\n")
    return out


@torch.no_grad()
def greedy_sequences(model, prompts: list[list[int]], eos: int, max_new: int, device, batch: int = 256) -> list[list[int]]:
    """prompt + the backbone's greedy continuation (through end-of-sentence or max_new tokens)."""
    from sglang_dsv41.runtime.driver import Driver

    out = []
    for s in range(0, len(prompts), batch):
        chunk = prompts[s: s + batch]
        drv = Driver(model, sum(len(p) + max_new + 64 for p in chunk) + 64, len(chunk), page_size=64, device=device)
        new, _ = drv.generate(chunk, max_new)
        for p, n in zip(chunk, new):
            out.append(p + (n[: n.index(eos) + 1] if eos in n else n))
    return out


@torch.no_grad()
def drafter_inputs(model, seqs: list[list[int]], device, batch: int = 256) -> tuple[torch.Tensor, int]:
    """-> (bf16 [N, T, H * n_targets] drafter input of every row, T): one dense forward per batch of
    right-padded sequences (padding never changes a real row: causal attention)."""
    t = max(len(s) for s in seqs)
    t += t % 2
    hid = []
    for s in range(0, len(seqs), batch):
        chunk = seqs[s: s + batch]
        ids = torch.full((len(chunk), t), PAD_TOKEN_ID, dtype=torch.int64)
        for i, q in enumerate(chunk):
            ids[i, : len(q)] = torch.tensor(q)
        out = model(ids.flatten().to(device), DenseKV(model.cfg, t, device, batch=len(chunk)), capture_draft=True)
        hid.append(out.draft_hidden.view(len(chunk), t, -1))
    return torch.cat(hid), t


def step_loss(model, ids: torch.Tensor, hidden: torch.Tensor, starts: torch.Tensor, ends: torch.Tensor):
    """ids int64 [B, T], hidden bf16 [B, T, Hn], starts / ends int64 [B] (first generated position,
    sequence length) -> (mean CE, accuracy of the step argmax, number of targets)."""
    cfg = model.cfg
    B, T = ids.shape
    g, dev = cfg.dspark.block_size, ids.device
    kv = DenseDraftKV(cfg, dev, seq_len=T)
    add_context(model.mtp, hidden.flatten(0, 1), torch.arange(T, device=dev).repeat(B), kv)
    pos = torch.arange(T, device=dev)
    # a step at last context position p: anchor ids[p + 1] generated, at least one target before the end
    ok = (pos.unsqueeze(0) + 1 >= starts.unsqueeze(-1)) & (pos.unsqueeze(0) + 2 < ends.unsqueeze(-1))
    seq, last = torch.nonzero(ok, as_tuple=True)
    tgt_pos = last.unsqueeze(-1) + 2 + torch.arange(g, device=dev)  # [S, g]
    valid = tgt_pos < ends[seq].unsqueeze(-1)
    targets = torch.where(valid, ids[seq.unsqueeze(-1), tgt_pos.clamp(max=T - 1)], IGNORE)
    forced = torch.where(valid, targets, PAD_TOKEN_ID)
    out = draft(model, ids[seq, last + 1], kv.steps(last, seq), lambda _logits, i: forced[:, i])
    logits = out.logits.flatten(0, 1)
    loss = F.cross_entropy(logits, targets.flatten(), ignore_index=IGNORE)
    right = ((logits.argmax(-1) == targets.flatten()) & valid.flatten()).sum()
    return loss, right.float() / valid.sum(), int(valid.sum())


@torch.no_grad()
def export_drafter(model, out: Path, source: Path) -> Path:
    """`source`'s directory with the trained `mtp.*` tensors: every backbone tensor keeps the source's
    bytes (a dequantize / re-quantize round trip keeps an FP8 weight's values, not always its scale
    bytes)."""
    from sglang_dsv41.checkpoint.io import read_tensors, write_checkpoint

    export_checkpoint(model, out, source=source)  # config, tokenizer, and a validated layout
    tensors = read_tensors(source, model.cfg, progress=False)
    trained = checkpoint_tensors(model)
    tensors.update({k: v.to(tensors[k].device) for k, v in trained.items() if k.startswith("mtp.")})
    write_checkpoint(out, tensors, model.cfg)
    return out


@torch.no_grad()
def heldout_acceptance(ckpt: Path, renderer: task.ChatRenderer, levels: dict[int, float], n: int, device) -> dict:
    """Greedy speculative decoding of n test-split prompts through the paged runtime."""
    from sglang_dsv41.runtime.driver import Driver
    from sglang_dsv41.runtime.speculative import SpecDecoder

    model = load_model(ckpt, device=device, progress=False)
    probs = sample_problems(levels, n, "test", seed=1)
    prompts = [renderer.prompt(p.question) for p in probs]
    drv = Driver(model, sum(len(p) + 64 for p in prompts) + 64 * len(prompts), len(prompts), page_size=64,
                 device=device, speculative=True)
    new, st = SpecDecoder(drv).generate(prompts, 24, eos=(renderer.eos_id,))
    g = model.cfg.dspark.block_size
    return {"prompts": n, "verifies": st.verifies, "accept_length": round(st.accept_length, 4), "of": g + 1,
            "accept_rate_by_position": [round(c / max(st.verifies, 1), 4) for c in st.accepted_at]}


def sample_problems(levels: dict[int, float], n: int, split: str, seed: int) -> list[task.Problem]:
    total = sum(levels.values())
    out: list[task.Problem] = []
    for lv, w in levels.items():
        out += task.problems(lv, max(1, round(n * w / total)), split, seed)
    return out[:n]


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="deepseek-v4.1-tiny")
    ap.add_argument("--out", required=True)
    ap.add_argument("--stages", type=int, default=1, help="stages of a new drafter (if --model has none)")
    ap.add_argument("--steps", type=int, default=1500)
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--lr", type=float, default=2e-3)
    ap.add_argument("--levels", default="1:1,2:4")
    ap.add_argument("--sequences", type=int, default=6000, help="train-split problems to distil on")
    ap.add_argument("--max-new", type=int, default=16)
    ap.add_argument("--eval-n", type=int, default=200)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--max-minutes", type=float, default=0.0, help="stop training after this long (0: no limit)")
    a = ap.parse_args(argv)
    for flag, value in (("--stages", a.stages), ("--steps", a.steps), ("--batch", a.batch), ("--sequences", a.sequences),
                        ("--max-new", a.max_new), ("--eval-n", a.eval_n)):
        if value < 1:
            ap.error(f"{flag} must be at least 1, got {value}")
    if not a.lr > 0 or a.max_minutes < 0:
        ap.error(f"--lr must be positive and --max-minutes >= 0, got {a.lr} and {a.max_minutes}")
    try:
        levels = parse_levels(a.levels)
    except ValueError as e:
        ap.error(f"--levels: {e}")
    if not levels or any(lv not in task.RANGES or w <= 0 for lv, w in levels.items()):
        ap.error(f"--levels: LEVEL:WEIGHT pairs with levels in {sorted(task.RANGES)} and positive weights, got {a.levels!r}")
    torch.manual_seed(a.seed)
    out = Path(a.out)
    t_start = time.time()
    src = resolve_model_path(a.model)
    start = src if ModelConfig.from_pretrained(src).dspark is not None else with_drafter(src, out / "start", a.stages, a.seed)
    renderer = task.ChatRenderer(start)
    levels = parse_levels(a.levels)
    model = load_model(start, device=a.device, progress=False)
    prompts = [renderer.prompt(p.question) for p in sample_problems(levels, a.sequences, "train", a.seed)]
    seqs = greedy_sequences(model, prompts, renderer.eos_id, a.max_new, a.device)
    hidden, T = drafter_inputs(model, seqs, a.device)
    ids = torch.full((len(seqs), T), PAD_TOKEN_ID, dtype=torch.int64)
    for i, q in enumerate(seqs):
        ids[i, : len(q)] = torch.tensor(q)
    ids = ids.to(a.device)
    starts = torch.tensor([len(p) for p in prompts], device=a.device)
    ends = torch.tensor([len(q) for q in seqs], device=a.device)
    t_data = time.time() - t_start
    print(f"data: {len(seqs)} sequences of <= {T} tokens in {t_data:.0f} s", flush=True)

    make_trainable(model, part="drafter")
    params = [p for _, p in trainable_parameters(model)]
    opt = torch.optim.AdamW(params, lr=a.lr, weight_decay=0.0)
    gen = torch.Generator().manual_seed(a.seed)
    history, t0, step = [], time.time(), 0
    for step in range(1, a.steps + 1):
        frac = (step - 1) / a.steps
        for grp in opt.param_groups:
            grp["lr"] = a.lr * 0.5 * (1 + math.cos(math.pi * frac))
        pick = torch.randint(0, len(seqs), (a.batch,), generator=gen).to(a.device)
        loss, acc, _ = step_loss(model, ids[pick], hidden[pick], starts[pick], ends[pick])
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        opt.step()
        if step % 25 == 0 or step == 1:
            history.append({"step": step, "loss": round(float(loss), 4), "acc": round(float(acc), 4),
                            "seconds": round(time.time() - t0, 1)})
            print(json.dumps(history[-1]), flush=True)
        if a.max_minutes and time.time() - t0 > 60 * a.max_minutes:
            break
    t_train = time.time() - t0
    model.eval()
    export_drafter(model, out / "trained", start)
    held = heldout_acceptance(out / "trained", renderer, levels, a.eval_n, a.device)
    print(json.dumps({"heldout": held}), flush=True)
    meta_path = out / "trained" / "training.json"
    meta = json.loads(meta_path.read_text()) if meta_path.exists() else {}
    meta["dspark"] = {
        "command": "python -m sglang_dsv41.train.dspark " + " ".join(argv if argv is not None else __import__("sys").argv[1:]),
        "stages": model.cfg.dspark.n_stages, "gamma": model.cfg.dspark.block_size, "steps": step,
        "batch": a.batch, "lr": a.lr, "levels": a.levels, "sequences": len(seqs), "data_seconds": round(t_data, 1),
        "train_seconds": round(t_train, 1), "device": str(a.device), "torch": torch.__version__,
        "history": history, "heldout": held,
    }
    meta_path.write_text(json.dumps(meta, indent=1) + "\n")


if __name__ == "__main__":
    main()

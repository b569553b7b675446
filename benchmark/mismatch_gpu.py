"""Train/serve mismatch on one device: rollouts sampled by the offline driver (paged runtime, the
kernel op table: Triton on CUDA), recomputed by the trainer (the QAT trainable forward over a dense KV,
pure torch, autograd-capable), with and without routing replay (R3).

    python benchmark/mismatch_gpu.py --model deepseek-v4.1-tiny --prompts 16 --new 24 [--device cuda]
        [--task-level 2] [--results benchmark/results/DATE-DEVICE-mismatch.md]

Rollouts: every prompt is prefilled in one chunk, then decoded step by step; each new token is
sampled at temperature 1 from the driver's fp32 logits (seeded torch.Generator on the device), its
logprob is log_softmax(logits)[token] in fp32 (what an RL server returns with
SGLANG_RETURN_ORIGINAL_LOGPROB=1), and every forward's routed experts are kept ([prompt + response -
1, layers, top_k], the server's `return_routed_experts` layout). Prompts: seeded random ids, or with
--task-level the chat-rendered arithmetic problems of train/task.py (test split).

Trainer: `train.load_trainable(model, device)` (fp32 masters, every serving rounding as a
straight-through op), `train.mismatch.measure`: per rollout one forward of prompt + response[:-1];
metrics from `train.mismatch.summarize` (per-token KL(rollout || trainer) by k3 from the sampled
token, |dlogp| mean / max, routing agreement of the trainer's own routing).

Rows (each on the rollouts of its own driver run, same prompts and sampling seed):
  driver kernels   the driver with `kernel_table(device)` (Triton on CUDA, twins on the CPU)
  driver twins     the driver with `OpTable.twins()` on the same device (the torch twins), to
                   separate what the kernels contribute from what the device's torch ops contribute
For each: the trainer unforced and under R3 (the rollout's experts forced). On the CPU every value is
0 (the same forward, deterministic): that is the check this script makes before any GPU run.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import shlex
import sys
import time
from collections import Counter
from pathlib import Path

os.environ.setdefault("ATEN_CPU_CAPABILITY", "default")  # the CPU kernels the server and tests use

import torch  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT / "python"), str(ROOT / "sgl-kernel")]

from dsv41_kernels.op_table import OpTable  # noqa: E402
from sglang_dsv41.checkpoint.loader import load_model  # noqa: E402
from sglang_dsv41.embedded import resolve_model_path  # noqa: E402
from sglang_dsv41.runtime.driver import Driver, Sequence  # noqa: E402
from sglang_dsv41.numerics import NumericsPolicy, apply_numerics  # noqa: E402
from sglang_dsv41.runtime.kernels import kernel_table  # noqa: E402
from sglang_dsv41.train.mismatch import measure, random_prompts  # noqa: E402
from sglang_dsv41.train.rollout import Rollout  # noqa: E402

PUBLISHED = "KL 0.0012-0.0017, mean |dlogp| 0.017-0.025 (Miles, V4.1, SGLang rollouts, 16 GPUs)"
TARGET = {"kl_mean": 5e-4, "dlogp_mean": 0.01}


def sample_rollouts(model, table, prompts: list[list[int]], new: int, device: str, seed: int,
                    stop_id: int | None = None) -> tuple[list[Rollout], Counter]:
    """Prefill every prompt in one chunk, then decode `new` tokens each at temperature 1 (stopping a
    sequence at `stop_id`). -> rollouts with fp32 logprobs and int32 routed experts, op-call counts."""
    table, calls = table.counting()
    apply_numerics(model, NumericsPolicy.kernels(table))
    k, layers = model.cfg.moe.n_activated_experts, model.cfg.num_layers
    max_tokens = sum(len(p) + new for p in prompts) + len(prompts) * 64
    drv = Driver(model, max_tokens, len(prompts), page_size=64, device=device, ops=table, graphs=False)
    seqs = [Sequence(i, list(p), len(p)) for i, p in enumerate(prompts)]
    for s in seqs:
        drv.pools.clear_request(s.req_slot)
    gen = torch.Generator(device=device).manual_seed(seed)
    routed: list[list[torch.Tensor]] = [[] for _ in prompts]  # per sequence: [rows, layers, k] chunks
    resp: list[list[int]] = [[] for _ in prompts]
    lps: list[list[float]] = [[] for _ in prompts]
    active = list(seqs)
    counts = [len(p) for p in prompts]
    with torch.no_grad():
        while active:
            out = drv.step(active, counts)
            table_rows = torch.stack([out.decisions.routed_experts[layer] for layer in range(layers)], dim=1)
            table_rows = table_rows.to(torch.int32).cpu()  # [rows, layers, k], rows request-major
            logp = torch.log_softmax(out.logits.float(), dim=-1)
            tok = torch.multinomial(logp.exp(), 1, generator=gen).squeeze(1)
            lp = logp.gather(1, tok[:, None]).squeeze(1)
            tok, lp = tok.tolist(), lp.cpu().tolist()
            row, nxt = 0, []
            for s, c, t, v in zip(active, counts, tok, lp):
                routed[s.req_slot].append(table_rows[row: row + c])
                row += c
                resp[s.req_slot].append(t)
                lps[s.req_slot].append(v)
                s.tokens.append(t)
                s.prefill_len = len(s.tokens)
                if len(resp[s.req_slot]) < new and t != stop_id:
                    nxt.append(s)
            active, counts = nxt, [1] * len(nxt)
    drv.release(seqs)
    ros = [Rollout(prompt=list(p), response=r, logprobs=v, finish="length", routed_experts=torch.cat(x)[: len(p) + len(r) - 1])
           for p, r, v, x in zip(prompts, resp, lps, routed)]
    return ros, calls


def read_prompt_ids(path: str, vocab: int, ap: argparse.ArgumentParser) -> tuple[list[list[int]], int | None, str]:
    """--prompt-ids FILE -> (prompts, stop id or None, source text); any malformed file is an argparse error."""
    try:
        spec = json.loads(Path(path).read_text())
    except (OSError, ValueError) as e:
        ap.error(f"--prompt-ids {path}: {e}")
    prompts = spec.get("prompts") if isinstance(spec, dict) else None
    ok = isinstance(prompts, list) and prompts and all(
        isinstance(p, list) and p and all(isinstance(t, int) and 0 <= t < vocab for t in p) for p in prompts)
    stop = spec.get("stop_id") if ok else None
    if not ok or not (stop is None or isinstance(stop, int) and 0 <= stop < vocab):
        ap.error(f"--prompt-ids {path}: expected {{'prompts': [[ids...], ...], 'stop_id': id}} with every prompt a "
                 f"non-empty list of integer ids in [0, {vocab})")
    return prompts, stop, str(spec.get("source", path))


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", default="deepseek-v4.1-tiny", help="checkpoint directory or embedded alias")
    ap.add_argument("--prompts", type=int, default=16)
    ap.add_argument("--prompt-len", type=int, default=32, help="random prompt length (without --task-level)")
    ap.add_argument("--task-level", type=int, default=None, help="chat-rendered arithmetic prompts of this level")
    ap.add_argument("--prompt-ids", default=None, help="JSON file {'prompts': [[ids...], ...], 'stop_id': int, "
                    "'source': str}: prompts rendered elsewhere (e.g. --render-task-level on a machine with "
                    "deepseek-recipe)")
    ap.add_argument("--render-task-level", type=int, default=None, help="only write --prompt-ids: the chat-rendered "
                    "level-N test problems (--prompts of them), then exit")
    ap.add_argument("--new", type=int, default=24, help="sampled tokens per prompt")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--no-twins", action="store_true", help="skip the driver-twins row")
    ap.add_argument("--results", default=None, help="write the table and run details to this markdown file")
    a = ap.parse_args(argv)
    for flag in ("prompts", "prompt_len", "new"):
        if getattr(a, flag) < 1:
            ap.error(f"--{flag.replace('_', '-')} must be >= 1")
    from sglang_dsv41.train.trainable import load_trainable

    path = resolve_model_path(a.model)
    cfg_model = load_model(path, device=a.device, progress=False)
    cfg = cfg_model.cfg
    stop_id = None
    if a.render_task_level is not None:
        from sglang_dsv41.train import task

        if not a.prompt_ids:
            ap.error("--render-task-level needs --prompt-ids FILE to write")
        if a.render_task_level not in task.RANGES:
            ap.error(f"--render-task-level must be one of {sorted(task.RANGES)}, got {a.render_task_level}")
        renderer = task.ChatRenderer(path)
        probs = task.problems(a.render_task_level, a.prompts, "test", seed=a.seed)
        Path(a.prompt_ids).write_text(json.dumps({
            "prompts": [renderer.prompt(p.question) for p in probs], "stop_id": renderer.eos_id,
            "source": f"{a.prompts} chat-rendered level-{a.render_task_level} test problems (task generator "
                      f"v{task.GENERATOR_VERSION}, seed {a.seed})"}))
        print(f"wrote {a.prompt_ids}")
        return
    source = None
    if a.prompt_ids:
        prompts, stop_id, source = read_prompt_ids(a.prompt_ids, cfg.vocab_size, ap)
    elif a.task_level is not None:
        from sglang_dsv41.train import task

        renderer = task.ChatRenderer(path)
        prompts = [renderer.prompt(p.question) for p in task.problems(a.task_level, a.prompts, "test", seed=a.seed)]
        stop_id = renderer.eos_id
    else:
        prompts = random_prompts(a.prompts, a.prompt_len, cfg.vocab_size, a.seed)
    t0 = time.perf_counter()
    trainer = load_trainable(path, device=a.device)
    variants = [("driver kernels", kernel_table(a.device))] + ([] if a.no_twins else [("driver twins", OpTable.twins())])
    rows, lines, calls_note = [], [], {}
    for name, table in variants:
        model = cfg_model if name == "driver kernels" else load_model(path, device=a.device, progress=False)
        ros, calls = sample_rollouts(model, table, prompts, a.new, a.device, a.seed, stop_id)
        impl = Counter(i for (_, i) in calls.elements())
        calls_note[name] = dict(impl)
        res = measure(trainer, ros, r3=True)
        for r3 in (False, True):
            m = res[r3]
            rows.append({"rollouts": name, "trainer": "R3 (experts forced)" if r3 else "own routing", **m.__dict__})
    elapsed = time.perf_counter() - t0
    dev_name = torch.cuda.get_device_name() if a.device.startswith("cuda") else f"cpu ({platform.processor() or platform.machine()})"
    head = "| rollouts | trainer | tokens | KL mean | KL p99 | KL max | mean abs dlogp | max abs dlogp | routing agreement |"
    lines = [head, "|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r['rollouts']} | {r['trainer']} | {r['tokens']} | {r['kl_mean']:.3g} | {r['kl_p99']:.3g} | "
                     f"{r['kl_max']:.3g} | {r['dlogp_mean']:.3g} | {r['dlogp_max']:.3g} | {r['routing_agreement']:.4f} |")
    for line in lines:
        print(line)
    print(json.dumps({"op_calls": calls_note, "seconds": round(elapsed, 1)}))
    print(f"published: {PUBLISHED}; target: KL mean <= {TARGET['kl_mean']}, mean |dlogp| <= {TARGET['dlogp_mean']}")
    if a.results:
        try:
            import triton
            tv = f", triton {triton.__version__}"
        except ImportError:
            tv = ""
        prompt_desc = source or (f"{a.prompts} chat-rendered level-{a.task_level} test problems" if a.task_level is not None
                       else f"{a.prompts} random prompts of {a.prompt_len} tokens")
        text = [f"# Train/serve mismatch: trainer vs the offline driver, {datetime.date.today()}, {dev_name}", "",
                f"- command: `python benchmark/mismatch_gpu.py {shlex.join(sys.argv[1:] if argv is None else argv)}`",
                f"- device: {dev_name}; torch {torch.__version__}{tv}",
                f"- model: {a.model} ({path.name}; hidden {cfg.hidden_size}, {cfg.num_layers} layers, "
                f"{cfg.moe.n_routed_experts} experts, top-{cfg.moe.n_activated_experts})",
                f"- rollouts: {prompt_desc}, {a.new} tokens sampled at temperature 1 each (seed {a.seed}); "
                f"op calls by implementation: {json.dumps(calls_note)}",
                f"- trainer: the QAT trainable forward (fp32 masters, torch ops) on {a.device}; KL = per-token k3 "
                f"estimate of KL(rollout || trainer) at the sampled token; {elapsed:.0f} s in all", "",
                *lines, "",
                f"Published anchor: {PUBLISHED}. Target: KL mean <= {TARGET['kl_mean']}, mean |dlogp| <= {TARGET['dlogp_mean']}.", ""]
        Path(a.results).parent.mkdir(parents=True, exist_ok=True)
        Path(a.results).write_text("\n".join(text))


if __name__ == "__main__":
    main()

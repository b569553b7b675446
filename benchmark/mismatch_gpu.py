"""Train/serve mismatch on one device: rollouts sampled by the offline driver (paged runtime, the
kernel op table: Triton on CUDA), recomputed by the trainer two ways, with and without routing replay
(R3), in deterministic mode and in the fast default mode.

    python benchmark/mismatch_gpu.py --model deepseek-v4.1-tiny --prompt-ids benchmark/level2_prompts_128.json
        --new 24 [--device cuda] [--modes deterministic,fast] [--results benchmark/results/DATE-DEVICE-mismatch.md]

Rollouts (`train.driver_rollouts.sample_rollouts`): every prompt prefilled in one chunk, then decoded
step by step; each token sampled at temperature 1 from the driver's fp32 logits, its logprob
log_softmax(logits)[token] in fp32 (an RL server's SGLANG_RETURN_ORIGINAL_LOGPROB=1), every forward's
routed experts kept. Prompts: seeded random ids, --task-level's chat-rendered arithmetic problems
(test split), or --prompt-ids (rendered elsewhere).

Trainer (`train.load_trainable`: fp32 masters, every serving rounding straight-through), per rollout
(`train.mismatch.measure`):
  torch forward    its own forward (torch ops over a dense KV): prompt + response[:-1]
  serving values   train/serving_values.py: the value of its logits is the rollouts' forward (a prefill
                   of the serving bytes of its masters through the same op table), the gradient its own
Metrics from `train.mismatch.summarize`: per-token KL(rollout || trainer) by k3 at the sampled token,
|dlogp| mean / max, routing agreement of the trainer's routing (the value forward's under serving values).

Modes (SGLANG_DSV41_DETERMINISTIC for the rollouts and the trainer alike): `deterministic` (batch-invariant
kernels: a row's bits independent of the batch and of prefill vs decode) and `fast` (the default).
`--twins` adds rollouts by the driver with `OpTable.twins()` on the same device (the torch twins), which
separates what the kernels contribute from what the device's torch ops contribute. On the CPU every value
is 0 (the same forward, deterministic): the check this script makes before any GPU run.
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
from sglang_dsv41.checkpoint.loader import load_model, replace_tensors  # noqa: E402
from sglang_dsv41.embedded import resolve_model_path  # noqa: E402
from sglang_dsv41.determinism import DETERMINISTIC_ENV  # noqa: E402
from sglang_dsv41.runtime.kernels import kernel_table  # noqa: E402
from sglang_dsv41.train.mismatch import measure, random_prompts  # noqa: E402
from sglang_dsv41.train.driver_rollouts import sample_rollouts  # noqa: E402
from sglang_dsv41.train.export import checkpoint_tensors  # noqa: E402
from sglang_dsv41.train.serving_values import ServingValues  # noqa: E402

PUBLISHED = "KL 0.0012-0.0017, mean |dlogp| 0.017-0.025 (Miles, V4.1, SGLang rollouts, 16 GPUs)"
TARGET = {"deterministic": {"kl_mean": 0.0, "dlogp_mean": 0.0}, "fast": {"kl_mean": 5e-4, "dlogp_mean": 0.005}}
"""issue 31's targets for the trainer against Triton rollouts, per mode."""
MODES = ("deterministic", "fast")


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
    ap.add_argument("--twins", action="store_true", help="also rollouts by the driver's torch twins on the device")
    ap.add_argument("--modes", default="deterministic,fast", help="comma-separated: deterministic, fast")
    ap.add_argument("--results", default=None, help="write the table and run details to this markdown file")
    a = ap.parse_args(argv)
    modes = [m for m in a.modes.split(",") if m]
    if not modes or any(m not in MODES for m in modes):
        ap.error(f"--modes: comma-separated values of {', '.join(MODES)}, got {a.modes!r}")
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
    variants = [("driver kernels", kernel_table(a.device))] + ([("driver twins", OpTable.twins())] if a.twins else [])
    rows, calls_note = [], {}
    for mode in modes:
        os.environ[DETERMINISTIC_ENV] = "1" if mode == "deterministic" else "0"
        for name, table in variants:
            t1 = time.perf_counter()
            model = load_model(path, device=a.device, progress=False)
            # the rollouts serve the trainer's exported bytes, as train.rl's first push makes the server do
            replace_tensors(model, checkpoint_tensors(trainer, include_frozen=False))
            ros, calls = sample_rollouts(model, table, prompts, a.new, a.device, a.seed, stop_id)
            print(f"[{mode}, {name}: {len(ros)} rollouts in {time.perf_counter() - t1:.0f} s]", file=sys.stderr)
            del model
            calls_note[f"{mode}, {name}"] = dict(Counter(i for (_, i) in calls.elements()))
            values = ServingValues(trainer, path, table, max_tokens=16 * max(len(r.sequence) for r in ros) + 64, max_requests=16)
            for trainer_name, v in (("torch forward", None), ("serving values", values)):
                res = measure(trainer, ros, r3=True, values=v)
                print(f"[{mode}, {name}, {trainer_name}: measured at {time.perf_counter() - t1:.0f} s]", file=sys.stderr)
                for r3 in (False, True):
                    rows.append({"mode": mode, "rollouts": name, "trainer": trainer_name,
                                 "routing": "R3 (experts forced)" if r3 else "own", **res[r3].__dict__})
            del values
    elapsed = time.perf_counter() - t0
    dev_name = torch.cuda.get_device_name() if a.device.startswith("cuda") else f"cpu ({platform.processor() or platform.machine()})"
    head = ("| mode | rollouts | trainer | routing | tokens | KL mean | KL p99 | KL max | mean abs dlogp | max abs dlogp "
            "| routing agreement | target (KL, dlogp) |")
    lines = [head, "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        t = TARGET[r["mode"]]
        met = "met" if r["kl_mean"] <= t["kl_mean"] and r["dlogp_mean"] <= t["dlogp_mean"] else "not met"
        lines.append(f"| {r['mode']} | {r['rollouts']} | {r['trainer']} | {r['routing']} | {r['tokens']} | "
                     f"{r['kl_mean']:.3g} | {r['kl_p99']:.3g} | "
                     f"{r['kl_max']:.3g} | {r['dlogp_mean']:.3g} | {r['dlogp_max']:.3g} | {r['routing_agreement']:.4f} | "
                     f"<= {t['kl_mean']:g}, <= {t['dlogp_mean']:g}: {met} |")
    for line in lines:
        print(line)
    print(json.dumps({"op_calls": calls_note, "seconds": round(elapsed, 1)}))
    print(f"published: {PUBLISHED}")
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
                f"- trainer: the QAT trainable model (fp32 masters) on {a.device}: its torch forward, and with serving "
                f"values (train/serving_values.py: value from the rollouts' forward over its exported bytes, gradient "
                f"from its own); KL = per-token k3 estimate of KL(rollout || trainer) at the sampled token; "
                f"{elapsed:.0f} s in all", "",
                *lines, "",
                f"Published anchor: {PUBLISHED}. Targets (issue 31, Triton rollouts): deterministic mode KL 0 and "
                f"|dlogp| 0; fast mode KL mean <= {TARGET['fast']['kl_mean']}, mean |dlogp| <= {TARGET['fast']['dlogp_mean']}.", ""]
        Path(a.results).parent.mkdir(parents=True, exist_ok=True)
        Path(a.results).write_text("\n".join(text))


if __name__ == "__main__":
    main()

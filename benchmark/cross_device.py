"""Greedy tokens across devices, compared the way guides/numerics.md says (decisions, then values
with decisions replayed), plus the model-level Triton-vs-twin check on one device.

    # on the GPU: free-running greedy with the Triton ops, recording every step's logits and decisions;
    # --ops-check also reruns the same rows with every op forced onto its torch twin
    python benchmark/cross_device.py record --preset small --prompts 8 --prompt-len 256 --decode 16 \
        --out trace.pt [--ops-check]
    # on the CPU (ATEN_CPU_CAPABILITY=default, as the CPU server runs): same checkpoint bytes, same prompts
    python benchmark/cross_device.py compare --trace trace.pt [--md out.md]

`compare` runs four CPU passes over the same step schedule: (A) free-running greedy, i.e. the CPU
server's tokens; (B) teacher-forced on the GPU's tokens with the CPU's own decisions; (C) the same with
the GPU's decisions replayed; (D) the noise floor: one-ulp perturbation of 1% of the embedding entries,
teacher-forced on A's tokens with A's decisions replayed. Greedy tokens match when C's argmax is the
GPU's token at every step, or differs only where C's own top-2 gap is inside D's measured noise.
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import os
import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT / "python"), str(ROOT / "sgl-kernel")]

from dsv41_kernels.registry import FORCE_TORCH_ENV  # noqa: E402
from sglang_dsv41.checkpoint.loader import load_model  # noqa: E402
from sglang_dsv41.runtime.driver import Driver, StepTrace, random_prompts  # noqa: E402
from sglang_dsv41.numerics import NumericsPolicy, apply_numerics  # noqa: E402
from sglang_dsv41.runtime.kernels import kernel_table  # noqa: E402
from sglang_dsv41.tiny import write_tiny_checkpoint  # noqa: E402


def checkpoint(preset: str, seed: int) -> tuple[Path, str]:
    """The preset's checkpoint, drawn on the CPU (same bytes on every machine), and its sha256."""
    path = write_tiny_checkpoint(Path("/tmp/dsv41-cross") / preset, preset, seed, "cpu")
    h = hashlib.sha256()
    for f in sorted(path.glob("*.safetensors")):
        h.update(f.read_bytes())
    return path, h.hexdigest()


def run(model, prompts, decode, chunk, device, teacher=None, replays=None):
    """-> (new tokens per prompt, list[StepTrace])."""
    drv = Driver(model, len(prompts) * (len(prompts[0]) + decode + 256), len(prompts), 256, device)
    trace: list[StepTrace] = []
    new, _ = drv.generate(prompts, decode, chunk, teacher=teacher, replays=replays, trace=trace)
    return new, trace


@contextlib.contextmanager
def torch_ops():
    old = os.environ.get(FORCE_TORCH_ENV)
    os.environ[FORCE_TORCH_ENV] = "1"
    try:
        yield
    finally:
        os.environ.pop(FORCE_TORCH_ENV) if old is None else os.environ.__setitem__(FORCE_TORCH_ENV, old)


def sampled(trace: list[StepTrace], n_req: int, decode: int) -> list[list[torch.Tensor]]:
    """Logits row each request sampled its i-th new token from: [request][i] -> fp32 [vocab]."""
    rows: list[list[torch.Tensor]] = [[] for _ in range(n_req)]
    for st in trace:
        for r, row in zip(st.req_slots, st.logits):
            rows[r].append(row)
    # prefill chunks that did not finish a prompt also produced rows: keep the last `decode`
    return [r[-decode:] for r in rows]


def logits_table(want: list[list[torch.Tensor]], got: list[list[torch.Tensor]], tokens: list[list[int]]) -> dict:
    """Per-step agreement of `got`'s argmax with `tokens` (chosen on `want`'s side) and logit distances."""
    agree = total = 0
    worst_margin, max_abs, min_cos = 0.0, 0.0, 1.0
    misses = []
    for r, (ws, gs) in enumerate(zip(want, got)):
        for i, (w, g) in enumerate(zip(ws, gs)):
            total += 1
            tok = tokens[r][i]
            top2 = g.topk(2).values
            if int(g.argmax()) == tok:
                agree += 1
            else:
                margin = float(g.max() - g[tok])
                worst_margin = max(worst_margin, margin)
                misses.append((r, i, round(margin, 4), round(float(top2[0] - top2[1]), 4)))
            max_abs = max(max_abs, float((w - g).abs().max()))
            min_cos = min(min_cos, float(torch.nn.functional.cosine_similarity(w, g, dim=0)))
    return dict(agree=agree, total=total, worst_margin=worst_margin, max_abs=max_abs, min_cos=min_cos, misses=misses)


def decision_diffs(a: list[StepTrace], b: list[StepTrace]) -> dict:
    """Rows whose routed experts / top-k positions / candidate blocks differ as sets, per kind."""
    out = {"routed_experts": [0, 0], "topk": [0, 0], "candidates": [0, 0]}
    for sa, sb in zip(a, b):
        for kind in ("routed_experts", "topk"):
            for lid, x in getattr(sa, kind).items():
                y = getattr(sb, kind)[lid]
                xs, ys = x.sort(-1).values, y.sort(-1).values
                out[kind][0] += int((xs != ys).any(-1).sum())
                out[kind][1] += x.size(0)
        for lid, x in sa.candidates.items():
            y = sb.candidates[lid]
            out["candidates"][0] += int((x != y).any(-1).sum())
            out["candidates"][1] += x.size(0)
    return out


def fmt(name: str, t: dict) -> str:
    return (f"| {name} | {t['agree']}/{t['total']} | {t['worst_margin']:.4f} | {t['max_abs']:.4f} | "
            f"{1 - t['min_cos']:.2e} | {t['misses'][:6]} |")


HEAD = ("| pass | argmax = reference token | worst margin of a miss | max abs logit diff | 1 - min cos | misses "
        "(request, step, margin, own top-2 gap) |\n|---|---|---|---|---|---|")


def record(a) -> None:
    dev = "cuda" if torch.cuda.is_available() else "cpu"
    path, sha = checkpoint(a.preset, a.seed)
    model = apply_numerics(load_model(path, device=dev, progress=False), NumericsPolicy.kernels(kernel_table(dev)))
    prompts = random_prompts(model.cfg.vocab_size, a.prompts, a.prompt_len, a.seed)
    tokens, trace = run(model, prompts, a.decode, a.chunk, dev)
    blob = dict(preset=a.preset, seed=a.seed, sha256=sha, device=torch.cuda.get_device_name() if dev == "cuda" else "cpu",
                chunk=a.chunk, decode=a.decode, prompts=prompts, tokens=tokens, steps=[vars(s) for s in trace])
    print(f"{a.preset}: {a.prompts} x {a.prompt_len}, {a.decode} greedy steps on {blob['device']}; sha256 {sha[:12]}")
    if a.ops_check:  # issue 4: the model with every op on its torch twin vs with the Triton kernels
        lines = [HEAD]
        with torch_ops():
            _, own = run(model, prompts, a.decode, a.chunk, dev, teacher=tokens)
            _, rep = run(model, prompts, a.decode, a.chunk, dev, teacher=tokens, replays=[s.replay() for s in trace])
        want = sampled(trace, a.prompts, a.decode)
        lines.append(fmt("twins, own decisions", logits_table(want, sampled(own, a.prompts, a.decode), tokens)))
        lines.append(fmt("twins, Triton run's decisions replayed", logits_table(want, sampled(rep, a.prompts, a.decode), tokens)))
        diffs = decision_diffs(trace, own)
        lines.append(f"\nDecisions of the twin run differing from the Triton run (rows): {diffs}")
        lines += ["", reference_check(model, prompts, tokens, dev)]
        blob["ops_check"] = "\n".join(lines)
        print(blob["ops_check"])
    torch.save(blob, a.out)


def reference_check(model, prompts, tokens, device) -> str:
    """The one forward over the dense KV (no paged ops) with the model's kernel slots (GEMMs, indexer
    query / top-k / candidates, Engram) as Triton kernels, over each request's prompt + generated tokens, against the same forward
    with every op on its torch twin and the Triton run's decisions replayed: per-row logits."""
    from sglang_dsv41.reference.model import ReferenceModel

    ref = ReferenceModel(model)
    agree = total = 0
    max_abs, min_cos = 0.0, 1.0
    for p, t in zip(prompts, tokens):
        ids = torch.tensor(p + t[:-1], device=device)
        a = ref.forward(ids)
        with torch_ops():
            b = ref.forward(ids, replay=a.decisions)
        la, lb = a.logits.float().cpu(), b.logits.float().cpu()
        agree += int((la.argmax(-1) == lb.argmax(-1)).sum())
        total += la.size(0)
        max_abs = max(max_abs, float((la - lb).abs().max()))
        min_cos = min(min_cos, float(torch.nn.functional.cosine_similarity(la, lb, dim=-1).min()))
    return (f"Reference forward, Triton GEMMs vs torch twins (twins replay the Triton run's decisions), all "
            f"{total} rows: argmax agree {agree}/{total}, max abs logit diff {max_abs:.4f}, 1 - min cos {1 - min_cos:.2e}")


def perturbed(model, frac: float = 0.01, seed: int = 1):
    """The same model with `frac` of the embedding entries moved by one bf16 ulp (away from zero)."""
    w = model.embed.weight
    g = torch.Generator().manual_seed(seed)
    pick = (torch.rand(w.shape, generator=g) < frac) & (w != 0)
    bits = w.data.view(torch.int16).clone()
    bits[pick] += 1
    new = bits.view(torch.bfloat16)
    old = w.data.clone()
    w.data.copy_(new)
    return old


def compare(a) -> None:
    blob = torch.load(a.trace, weights_only=False)
    path, sha = checkpoint(blob["preset"], blob["seed"])
    if sha != blob["sha256"]:
        raise SystemExit(f"checkpoint bytes differ from the recorded run: {sha} vs {blob['sha256']}")
    model = load_model(path, device="cpu", progress=False)
    prompts, tokens, decode, chunk = blob["prompts"], blob["tokens"], blob["decode"], blob["chunk"]
    other = [StepTrace(**s) for s in blob["steps"]]
    n = len(prompts)
    want = sampled(other, n, decode)
    cpu_tokens, cpu_trace = run(model, prompts, decode, chunk, "cpu")
    div = [next((i for i, (x, y) in enumerate(zip(t, c)) if x != y), None) for t, c in zip(tokens, cpu_tokens)]
    _, own = run(model, prompts, decode, chunk, "cpu", teacher=tokens)
    _, rep = run(model, prompts, decode, chunk, "cpu", teacher=tokens, replays=[s.replay() for s in other])
    old = perturbed(model)
    _, noise = run(model, prompts, decode, chunk, "cpu", teacher=cpu_tokens, replays=[s.replay() for s in cpu_trace])
    model.embed.weight.data.copy_(old)
    _, noise_own = run(model, prompts, decode, chunk, "cpu", teacher=cpu_tokens)  # sanity: unperturbed = A
    cpu_rows = sampled(cpu_trace, n, decode)
    lines = [f"Recorded on {blob['device']} ({blob['preset']}, {n} x {len(prompts[0])}, {decode} steps, sha256 "
             f"{blob['sha256'][:12]}); compared on CPU, ATEN_CPU_CAPABILITY={os.environ.get('ATEN_CPU_CAPABILITY', 'unset')}.",
             "", f"Free-running CPU greedy vs {blob['device']} greedy: first divergent step per request: {div}",
             f"({sum(d is None for d in div)}/{n} requests identical over all {decode} steps)", "", HEAD,
             fmt("B: CPU, own decisions, teacher-forced", logits_table(want, sampled(own, n, decode), tokens)),
             fmt("C: CPU, recorded decisions replayed", logits_table(want, sampled(rep, n, decode), tokens)),
             fmt("D: CPU noise floor (1% embed entries +1 ulp, A's decisions replayed) vs A",
                 logits_table(cpu_rows, sampled(noise, n, decode), cpu_tokens)),
             fmt("check: CPU rerun of A teacher-forced vs A (must be exact)",
                 logits_table(cpu_rows, sampled(noise_own, n, decode), cpu_tokens)),
             "", f"Decisions of B (CPU's own) differing from the recorded run (rows differing / rows): "
             f"{decision_diffs(other, own)}"]
    if "ops_check" in blob:
        lines += ["", f"Model-level check on {blob['device']} (same process): Triton ops vs torch twins", "",
                  blob["ops_check"]]
    text = "\n".join(lines)
    print(text)
    if a.md:
        Path(a.md).write_text(text + "\n")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("record")
    r.add_argument("--preset", default="small")
    r.add_argument("--prompts", type=int, default=8)
    r.add_argument("--prompt-len", type=int, default=256)
    r.add_argument("--decode", type=int, default=16)
    r.add_argument("--chunk", type=int, default=8192)
    r.add_argument("--seed", type=int, default=0)
    r.add_argument("--ops-check", action="store_true")
    r.add_argument("--out", required=True)
    c = sub.add_parser("compare")
    c.add_argument("--trace", required=True)
    c.add_argument("--md")
    a = ap.parse_args()
    record(a) if a.cmd == "record" else compare(a)


if __name__ == "__main__":
    main()

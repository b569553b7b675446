"""Train/serve mismatch: sample from a running server, recompute in the trainer, compare.

    python -m sglang_dsv41.train.mismatch --model DIR --server URL [--prompts N] [--r3]

Prints ONE JSON line:
  kl_mean, kl_p99, kl_max    per-token KL(server || trainer), k3 estimate from the sampled token
                             (tokens are drawn from the server's distribution; d = logp_trainer -
                             logp_server; k3 = exp(d) - 1 - d >= 0, unbiased, 0 iff d == 0)
  dlogp_mean, dlogp_max      |logp_trainer - logp_server| over response tokens
  routing_agreement          fraction of (token, layer) whose routed expert set in the trainer's own
                             forward equals the server's (every token that ran a forward)
  tokens, sequences, r3      counts; whether the trainer forced the server's experts (R3)
With `--r3` the logprobs come from the forward that forces the rollout's experts, and the line also
carries the unforced forward's metrics under "unforced"; routing agreement is always measured on the
trainer's own (unforced) routing.

The server must be started with `--rl-on-policy-target sglang_dsv41` (docs/rl.md): the tool reads its
`/server_info` first and stops with one line naming what is missing (`--any-server` measures any server,
with a warning). It then runs in the server's deterministic mode and, on the CPU, at the server's torch
thread count (`--threads 0`, the default; another count is refused): MKL splits the K reduction of fp32
GEMMs over threads, so another count changes the last bits, and through the FP8 roundings and top-k,
whole logprobs. Server errors are one line (train/rollout.py ServerError).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
from dataclasses import asdict, dataclass

import torch

from sglang_dsv41.layers.transformer import DeepseekV41
from sglang_dsv41.train.rollout import (Rollout, ServerClient, ServerError, derive_seed, require_rl_server,
                                        rl_server_problem)


@dataclass
class Mismatch:
    kl_mean: float
    kl_p99: float
    kl_max: float
    dlogp_mean: float
    dlogp_max: float
    routing_agreement: float | None
    tokens: int
    sequences: int
    r3: bool


def k3(d: torch.Tensor) -> torch.Tensor:
    """Per-token KL(server || trainer) estimate from d = logp_trainer - logp_server at a token sampled
    from the server: exp(d) - 1 - d (Schulman's k3; fp64, so tiny d does not cancel to a negative)."""
    d = d.double()
    return torch.expm1(d) - d


def summarize(server_lp: torch.Tensor, trainer_lp: torch.Tensor, agree: torch.Tensor | None, sequences: int,
              r3: bool) -> Mismatch:
    """server_lp / trainer_lp: fp32 [tokens] over all response tokens; agree: bool [token-layers]."""
    d = trainer_lp.double() - server_lp.double()
    kl = k3(d)
    n = d.numel()
    p99 = float(torch.quantile(kl, 0.99)) if n else math.nan
    return Mismatch(
        kl_mean=float(kl.mean()) if n else math.nan, kl_p99=p99, kl_max=float(kl.max()) if n else math.nan,
        dlogp_mean=float(d.abs().mean()) if n else math.nan, dlogp_max=float(d.abs().max()) if n else math.nan,
        routing_agreement=float(agree.double().mean()) if agree is not None and agree.numel() else None,
        tokens=n, sequences=sequences, r3=r3)


def same_expert_sets(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """int [T, L, k] x2 -> bool [T * L]: equal sets of experts per token and layer (order ignored)."""
    return (a.sort(-1).values == b.sort(-1).values).all(-1).flatten()


@torch.no_grad()
def measure(model: DeepseekV41, rollouts: list[Rollout], r3: bool, values=None, chunk: int = 16) -> dict[bool, Mismatch]:
    """Recompute every rollout in the trainer, `chunk` rollouts per forward (policy.batch_response_logprobs,
    what an RL step trains on) -> {False: metrics of the trainer's own routing, True: metrics with the
    rollout's experts forced (only with `r3`)}. Routing agreement is measured on the trainer's own routing
    in both. `values` (train/serving_values.py ServingValues): the trainer's logprobs take the values of
    the rollouts' own forward (what an RL step with `values` trains on)."""
    if r3 and any(ro.routed_experts is None for ro in rollouts):
        raise ValueError("R3 needs routed experts from the server (--enable-return-routed-experts)")
    server = torch.cat([torch.tensor(ro.logprobs, dtype=torch.float32) for ro in rollouts]) if rollouts else torch.zeros(0)
    own, forced, agree = [], [], []
    for i in range(0, len(rollouts), chunk):
        part = rollouts[i: i + chunk]
        lps, routed = _recompute(model, part, False, values)
        own += lps
        agree += [same_expert_sets(t, ro.routed_experts) for t, ro in zip(routed, part) if ro.routed_experts is not None]
        if r3:
            forced += _recompute(model, part, True, values)[0]
    cat = lambda xs: torch.cat(xs) if xs else torch.zeros(0)  # noqa: E731
    a = cat(agree) if agree else None
    out = {False: summarize(server, cat(own), a, len(rollouts), False)}
    if r3:
        out[True] = summarize(server, cat(forced), a, len(rollouts), True)
    return out


@torch.no_grad()
def _recompute(model: DeepseekV41, part: list[Rollout], r3: bool, values) -> tuple[list[torch.Tensor], list]:
    """-> (per rollout fp32 [R] the trainer's logprobs of the response, per rollout int32
    [P + R - 1, layers, k] its routing; None entries under R3)."""
    from sglang_dsv41.train.policy import batch_response_logprobs

    value = values.logits(part, r3) if values is not None else None
    out = batch_response_logprobs(model, part, r3=r3, values=value)
    return [lp.cpu() for lp in out.logprobs], out.routed or [None] * len(part)


def random_prompts(count: int, length: int, vocab: int, seed: int) -> list[list[int]]:
    """Seeded random prompts of ids in [3, vocab - 1) (below the image token, which SGLang rewrites)."""
    g = torch.Generator().manual_seed(seed)
    return [torch.randint(3, vocab - 1, (length,), generator=g).tolist() for _ in range(count)]


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="python -m sglang_dsv41.train.mismatch", description=__doc__.split("\n")[0])
    p.add_argument("--model", required=True, help="checkpoint directory the server serves (or an embedded alias)")
    p.add_argument("--server", required=True, help="server URL, e.g. http://127.0.0.1:30000")
    p.add_argument("--prompts", type=int, default=8, help="number of prompts (default 8)")
    p.add_argument("--n", type=int, default=2, help="samples per prompt (default 2)")
    p.add_argument("--prompt-len", type=int, default=24, help="random prompt length in tokens (default 24)")
    p.add_argument("--max-new-tokens", type=int, default=16)
    p.add_argument("--temperature", type=float, default=1.0)
    p.add_argument("--seed", type=int, default=0, help="seed of the random prompts and of the sampling (>= 0)")
    p.add_argument("--r3", action="store_true", help="force the server's routed experts in the trainer (R3)")
    p.add_argument("--no-routing", action="store_true", help="do not request routed experts (no R3, no routing "
                   "agreement)")
    p.add_argument("--any-server", action="store_true", help="measure a server not started with "
                   "--rl-on-policy-target sglang_dsv41 (warns instead of stopping)")
    p.add_argument("--device", default="cpu")
    p.add_argument("--threads", type=int, default=0, help="torch CPU threads (0: the server's count on the CPU, "
                   "else torch's default). On the CPU the forward's last bits depend on it")
    a = p.parse_args(argv)
    if a.threads < 0:
        p.error("--threads must be >= 0")
    if a.seed < 0:
        p.error("--seed must be >= 0")
    if a.r3 and a.no_routing:
        p.error("--r3 needs routed experts; drop --no-routing")
    for flag, v in (("--prompts", a.prompts), ("--n", a.n), ("--prompt-len", a.prompt_len), ("--max-new-tokens", a.max_new_tokens)):
        if v < 1:
            p.error(f"{flag} must be >= 1")
    if a.threads:
        torch.set_num_threads(a.threads)
    # The server's CPU kernels (set by our plugin there); read at torch's first CPU kernel, so here.
    os.environ.setdefault("ATEN_CPU_CAPABILITY", "default")
    try:
        print(json.dumps(_run(a)))
    except ServerError as e:
        raise SystemExit(f"train.mismatch: {e}") from None


def _run(a: argparse.Namespace) -> dict:
    """The server check (before the model loads), the samples, the trainer's recompute -> the output line."""
    from sglang_dsv41.checkpoint.loader import load_model
    from sglang_dsv41.embedded import resolve_model_path

    client = ServerClient(a.server)
    if a.any_server:
        problem = rl_server_problem(client.server_info(), client.url, a.device, a.threads)
        if problem:
            print(f"train.mismatch: measuring anyway (--any-server): {problem}", file=sys.stderr)
    else:
        require_rl_server(client, a.device, a.threads)
    model = load_model(resolve_model_path(a.model), device=a.device, progress=False)
    cfg = model.cfg
    prompts = random_prompts(a.prompts, a.prompt_len, cfg.vocab_size, a.seed)
    groups = client.sample(prompts, a.n, a.max_new_tokens, temperature=a.temperature, seed=derive_seed(a.seed),
                           routed_experts=not a.no_routing, layers=cfg.num_layers, top_k=cfg.moe.n_activated_experts)
    results = measure(model, [r for g in groups for r in g], a.r3)
    line = asdict(results[a.r3])
    if a.r3:  # the unforced forward ran anyway (routing agreement): its logprob metrics too
        own = asdict(results[False])
        line["unforced"] = {k: own[k] for k in ("kl_mean", "kl_p99", "kl_max", "dlogp_mean", "dlogp_max")}
    return line


if __name__ == "__main__":
    main()

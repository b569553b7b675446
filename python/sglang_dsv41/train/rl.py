"""RL on SGLang rollouts: GRPO with DAPO's changes (train/grpo.py) on the arithmetic task.

    python -m sglang_dsv41.train.rl --server URL --model DIR [--steps 10] [--prompts 8] [--n 8] [--r3]
        [--out DIR] [--results benchmark/results/DATE-rl.md]

The server must serve DIR with `--rl-on-policy-target sglang_dsv41` (docs/rl.md): its `/server_info` is
checked before the model loads, and the loop stops with one line naming what is missing; every server error
is one line too. Each step:
  1. rollouts: `--prompts` train problems (chat-rendered as the server renders them) x `--n` samples each,
     from the server's `/generate` (logprobs of the sampled tokens, routed experts);
  2. rewards: exact match of the boxed answer (train/reward.py) + DAPO's overlong shaping;
     dynamic sampling keeps groups whose rewards differ and samples more prompts (up to
     `--max-rounds` rounds) to fill the batch;
  3. trainer: one update (train/policy_update.py): ONE forward of the QAT trainable model over the batch
     (train/policy.py; R3 forces the rollouts' experts), the clipped token-level DAPO loss of the sampling
     policy, AdamW; the same forward gives the step's train/serve mismatch (KL, |dlogp|, routing agreement);
  4. weight sync: the trained tensors (Engram tables and router bias stay frozen, never sent) into the
     running server (train/weight_sync.py), then the next step's rollouts come from the new weights
     (each rollout's weight_version is checked).
Held-out accuracy (greedy, test split, through the server) at step 0, every `--eval-every` steps and at
the end. Writes `rl.jsonl` (one line per step), `rl.png` (reward and mismatch per step) under `--out`,
and with `--results` a markdown table.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from tqdm import tqdm

from sglang_dsv41.train import task
from sglang_dsv41.train.grpo import DAPOConfig, informative, overlong_penalty
from sglang_dsv41.train.policy_update import policy_update
from sglang_dsv41.train.reward import reward
from sglang_dsv41.train.rollout import Rollout, ServerClient, ServerError, derive_seed, require_rl_server
from sglang_dsv41.train.weight_sync import WeightSync


@dataclass(frozen=True)
class Family:
    """A problem family outside task.py's levels: a in [a_lo, a_hi], b in [b_lo, b_hi], op from `ops`
    (e.g. "1-9,10-99,*": one-digit times two-digit, which the default's SFT data never shows). Train /
    test split by task.split_of with level FAMILY_LEVEL and `heldout_percent` (disjoint). With
    `unseen_level` L, only problems in level L's test split belong to the family: problems of level L's
    shape that the SFT data (level L's train split) never held, e.g. "10-99,2-9,*" with L = 2."""

    a: tuple[int, int]
    b: tuple[int, int]
    ops: str
    unseen_level: int | None = None
    heldout_percent: int = task.TEST_PERCENT

    @staticmethod
    def parse(spec: str, unseen_level: int | None = None, heldout_percent: int = task.TEST_PERCENT) -> "Family":
        try:
            ra, rb, ops = spec.split(",")
            a = tuple(int(x) for x in ra.split("-"))
            b = tuple(int(x) for x in rb.split("-"))
        except ValueError:
            raise ValueError(f"--family must look like A_LO-A_HI,B_LO-B_HI,OPS (e.g. 1-9,10-99,*), got {spec!r}") from None
        if len(a) != 2 or len(b) != 2 or a[0] > a[1] or b[0] > b[1] or min(a + b) < 0 or not ops or set(ops) - set(task.OPS):
            raise ValueError(f"--family: bad ranges or operators in {spec!r} (operators from {''.join(task.OPS)})")
        if unseen_level is not None and unseen_level not in task.RANGES:
            raise ValueError(f"--family-unseen-level must be one of {sorted(task.RANGES)}, got {unseen_level}")
        if not 0 < heldout_percent < 100:
            raise ValueError(f"--family-heldout-percent must be in 1..99, got {heldout_percent}")
        return Family(a, b, ops, unseen_level, heldout_percent)

    def split(self, a: int, op: str, b: int) -> str | None:
        """'train' or 'test', or None for a problem outside the family (seen by level `unseen_level`'s SFT)."""
        if self.unseen_level is not None and task.split_of(task.Problem(self.unseen_level, a, op, b)) != "test":
            return None
        return task.split_of(task.Problem(FAMILY_LEVEL, a, op, b), self.heldout_percent)

    def problems(self, n: int, split: str, seed: int) -> list[task.Problem]:
        """n problems of `split` drawn with replacement, deterministic in (split, seed)."""
        rng = np.random.default_rng([task.SPLITS[split], FAMILY_LEVEL, seed])
        out: list[task.Problem] = []
        for _ in range(1000 * n):
            a, op, b = (int(rng.integers(self.a[0], self.a[1] + 1)), self.ops[int(rng.integers(len(self.ops)))],
                        int(rng.integers(self.b[0], self.b[1] + 1)))
            if self.split(a, op, b) == split:
                out.append(task.Problem(FAMILY_LEVEL, a, op, b))
                if len(out) == n:
                    return out
        raise ValueError(f"the family has too few {split} problems")

    def pool(self, split: str, limit: int = 100_000) -> list[task.Problem] | None:
        """Every problem of `split`, in order; None when the family has more than `limit` problems in all."""
        if (self.a[1] - self.a[0] + 1) * (self.b[1] - self.b[0] + 1) * len(self.ops) > limit:
            return None
        return [task.Problem(FAMILY_LEVEL, a, op, b) for a in range(self.a[0], self.a[1] + 1) for op in self.ops
                for b in range(self.b[0], self.b[1] + 1) if self.split(a, op, b) == split]

    def heldout(self, n: int, seed: int) -> list[task.Problem]:
        """The held-out problems: each test problem once when there are at most n, else n drawn."""
        pool = self.pool("test")
        return pool if pool is not None and len(pool) <= n else self.problems(n, "test", seed)


FAMILY_LEVEL = 0
"""Level field of family problems (no task.py level is 0), so their split hash is their own."""


@dataclass
class Group:
    problem: task.Problem
    rollouts: list[Rollout]
    scores: list[float]
    """task reward (exact match) per sample."""
    shaped: torch.Tensor
    """task reward + overlong shaping, fp32 [n]."""


class RLRun:
    def __init__(self, a: argparse.Namespace):
        from sglang_dsv41.embedded import resolve_model_path
        from sglang_dsv41.train.trainable import load_trainable, trainable_parameters

        self.a = a
        self.model_dir = resolve_model_path(a.model)
        self.model = load_trainable(self.model_dir, device=a.device)
        self.cfg = self.model.cfg
        self.renderer = task.ChatRenderer(self.model_dir)
        self.client = ServerClient(a.server)
        self.dapo = DAPOConfig(eps_low=a.eps_low, eps_high=a.eps_high, overlong_buffer=a.overlong_buffer)
        self.params = [p for _, p in trainable_parameters(self.model)]
        self.opt = torch.optim.AdamW(self.params, lr=a.lr, betas=(0.9, 0.99), weight_decay=0.0)
        self.sync = WeightSync(self.client, Path(a.out) / "sync")
        self.version = "rl-step-0"
        self.prompt_cursor = 0
        self.family = (Family.parse(a.family, a.family_unseen_level, a.family_heldout_percent)
                       if a.family else None)

    def problems(self, level: int, n: int, split: str, seed: int) -> list[task.Problem]:
        """task.problems of `level`, or of the --family when one is given."""
        return self.family.problems(n, split, seed) if self.family else task.problems(level, n, split, seed=seed)

    # ------------------------------------------------------------------ server
    def push(self, step: int) -> float:
        from sglang_dsv41.train.export import checkpoint_tensors

        t0 = time.perf_counter()
        self.version = f"rl-step-{step}"
        self.sync.push(checkpoint_tensors(self.model, include_frozen=False), self.cfg, self.version)
        return time.perf_counter() - t0

    def _sample(self, probs: list[task.Problem], n: int, temperature: float, seed: int = 0) -> list[list[Rollout]]:
        """`seed`: the request's first sampling seed (rollout.ServerClient.sample; greedy requests ignore it)."""
        groups = self.client.sample([self.renderer.prompt(p.question) for p in probs], n, self.a.max_new_tokens,
                                    temperature=temperature, routed_experts=self.a.routing, layers=self.cfg.num_layers,
                                    top_k=self.cfg.moe.n_activated_experts, stop_token_ids=[self.renderer.eos_id],
                                    seed=seed)
        stale = {r.weight_version for g in groups for r in g} - {self.version}
        if stale:
            raise ServerError(f"rollouts from weight version {sorted(stale)}, expected {self.version}")
        return groups

    def check_exact(self) -> float:
        """CPU only: one greedy rollout of the pushed starting weights, recomputed by the trainer, must
        match the server's logprobs exactly (the same forward on the same weights). Raises ServerError
        otherwise. The start-up check (rollout.require_rl_server) already matched the usual causes: the
        torch thread count (MKL splits the K reduction of fp32 GEMMs over threads, and the FP8 roundings and
        top-k turn that last bit into different tokens' logprobs; measured: |dlogp| up to 1.9 with 1 trainer
        thread against a 2-thread server), MKL's code path and the deterministic mode."""
        from sglang_dsv41.train.logprobs import response_logprobs

        prob = self.problems(self.a.level, 1, "train", self.a.seed * 1_000_003 + 999_983)[0]
        ro = self._sample([prob], 1, 0.0)[0][0]
        with torch.no_grad():
            lp = response_logprobs(self.model, ro.prompt, ro.response)[0].cpu()
        d = float((lp - torch.tensor(ro.logprobs)).abs().max())
        if d != 0.0:
            raise ServerError(
                f"the trainer's logprobs differ from the server's on the same weights (max |dlogp| {d:.3g}, "
                f"trainer at {torch.get_num_threads()} torch threads); is the server serving another checkpoint "
                f"or another sglang-dsv41? Pass --no-check-exact to train anyway.")
        return d

    def _score(self, ro: Rollout, p: task.Problem) -> float:
        return reward(self.renderer.tokenizer.decode(ro.response, skip_special_tokens=True), p.answer)

    def evaluate(self) -> float:
        probs = (self.family.heldout(self.a.eval_n, self.a.seed) if self.family else
                 task.problems(self.a.eval_level, self.a.eval_n, "test", seed=self.a.seed))
        groups = self._sample(probs, 1, 0.0)
        return sum(self._score(g[0], p) for g, p in zip(groups, probs)) / len(probs)

    def rollouts(self, step: int) -> tuple[list[Group], dict]:
        """Dynamic sampling: rounds of `--prompts` fresh train problems until `--prompts` informative groups."""
        kept, scores, sampled = [], [], 0
        for rnd in range(self.a.max_rounds):
            probs = self.problems(self.a.level, self.a.prompts, "train", self.a.seed * 1_000_003 + self.prompt_cursor)
            self.prompt_cursor += 1
            # the samples of every (step, round) get seeds of their own (deterministic sampling: equal seeds,
            # equal samples)
            seed = derive_seed(self.a.seed, step, rnd)
            for p, g in zip(probs, self._sample(probs, self.a.n, self.a.temperature, seed)):
                sc = [self._score(r, p) for r in g]
                shaped = torch.tensor([s + overlong_penalty(len(r.response), self.a.max_new_tokens, self.dapo.overlong_buffer,
                                                            self.dapo.overlong_factor) for s, r in zip(sc, g)])
                scores += sc
                sampled += 1
                if informative(shaped):
                    kept.append(Group(p, g, sc, shaped))
            if len(kept) >= self.a.prompts:
                break
        kept = kept[: self.a.prompts]
        lengths = [len(r.response) for g in kept for r in g.rollouts]
        return kept, {"reward": sum(scores) / len(scores), "groups_sampled": sampled, "groups_kept": len(kept),
                      "response_len": sum(lengths) / len(lengths) if lengths else None}

    # ------------------------------------------------------------------ trainer
    def train_step(self, groups: list[Group]) -> dict:
        return policy_update(self.model, self.opt, self.params, groups, self.dapo, temperature=self.a.temperature,
                             r3=self.a.r3, clip_grad=self.a.clip_grad)


def run(a: argparse.Namespace) -> list[dict]:
    out_dir = Path(a.out)
    out_dir.mkdir(parents=True, exist_ok=True)
    require_rl_server(ServerClient(a.server), a.device, a.threads)  # before the model loads
    rl = RLRun(a)
    rl.push(0)  # the server serves exactly the trainer's (exported) weights from the first rollout on
    if a.check_exact and str(a.device) == "cpu":
        rl.check_exact()
    log: list[dict] = []
    heldout = rl.evaluate()
    t_start = time.perf_counter()
    bar = tqdm(range(1, a.steps + 1), desc="rl", unit="step", file=sys.stderr)
    with open(out_dir / "rl.jsonl", "w") as f:
        for step in bar:
            t0 = time.perf_counter()
            groups, roll = rl.rollouts(step)
            t_roll = time.perf_counter() - t0
            stats = rl.train_step(groups) if groups else {}
            t_train = time.perf_counter() - t0 - t_roll
            t_sync = rl.push(step)
            rec = {"step": step, **roll, **stats, "heldout": None, "rollout_s": round(t_roll, 2),
                   "train_s": round(t_train, 2), "sync_s": round(t_sync, 2)}
            if step % a.eval_every == 0 or step == a.steps:
                rec["heldout"] = rl.evaluate()
            if step == 1:
                rec["heldout_start"] = heldout
            log.append(rec)
            f.write(json.dumps(rec) + "\n")
            f.flush()
            bar.set_postfix(reward=f"{roll['reward']:.2f}", kept=f"{roll['groups_kept']}/{roll['groups_sampled']}",
                            kl=f"{stats.get('kl_mean', float('nan')):.1e}", heldout=rec["heldout"])
    total_s = time.perf_counter() - t_start
    _plot(out_dir / "rl.png", log, heldout)
    if a.results:
        _results(Path(a.results), a, log, heldout, total_s)
    return log


def _plot(path: Path, log: list[dict], heldout0: float) -> None:
    from sglang_dsv41.train.plot import line_panels

    steps = [0] + [r["step"] for r in log]
    line_panels(path, steps, [
        ("reward", {"train reward (sampled)": [None] + [r["reward"] for r in log],
                    "held-out accuracy (greedy)": [heldout0] + [r["heldout"] for r in log]}),
        ("train/serve mismatch", {"KL mean": [None] + [r.get("kl_mean") for r in log],
                                  "|dlogp| mean": [None] + [r.get("dlogp_mean") for r in log]}),
    ], title="GRPO/DAPO on SGLang rollouts")


def _fmt(v, spec: str = ".3g") -> str:
    return "-" if v is None else format(v, spec)


def _family_text(a: argparse.Namespace) -> str:
    fam = Family.parse(a.family, a.family_unseen_level, a.family_heldout_percent)
    pools = {split: fam.pool(split) for split in ("train", "test")}
    sizes = " and ".join(f"{len(p)} {split}" for split, p in pools.items() if p is not None)
    unseen = f", only problems in level {fam.unseen_level}'s test split (never in the SFT data)" if fam.unseen_level else ""
    return (f"family {a.family}{unseen}; {fam.heldout_percent} % held out ({sizes} problems); rollouts from the "
            f"train split, greedy evaluation on the held-out split")


def _eval_n(a: argparse.Namespace) -> int:
    if not a.family:
        return a.eval_n
    return len(Family.parse(a.family, a.family_unseen_level, a.family_heldout_percent).heldout(a.eval_n, a.seed))


def _results(path: Path, a: argparse.Namespace, log: list[dict], heldout0: float, total_s: float) -> None:
    import platform

    import sglang

    k = min(5, len(log))
    first = sum(r["reward"] for r in log[:k]) / k
    last = sum(r["reward"] for r in log[-k:]) / k
    lines = [f"# RL (GRPO/DAPO) on SGLang rollouts, {time.strftime('%Y-%m-%d')}", "",
             f"- command: `python -m sglang_dsv41.train.rl {' '.join(a.argv)}`",
             f"- device: trainer {a.device}, {platform.processor() or platform.machine()}, {os.cpu_count()} CPU cores; "
             f"server: SGLang {sglang.__version__} at {a.server}",
             f"- torch {torch.__version__}, task generator v{task.GENERATOR_VERSION}",
             f"- {len(log)} steps in {total_s:.0f} s",
             f"- mean train reward, first {k} steps: {first:.3f}; last {k} steps: {last:.3f} (change {last - first:+.3f})",
             f"- sampling temperature {a.temperature} (the loss trains softmax(logits / T); held-out is greedy)",
             f"- problems: {_family_text(a) if a.family else f'level {a.level}'}",
             f"- held-out greedy accuracy ({f'family {a.family}' if a.family else f'level {a.eval_level}'}, {_eval_n(a)} test "
             f"problems): start {heldout0:.3f}, "
             f"end {log[-1]['heldout']:.3f}",
             f"- mismatch over all steps: max KL {max((r.get('kl_max') or 0) for r in log):.3g}, "
             f"max |dlogp| {max((r.get('dlogp_max') or 0) for r in log):.3g}", "",
             "| step | reward | held-out | groups kept | resp len | loss | clip frac | KL mean | KL max | mean abs dlogp | max abs dlogp | routing agree | s |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in log:
        lines.append(f"| {r['step']} | {r['reward']:.3f} | {_fmt(r['heldout'])} | {r['groups_kept']}/{r['groups_sampled']} | "
                     f"{_fmt(r['response_len'], '.1f')} | {_fmt(r.get('loss'), '.4f')} | {_fmt(r.get('clip_frac'), '.3f')} | "
                     f"{_fmt(r.get('kl_mean'))} | {_fmt(r.get('kl_max'))} | {_fmt(r.get('dlogp_mean'))} | "
                     f"{_fmt(r.get('dlogp_max'))} | {_fmt(r.get('routing_agreement'))} | "
                     f"{r['rollout_s'] + r['train_s'] + r['sync_s']:.0f} |")
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("\n".join(lines) + "\n")


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="python -m sglang_dsv41.train.rl", description=__doc__.split("\n")[0])
    p.add_argument("--server", required=True, help="URL of the SGLang server serving --model")
    p.add_argument("--model", default="deepseek-v4.1-tiny", help="the checkpoint the server serves (dir or alias)")
    p.add_argument("--steps", type=int, default=10)
    p.add_argument("--prompts", type=int, default=8, help="groups (prompts) per step after dynamic sampling")
    p.add_argument("--n", type=int, default=8, help="samples per prompt (group size)")
    p.add_argument("--level", type=int, default=2, help="task level of the training problems")
    p.add_argument("--max-new-tokens", type=int, default=16)
    p.add_argument("--temperature", type=float, default=1.0, help="sampling temperature; the loss trains the "
                   "tempered policy softmax(logits / T) (greedy evaluation is unchanged by T)")
    p.add_argument("--lr", type=float, default=1e-4)
    p.add_argument("--eps-low", type=float, default=0.2)
    p.add_argument("--eps-high", type=float, default=0.28)
    p.add_argument("--overlong-buffer", type=int, default=4)
    p.add_argument("--clip-grad", type=float, default=1.0)
    p.add_argument("--max-rounds", type=int, default=3, help="dynamic sampling: sampling rounds per step at most")
    p.add_argument("--r3", action="store_true", help="force the rollouts' routed experts in the trainer")
    p.add_argument("--no-routing", dest="routing", action="store_false",
                   help="do not request routed experts (server without --enable-return-routed-experts)")
    p.add_argument("--eval-level", type=int, default=2)
    p.add_argument("--family", default=None, help="problems of a family A_LO-A_HI,B_LO-B_HI,OPS (e.g. 1-9,10-99,*) "
                   "instead of --level / --eval-level: train split for rollouts, test split held out")
    p.add_argument("--family-unseen-level", type=int, default=None, help="keep only family problems in this "
                   "task level's test split (never in the SFT data), e.g. --family 10-99,2-9,* "
                   "--family-unseen-level 2: the level-2 multiplications the default was not trained on")
    p.add_argument("--family-heldout-percent", type=int, default=task.TEST_PERCENT,
                   help="percent of the family held out for the greedy evaluation")
    p.add_argument("--eval-n", type=int, default=50, help="held-out problems (a family with at most this many "
                   "held-out problems evaluates each once)")
    p.add_argument("--eval-every", type=int, default=5)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--device", default="cpu")
    p.add_argument("--threads", type=int, default=0, help="torch CPU threads (0: the server's count on the CPU, "
                   "else torch's default); another count than the server's is refused (docs/rl.md)")
    p.add_argument("--no-check-exact", dest="check_exact", action="store_false",
                   help="CPU: skip the start-up check that the trainer reproduces the server's logprobs exactly")
    p.add_argument("--out", default="rl_out", help="directory for rl.jsonl, rl.png and the weight-sync files")
    p.add_argument("--results", default=None, help="write a markdown results table here")
    a = p.parse_args(argv)
    a.argv = list(sys.argv[1:] if argv is None else argv)
    if a.r3 and not a.routing:
        p.error("--r3 needs routed experts; drop --no-routing")
    for flag in ("steps", "prompts", "n", "max_new_tokens", "max_rounds", "eval_n", "eval_every"):
        if getattr(a, flag) < 1:
            p.error(f"--{flag.replace('_', '-')} must be >= 1")
    if a.n < 2:
        p.error("--n must be >= 2 (group-relative advantages)")
    if a.seed < 0 or a.threads < 0:
        p.error("--seed and --threads must be >= 0")
    if not 0 < a.temperature <= 10:
        p.error(f"--temperature must be in (0, 10], got {a.temperature}")
    if not a.family and (a.family_unseen_level is not None or a.family_heldout_percent != task.TEST_PERCENT):
        p.error("--family-unseen-level / --family-heldout-percent apply to a --family; add one")
    if a.family:
        try:
            Family.parse(a.family, a.family_unseen_level, a.family_heldout_percent)
        except ValueError as e:
            p.error(str(e))
    if a.level not in task.RANGES or a.eval_level not in task.RANGES:
        p.error(f"--level / --eval-level must be one of {sorted(task.RANGES)}")
    os.environ.setdefault("ATEN_CPU_CAPABILITY", "default")  # the server's CPU kernels (docs/numerics.md)
    torch.manual_seed(a.seed)
    if a.threads:
        torch.set_num_threads(a.threads)
    try:
        log = run(a)
    except ServerError as e:
        raise SystemExit(f"train.rl: {e}") from None
    last = log[-1]
    print(json.dumps({"steps": len(log), "reward_last": last["reward"], "heldout_last": last["heldout"],
                      "kl_max": max((r.get("kl_max") or 0) for r in log)}))


if __name__ == "__main__":
    main()

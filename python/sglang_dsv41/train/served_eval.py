"""Held-out accuracy of a served model through the OpenAI chat API (the real serving path).

    python -m sglang_dsv41.train.served_eval --server http://127.0.0.1:30000 [--level 2] [--n 300]

Sends each held-out (test-split) problem of `--level` (train/task.py, seed `--seed`) as one chat
request `{"role": "user", "content": "What is a+b?"}` with greedy decoding (temperature 0,
`--max-tokens`), scores the reply with the task's reward (exact match of the last `\\boxed{...}`),
and prints one JSON line: accuracy overall and per operator, the number of problems, and a few
wrong replies. Any server model works (no RL flag needed); a server error stops it with one line.
"""

from __future__ import annotations

import argparse
import json
from concurrent.futures import ThreadPoolExecutor

from sglang_dsv41.train import task
from sglang_dsv41.train.reward import reward
from sglang_dsv41.train.rollout import ServerError, request_json


def ask(server: str, model: str, question: str, max_tokens: int, timeout: float = 300.0) -> str:
    """The greedy chat reply to `question`; ServerError (one line) when the server fails or answers no reply."""
    body = {"model": model, "messages": [{"role": "user", "content": question}], "temperature": 0.0,
            "max_tokens": max_tokens}
    out = request_json("POST", server.rstrip("/"), "/v1/chat/completions", body, timeout)
    try:
        return out["choices"][0]["message"]["content"] or ""
    except (KeyError, IndexError, TypeError):
        raise ServerError("POST /v1/chat/completions: no choices[0].message in the answer") from None


def evaluate(server: str, model: str, level: int, n: int, seed: int = 0, max_tokens: int = 16,
             workers: int = 8) -> dict:
    probs = task.problems(level, n, "test", seed)
    with ThreadPoolExecutor(workers) as pool:
        replies = list(pool.map(lambda p: ask(server, model, p.question, max_tokens), probs))
    right = [reward(text, p.answer) == 1.0 for p, text in zip(probs, replies)]
    out = {"level": level, "n": n, "seed": seed, "accuracy": sum(right) / n}
    for op in task.OPS:
        sel = [r for p, r in zip(probs, right) if p.op == op]
        out[op] = {"n": len(sel), "accuracy": sum(sel) / max(1, len(sel))}
    out["wrong_examples"] = [{"q": p.question, "reply": t} for p, t, r in zip(probs, replies, right) if not r][:5]
    return out


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description="Held-out task accuracy of a served model (chat API, greedy).")
    ap.add_argument("--server", required=True, help="e.g. http://127.0.0.1:30000")
    ap.add_argument("--model", default="deepseek-v4.1-tiny", help="the served model name")
    ap.add_argument("--level", type=int, default=2)
    ap.add_argument("--n", type=int, default=300)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--max-tokens", type=int, default=16)
    ap.add_argument("--workers", type=int, default=8, help="concurrent requests")
    a = ap.parse_args(argv)
    if a.n < 1:
        ap.error("--n must be >= 1")
    if a.level not in task.RANGES:
        ap.error(f"--level must be one of {sorted(task.RANGES)}")
    if a.workers < 1 or a.max_tokens < 1:
        ap.error("--workers and --max-tokens must be >= 1")
    try:
        result = evaluate(a.server, a.model, a.level, a.n, a.seed, a.max_tokens, a.workers)
    except ServerError as e:
        raise SystemExit(f"served_eval: {e}") from None
    print(json.dumps(result))


if __name__ == "__main__":
    main()

"""Rollouts from a running SGLang server, through its real HTTP API (`/generate`), and the server's settings.

The server is started with `--rl-on-policy-target sglang_dsv41` (docs/rl.md "Starting a server for RL"): raw
logprobs (`log_softmax` of the raw logits, what the trainer computes), routed experts, full prefill,
deterministic numerics and, on the CPU, one MKL code path. The trainer CLIs read its `/server_info` at start
(`require_rl_server`) and stop with one line naming what is missing. Every failed call raises `ServerError`,
whose message is one line.

One `/generate` request samples every group: one row per sample, with a sampling seed of its own (under
deterministic inference SGLang's sampling noise depends only on the seed, the position and the token), each
with the logprob of each sampled token and, for routing replay (R3), the routed experts of every token that
ran a forward.

Routed-expert encoding (SGLang, `meta_info["routed_experts"]`): base64 of little-endian int32,
shape [tokens, num_hidden_layers, num_experts_per_tok], one row per token that ran a forward:
positions [0, prompt + response - 1) (the last sampled token never runs a forward), ids in top-k
order (docs/sglang.md "Routed experts").
"""

from __future__ import annotations

import base64
import os
import re
from dataclasses import dataclass
from typing import Any, Mapping

import numpy as np
import requests
import torch

from sglang_dsv41.determinism import DETERMINISTIC_ENV, deterministic
from sglang_dsv41.sglang.model.rl_mode import STATE_KEY
from sglang_dsv41.sglang.model.server_args import RL_FLAG, RL_TARGET

MAX_SEED = 2**63 - 1
"""SGLang's bound on `sampling_seed` (int64)."""
MESSAGE_CHARS = 300


class ServerError(RuntimeError):
    """A failed call to the SGLang server, or a server this trainer cannot use; the message is one line."""


@dataclass
class Rollout:
    prompt: list[int]
    response: list[int]
    logprobs: list[float]
    """server logprob of each response token (same length as `response`)."""
    finish: str
    """'stop' (EOS / stop token) or 'length' (hit max_new_tokens)."""
    routed_experts: torch.Tensor | None = None
    """int32 [len(prompt) + len(response) - 1, layers, top_k], or None when not requested."""
    weight_version: str | None = None

    @property
    def sequence(self) -> list[int]:
        return self.prompt + self.response


def decode_routed_experts(b64: str, layers: int, top_k: int) -> torch.Tensor:
    """SGLang's base64 int32 payload -> int32 [tokens, layers, top_k]."""
    flat = np.frombuffer(base64.b64decode(b64), dtype="<i4")
    if flat.size % (layers * top_k):
        raise ValueError(f"routed_experts payload of {flat.size} ids is not a multiple of layers x top_k = {layers * top_k}")
    return torch.from_numpy(flat.astype(np.int32).reshape(-1, layers, top_k))


def one_line(text: str, limit: int = MESSAGE_CHARS) -> str:
    text = " ".join(str(text).split())
    return text if len(text) <= limit else text[:limit - 3] + "..."


def _body_message(r: requests.Response) -> str:
    """The error an HTTP response carries: its JSON `message` / `error` / `detail`, else its first text line."""
    try:
        body = r.json()
    except ValueError:
        body = None
    if isinstance(body, dict):
        for key in ("message", "error", "detail"):
            value = body.get(key)
            if isinstance(value, dict):
                value = value.get("message") or value
            elif isinstance(value, list):  # FastAPI's validation errors
                value = "; ".join(str(e.get("msg", e)) if isinstance(e, dict) else str(e) for e in value)
            if value:
                return one_line(value)
    text = r.text
    if "html" in r.headers.get("content-type", ""):
        text = re.sub(r"<[^>]*>", "\n", text)
    lines = [ln for ln in text.splitlines() if ln.strip()]
    return one_line(lines[0]) if lines else "(empty body)"


def request_json(method: str, url: str, path: str, body: dict | None = None, timeout: float = 60.0) -> Any:
    """One call to the server at `url` -> its JSON body. Raises ServerError (one line) for a refused or timed-out
    connection, an HTTP error or a body that is not JSON."""
    try:
        r = requests.request(method, url + path, json=body, timeout=timeout)
    except (requests.exceptions.MissingSchema, requests.exceptions.InvalidSchema, requests.exceptions.InvalidURL):
        raise ServerError(f"{url!r} is not a server URL (e.g. http://127.0.0.1:30000)") from None
    except requests.Timeout as e:
        raise ServerError(f"{method} {path}: the SGLang server at {url} did not answer within {timeout:g} s "
                          f"({type(e).__name__})") from None
    except requests.RequestException as e:
        raise ServerError(f"cannot reach the SGLang server at {url} ({type(e).__name__})") from None
    if r.status_code >= 400:
        hint = " (ServerClient sends no API key)" if r.status_code == 401 else ""
        raise ServerError(f"{method} {path}: HTTP {r.status_code}{hint}: {_body_message(r)}")
    try:
        return r.json()
    except ValueError:
        raise ServerError(f"{method} {path}: HTTP {r.status_code} with a body that is not JSON: "
                          f"{_body_message(r)}") from None


class ServerClient:
    """The HTTP calls the trainer makes: read the settings, sample groups, update weights."""

    def __init__(self, url: str, timeout: float = 1800.0):
        self.url, self.timeout = url.rstrip("/"), timeout

    def server_info(self) -> dict:
        """`/server_info`: the resolved server args, and each scheduler's state under `internal_states`."""
        info = request_json("GET", self.url, "/server_info")
        if not isinstance(info, dict):
            raise ServerError(f"GET /server_info: expected a JSON object, got {type(info).__name__}")
        return info

    def model_info(self) -> dict:
        return request_json("GET", self.url, "/model_info")

    def sample(self, prompts: list[list[int]], n: int, max_new_tokens: int, *, temperature: float = 1.0,
               routed_experts: bool = False, layers: int = 0, top_k: int = 0, seed: int = 0,
               stop_token_ids: list[int] | None = None) -> list[list[Rollout]]:
        """Sample `n` responses per prompt in one batched `/generate` request -> one group per prompt.
        The request has one row per sample, prompt-major, and row k samples with `sampling_seed = seed + k`:
        under deterministic inference a shared seed (SGLang's `n` copies one request's parameters; an unseeded
        row gets 42) would make the n samples of a group identical. `layers` / `top_k` shape the routed experts
        (required with `routed_experts`)."""
        if n < 1:
            raise ValueError(f"n must be >= 1, got {n}")
        rows = len(prompts) * n
        if not 0 <= seed <= MAX_SEED - rows:
            raise ValueError(f"seed must be in [0, 2**63 - 1 - {rows}] for {rows} rows, got {seed}")
        if not prompts:
            return []
        params = {"max_new_tokens": max_new_tokens, "temperature": temperature}
        if stop_token_ids:
            params["stop_token_ids"] = stop_token_ids
        body = {"input_ids": [p for p in prompts for _ in range(n)],
                "sampling_params": [{**params, "sampling_seed": seed + k} for k in range(rows)],
                "return_logprob": True}
        if routed_experts:
            body["return_routed_experts"] = True
        out = request_json("POST", self.url, "/generate", body, self.timeout)
        if isinstance(out, dict):
            out = [out]
        if not isinstance(out, list) or len(out) != rows:
            got = len(out) if isinstance(out, list) else type(out).__name__
            raise ServerError(f"POST /generate: {got} results for {len(prompts)} prompts x n={n}")
        rollouts = [self._rollout(prompts[k // n], o, k, routed_experts, layers, top_k) for k, o in enumerate(out)]
        return [rollouts[i * n:(i + 1) * n] for i in range(len(prompts))]

    @staticmethod
    def _rollout(prompt: list[int], o: Any, k: int, routed: bool, layers: int, top_k: int) -> Rollout:
        where = f"POST /generate: result {k}"
        try:
            meta = o["meta_info"]
            lps = meta["output_token_logprobs"]
            response = [int(t) for t in o["output_ids"]]
        except (KeyError, TypeError, ValueError) as e:
            raise ServerError(f"{where} is not a generate result with logprobs ({type(e).__name__}: {e})") from None
        if [int(x[1]) for x in lps] != response:
            raise ServerError(f"{where}: output_token_logprobs do not match output_ids")
        fr = meta.get("finish_reason") or {}
        experts = None
        if routed:
            if not meta.get("routed_experts"):
                raise ServerError(f"{where} has no routed_experts: start the server with {RL_FLAG}")
            try:
                experts = decode_routed_experts(meta["routed_experts"], layers, top_k)
            except ValueError as e:
                raise ServerError(f"{where}: {e}") from None
            want = len(prompt) + len(response) - 1
            if experts.shape[0] != want:
                raise ServerError(f"{where}: routed_experts cover {experts.shape[0]} tokens, expected {want}")
        return Rollout(prompt=list(prompt), response=response, logprobs=[float(x[0]) for x in lps],
                       finish="length" if fr.get("type") == "length" else "stop", routed_experts=experts,
                       weight_version=meta.get("weight_version"))

    def update_weights_from_disk(self, path: str, weight_version: str | None = None) -> dict:
        """Load the checkpoint (or partial checkpoint) at `path` into the running server. SGLang
        flushes its radix cache afterwards (`flush_cache` defaults to true; cached KV of the old
        weights must never be reused). Raises ServerError if the server refuses."""
        body = {"model_path": str(path)}
        if weight_version is not None:
            body["weight_version"] = weight_version
        out = request_json("POST", self.url, "/update_weights_from_disk", body, self.timeout)
        if not isinstance(out, dict) or not out.get("success"):
            message = out.get("message") if isinstance(out, dict) else out
            raise ServerError(f"POST /update_weights_from_disk: {one_line(message)}")
        return out


def derive_seed(*keys: int) -> int:
    """A sampling seed below 2**62 from non-negative integer keys (e.g. run seed, step, round), leaving room for
    `sample`'s per-row offsets."""
    lo, hi = np.random.SeedSequence(list(keys)).generate_state(2, np.uint32)
    return (int(hi) << 30 | int(lo) >> 2) & (2**62 - 1)


# ---------------------------------------------------------------------- the server an RL trainer needs
_RL_FIELDS = {"enable_deterministic_inference": True, "enable_return_routed_experts": True,
              "enable_decoder_swa_bounded_replay": False}
"""Resolved server args our RL target sets, as `/server_info` reports them."""
_RL_STATE = ("deterministic", "return_original_logprob")
_CPU_ENV = (("MKL_CBWR", "mkl_cbwr"), ("ATEN_CPU_CAPABILITY", "aten_cpu_capability"))
"""Variables read once per process that change a CPU forward's bits: (variable, key of the server's state)."""


def _states(info: dict) -> list:
    states = info.get("internal_states")
    return [s.get(STATE_KEY) if isinstance(s, dict) else None for s in states] if isinstance(states, list) else []


def rl_server_problem(info: dict, url: str, trainer_device: str, threads: int,
                      environ: Mapping[str, str] = os.environ) -> str | None:
    """The first reason this trainer cannot train on the server whose `/server_info` is `info`, as one line, or
    None. `threads`: the trainer's --threads (0: adopt the server's). On the CPU a forward's last bits depend on
    MKL's code path, ATen's CPU kernels and the thread count, so both sides must agree on them."""
    target = info.get("rl_on_policy_target")
    if target != RL_TARGET:
        return (f"the server at {url} was not started with {RL_FLAG} (rl_on_policy_target is {target!r}); "
                f"restart it with that flag")
    stale = "its sglang-dsv41 is not this trainer's version"
    for field, want in _RL_FIELDS.items():
        if info.get(field) is not want:
            return f"the server reports {field}={info.get(field)!r} under {RL_FLAG}; {stale}"
    states = _states(info)
    if not states or any(not isinstance(s, dict) for s in states):
        return f"the server reports no internal_states[].{STATE_KEY} under {RL_FLAG}; {stale}"
    for key in _RL_STATE:
        bad = [s.get(key) for s in states if s.get(key) is not True]
        if bad:
            return f"the server reports {STATE_KEY}.{key}={bad[0]!r} under {RL_FLAG}; {stale}"
    try:
        if DETERMINISTIC_ENV in environ and not deterministic(environ):
            return (f"{DETERMINISTIC_ENV}={environ[DETERMINISTIC_ENV]!r} in this trainer contradicts the server's "
                    f"deterministic mode: unset it")
    except ValueError as e:
        return str(e)
    if not (str(trainer_device) == "cpu" and info.get("device") == "cpu"):
        return None
    state = states[0]
    for var, key in _CPU_ENV:
        if state.get(key) != environ.get(var):
            fix = f"export {var}={state.get(key)}" if state.get(key) is not None else f"unset {var}"
            return (f"the server runs {var}={state.get(key)}, this trainer {var}={environ.get(var)}: {fix} before "
                    f"starting it")
    server_threads = state.get("torch_threads")
    if threads and threads != server_threads:
        return (f"the server's scheduler runs {server_threads} torch threads, this trainer {threads}: pass --threads "
                f"{server_threads} (CPU logprobs depend on the thread count)")
    return None


def require_rl_server(client: ServerClient, trainer_device: str, threads: int) -> dict:
    """Check the server (`rl_server_problem`; ServerError with its line), then compute as it does: our
    deterministic mode, and on the CPU with `threads` 0 the server's torch thread count. -> its `/server_info`."""
    info = client.server_info()
    problem = rl_server_problem(info, client.url, trainer_device, threads)
    if problem:
        raise ServerError(problem)
    os.environ[DETERMINISTIC_ENV] = "1"  # read at every call (determinism.py)
    if not threads and str(trainer_device) == "cpu" and info.get("device") == "cpu":
        torch.set_num_threads(int(_states(info)[0]["torch_threads"]))
    return info

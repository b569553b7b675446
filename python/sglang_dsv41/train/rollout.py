"""Rollouts from a running SGLang server, through its real HTTP API (`/generate`).

One request per prompt asks for a group of `n` samples with the logprob of each sampled token and,
for routing replay (R3), the routed experts of every token that ran a forward. The server must be
started with `--enable-return-routed-experts` for `routed_experts=True`, and with
`SGLANG_RETURN_ORIGINAL_LOGPROB=1` so the returned logprobs are `log_softmax` of the raw logits
(what the trainer computes; docs/rl.md "Logprobs of the raw distribution").

Routed-expert encoding (SGLang, `meta_info["routed_experts"]`): base64 of little-endian int32,
shape [tokens, num_hidden_layers, num_experts_per_tok], one row per token that ran a forward:
positions [0, prompt + response - 1) (the last sampled token never runs a forward), ids in top-k
order (docs/sglang.md "Routed experts").
"""

from __future__ import annotations

import base64
from dataclasses import dataclass

import numpy as np
import requests
import torch


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


class ServerClient:
    """The HTTP calls the trainer makes: sample groups, update weights, flush."""

    def __init__(self, url: str, timeout: float = 1800.0):
        self.url, self.timeout = url.rstrip("/"), timeout

    def _post(self, path: str, body: dict) -> requests.Response:
        r = requests.post(self.url + path, json=body, timeout=self.timeout)
        if r.status_code >= 400:
            raise RuntimeError(f"POST {path} -> HTTP {r.status_code}: {r.text[:500]}")
        return r

    def model_info(self) -> dict:
        r = requests.get(self.url + "/model_info", timeout=30)
        r.raise_for_status()
        return r.json()

    def sample(self, prompts: list[list[int]], n: int, max_new_tokens: int, *, temperature: float = 1.0,
               routed_experts: bool = False, layers: int = 0, top_k: int = 0, seed: int | None = None,
               stop_token_ids: list[int] | None = None) -> list[list[Rollout]]:
        """Sample `n` responses per prompt in one batched `/generate` request -> one group per prompt.
        `layers` / `top_k` shape the routed experts (required with `routed_experts`)."""
        params = {"max_new_tokens": max_new_tokens, "temperature": temperature, "n": n}
        if seed is not None:
            params["sampling_seed"] = seed
        if stop_token_ids:
            params["stop_token_ids"] = stop_token_ids
        body = {"input_ids": prompts, "sampling_params": params, "return_logprob": True}
        if routed_experts:
            body["return_routed_experts"] = True
        out = self._post("/generate", body).json()
        if isinstance(out, dict):
            out = [out]
        if len(out) != len(prompts) * n:
            raise RuntimeError(f"/generate returned {len(out)} results for {len(prompts)} prompts x n={n}")
        groups: list[list[Rollout]] = []
        for i, prompt in enumerate(prompts):
            # SGLang orders parallel samples prompt-major: results [i*n, (i+1)*n) belong to prompt i.
            groups.append([self._rollout(prompt, o, routed_experts, layers, top_k) for o in out[i * n:(i + 1) * n]])
        return groups

    @staticmethod
    def _rollout(prompt: list[int], o: dict, routed: bool, layers: int, top_k: int) -> Rollout:
        meta = o["meta_info"]
        lps = meta["output_token_logprobs"]
        response = [int(t) for t in o["output_ids"]]
        if [int(x[1]) for x in lps] != response:
            raise RuntimeError("output_token_logprobs do not match output_ids")
        fr = meta.get("finish_reason") or {}
        experts = None
        if routed:
            if not meta.get("routed_experts"):
                raise RuntimeError("the server returned no routed_experts: start it with --enable-return-routed-experts")
            experts = decode_routed_experts(meta["routed_experts"], layers, top_k)
            want = len(prompt) + len(response) - 1
            if experts.shape[0] != want:
                raise RuntimeError(f"routed_experts cover {experts.shape[0]} tokens, expected {want}")
        return Rollout(prompt=list(prompt), response=response, logprobs=[float(x[0]) for x in lps],
                       finish="length" if fr.get("type") == "length" else "stop", routed_experts=experts,
                       weight_version=meta.get("weight_version"))

    def update_weights_from_disk(self, path: str, weight_version: str | None = None) -> dict:
        """Load the checkpoint (or partial checkpoint) at `path` into the running server. SGLang
        flushes its radix cache afterwards (`flush_cache` defaults to true; cached KV of the old
        weights must never be reused). Raises if the server refuses."""
        body = {"model_path": str(path)}
        if weight_version is not None:
            body["weight_version"] = weight_version
        out = self._post("/update_weights_from_disk", body).json()
        if not out.get("success"):
            raise RuntimeError(f"update_weights_from_disk failed: {out.get('message')}")
        return out

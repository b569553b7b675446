"""Build a `DeepseekV41` from a checkpoint directory (config.json + safetensors + tokenizer)."""

from __future__ import annotations

import os

import torch

from sglang_dsv41.checkpoint.io import read_tensors
from sglang_dsv41.config import ModelConfig
from sglang_dsv41.embedded import resolve_model_path
from sglang_dsv41.layers.transformer import DeepseekV41


def load_model(path: str | os.PathLike, device: str | torch.device = "cpu", progress: bool = True, sharding=None) -> DeepseekV41:
    """`path` is a checkpoint directory or an embedded alias (`deepseek-v4.1-tiny`).
    Parameters are allocated on the meta device and replaced by the validated checkpoint tensors,
    so nothing is materialised twice. The Engram token map is built from the directory's tokenizer.
    `sharding` (parallel/load.py `Sharding`): `apply(model)` transforms the meta model into one
    rank's part, `select(name)` says which slice of each tensor that rank reads (read_tensors)."""
    path = resolve_model_path(path)
    cfg = ModelConfig.from_pretrained(path)
    with torch.device("meta"):
        model = DeepseekV41(cfg)
    if sharding is not None:
        sharding.apply(model)
    select = sharding.select if sharding is not None else None
    tensors = read_tensors(path, cfg, device=device, progress=progress, select=select)
    model.load_state_dict(tensors, strict=True, assign=True)
    for p in model.parameters():
        p.requires_grad_(False)
    if cfg.engram is not None:
        from sglang_dsv41.tokenizer.token_map import token_map_tensor

        model.set_token_map(token_map_tensor(str(path), device=device))
    else:
        model.engram_token_map = torch.zeros(0, dtype=torch.int64, device=device)
    return model.eval()


def replace_tensors(model: DeepseekV41, tensors: dict[str, torch.Tensor]) -> None:
    """Copy validated tensors {released name: tensor} into `model`'s parameters in place, so every
    reference to a parameter (a runtime, kernel slots, stacked experts, which are views) stays valid,
    then refresh the copies derived from weights (`FP8Linear.keep_dequantized`). Names must be the
    model's; callers validate shapes and dtypes (checkpoint/update.py, export.checkpoint_tensors)."""
    state = model.state_dict(keep_vars=True)
    with torch.no_grad():
        for name, t in tensors.items():
            state[name].copy_(t)
    for m in model.modules():
        if "_dequantized" in m.__dict__:
            m.keep_dequantized(True)

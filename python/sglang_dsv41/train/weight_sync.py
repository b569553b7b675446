"""Weight sync: the trainer's weights into the running server, without a restart.

The trainer writes the tensors that changed (every trained tensor, in the released names and
dtypes, exactly what `export` writes: the serving roundings of the masters; the frozen Engram tables
and router bias are left out) into a partial checkpoint directory, one safetensors file, and asks
the server to load it through SGLang's `/update_weights_from_disk`. Our model class takes any subset
of its tensors (validated first, then copied in place) and SGLang flushes the radix cache, so the
next rollout is served by exactly these weights.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import torch
from safetensors.torch import save_file

from sglang_dsv41.checkpoint.io import check_tensors
from sglang_dsv41.config import ModelConfig
from sglang_dsv41.train.rollout import ServerClient

SYNC_FILE = "model.safetensors"


def write_partial_checkpoint(out_dir: str | os.PathLike, tensors: dict[str, torch.Tensor], cfg: ModelConfig) -> Path:
    """Write `tensors` (any subset of the checkpoint's, validated against the schema) as one safetensors
    file in `out_dir` (created; an older file there is replaced). Returns the directory."""
    check_tensors(tensors, cfg, where="the weight sync", complete=False)
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    tmp = out / (SYNC_FILE + ".tmp")
    save_file({n: t.detach().contiguous().cpu() for n, t in sorted(tensors.items())}, str(tmp), metadata={"format": "pt"})
    os.replace(tmp, out / SYNC_FILE)
    return out


class WeightSync:
    """Pushes trainer weights to one server; keeps the last `keep` sync directories under `root`."""

    def __init__(self, client: ServerClient, root: str | os.PathLike, keep: int = 2):
        self.client, self.root, self.keep = client, Path(root), keep
        self.dirs: list[Path] = []

    def push(self, tensors: dict[str, torch.Tensor], cfg: ModelConfig, version: str) -> Path:
        """Write, load into the server (weight_version `version`), prune old directories."""
        path = write_partial_checkpoint(self.root / version, tensors, cfg)
        self.client.update_weights_from_disk(str(path.resolve()), weight_version=version)
        self.dirs.append(path)
        while len(self.dirs) > self.keep:
            shutil.rmtree(self.dirs.pop(0), ignore_errors=True)
        return path

"""Checkpoint bytes from outside the server, checked whole before any of it is used.

Three readers over `safetensors_file.py`, each raising `CheckpointError` naming the file (by its name
in the directory, never a server path) and the tensor:
- `read_update_dir(path, cfg)`: a weight update directory -> {name: tensor}, staged in host memory;
- `read_update_payload(buf, cfg)`: a weight update sent as safetensors bytes -> {name: tensor};
- `scan_checkpoint(path, cfg)`: headers of a whole checkpoint (startup), no tensor data read.

Directory rules: the shard files as `shards.py` resolves them, each a regular file (a FIFO, device
or directory is refused without being read) parsed by `safetensors_file.py`; every tensor in the
shard the index names, once; names, dtypes and shapes against the schema; float data finite
(`check_finite`).
"""

from __future__ import annotations

import os
from pathlib import Path

import torch

from sglang_dsv41.checkpoint.io import CheckpointError, _as_stored, _check, _check_complete, _spec_of, check_finite
from sglang_dsv41.checkpoint.safetensors_file import RegularFile, SafetensorsError, as_tensor, decode
from sglang_dsv41.checkpoint.shards import INDEX_FILE, inside, shard_files
from sglang_dsv41.checkpoint.schema import checkpoint_schema
from sglang_dsv41.config import ModelConfig

def read_update_dir(path: str | os.PathLike, cfg: ModelConfig) -> dict[str, torch.Tensor]:
    """Every model tensor of the update directory, validated (any subset of the schema, at least one)."""
    return _read_dir(path, cfg, with_data=True, complete=False)


def scan_checkpoint(path: str | os.PathLike, cfg: ModelConfig) -> dict[str, str]:
    """Validate a whole checkpoint directory from its headers (every tensor present; no data read)
    -> {tensor name: its file name}."""
    return _read_dir(path, cfg, with_data=False, complete=True)


def read_update_payload(buf: bytes, cfg: ModelConfig, where: str = "the payload") -> dict[str, torch.Tensor]:
    """A weight update sent as the bytes of one safetensors file, validated like a directory's shard."""
    try:
        tensors = decode(buf, where)
    except SafetensorsError as e:
        raise CheckpointError(str(e)) from None
    schema = checkpoint_schema(cfg)
    out = {}
    for e, t in tensors:
        spec = _spec_of(schema, e.name, where)
        if spec is None:
            continue
        _check(spec, e.dtype, e.shape, where)
        out[e.name] = _as_stored(t, spec)
        check_finite(e.name, out[e.name], where)
    if not out:
        raise CheckpointError(f"{where}: no tensor of this model")
    return out


def _read_dir(path, cfg: ModelConfig, with_data: bool, complete: bool) -> dict:
    root = Path(path)
    if not root.is_dir():
        raise CheckpointError(f"{os.fspath(path)!s} is not a directory")
    root = root.resolve()
    files, index = shard_files(root)
    schema = checkpoint_schema(cfg)
    found: dict[str, torch.Tensor | str] = {}
    for fname in files:
        try:
            with RegularFile(str(inside(root, fname)), fname) as f:
                for e in f.entries():
                    spec = _spec_of(schema, e.name, fname)
                    if spec is None:
                        continue
                    _check(spec, e.dtype, e.shape, fname)
                    if e.name in found:
                        raise CheckpointError(f"tensor '{e.name}' is in {fname} and in an earlier shard")
                    if index is not None and index.get(e.name) != fname:
                        raise CheckpointError(f"tensor '{e.name}' is in {fname}, the index says "
                                              f"{index.get(e.name, 'nothing about it')}")
                    found[e.name] = fname
                    if with_data:
                        found[e.name] = _as_stored(as_tensor(f.read(e.begin, e.end - e.begin), e), spec)
                        check_finite(e.name, found[e.name], fname)
        except SafetensorsError as e:
            raise CheckpointError(str(e)) from None
    if index is not None:
        absent = [n for n, f in index.items() if n not in found and _spec_of(schema, n, INDEX_FILE) is not None]
        if absent:
            raise CheckpointError(f"tensor '{absent[0]}' is mapped to {index[absent[0]]} by {INDEX_FILE}, "
                                  "which does not hold it")
    if complete:
        _check_complete(schema, found, "")  # type: ignore[arg-type]
    elif not found:
        raise CheckpointError(f"no tensor of this model in the directory (files: {', '.join(files) or 'none'})")
    return found

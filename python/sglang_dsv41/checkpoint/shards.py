"""The shard files of a checkpoint directory, resolved so that nothing outside it is read.

The shards are the files the index (`model.safetensors.index.json`) maps tensor names to, or without
an index every `*.safetensors` entry of the directory. The index is a JSON object whose `weight_map`
maps names to shard names, at most `MAX_INDEX_BYTES`. Each shard is a plain file name (no separator,
no `..`, not absolute) that resolves inside the directory (a symlink out is refused); opening it as
a regular file (`safetensors_file.RegularFile`) is the reader's part. Errors are `CheckpointError`s
naming the file by its name in the directory.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from sglang_dsv41.checkpoint.errors import CheckpointError
from sglang_dsv41.checkpoint.safetensors_file import RegularFile, SafetensorsError

INDEX_FILE = "model.safetensors.index.json"
MAX_INDEX_BYTES = 64 << 20


def shard_files(root: Path) -> tuple[list[str], dict[str, str] | None]:
    """(shard file names, the index's {tensor: shard} or None without an index)."""
    if not os.path.lexists(root / INDEX_FILE):
        files = sorted(p.name for p in root.iterdir() if p.name.endswith(".safetensors"))
        if not files:
            raise CheckpointError("no *.safetensors file in the directory")
        return files, None
    try:
        with RegularFile(str(inside(root, INDEX_FILE)), INDEX_FILE) as f:
            if f.size > MAX_INDEX_BYTES:
                raise CheckpointError(f"{INDEX_FILE}: {f.size} bytes, over the {MAX_INDEX_BYTES}-byte limit")
            text = bytes(f.read(0, f.size).numpy())
    except SafetensorsError as e:
        raise CheckpointError(str(e)) from None
    try:
        index = json.loads(text.decode("utf-8"))
    except (UnicodeDecodeError, ValueError, RecursionError):
        raise CheckpointError(f"{INDEX_FILE}: not valid JSON") from None
    weight_map = index.get("weight_map") if isinstance(index, dict) else None
    if not isinstance(weight_map, dict) or not weight_map:
        raise CheckpointError(f"{INDEX_FILE}: must be an object with a non-empty 'weight_map' object")
    for name, shard in weight_map.items():
        if not isinstance(shard, str):
            raise CheckpointError(f"{INDEX_FILE}: weight_map['{name}'] is a {type(shard).__name__}, not a file name")
        plain_name(shard)
    return sorted(set(weight_map.values())), weight_map


def plain_name(name: str) -> None:
    if (not name or name in (".", "..") or "/" in name or "\\" in name or "\0" in name
            or os.path.isabs(name)):
        raise CheckpointError(f"shard '{name[:200]}': only a plain file name inside the directory is allowed")


def inside(root: Path, name: str) -> Path:
    """`root / name` resolved, which must still be inside `root` (a symlink out is refused)."""
    plain_name(name)
    target = (root / name).resolve()
    if target.parent != root and root not in target.parents:
        raise CheckpointError(f"{name}: a link out of the directory")
    return target

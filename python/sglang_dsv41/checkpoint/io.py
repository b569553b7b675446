"""Read and write DeepSeek-V4.1 checkpoints: safetensors shards in the released names and dtypes.

Layout on disk: `model-0000i-of-0000n.safetensors` shards + `model.safetensors.index.json`
(`{"metadata": {"total_size": ...}, "weight_map": {name: shard}}`) + `config.json` (+ tokenizer).
Validation is against `checkpoint_schema(cfg)`: a missing tensor, a wrong shape or dtype, or an
unexpected tensor raises `CheckpointError` naming the tensor, what was expected and what was found.
Released tensors this text model does not use (`mtp.*`, `vision.*`, ...) are skipped.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Callable

import torch
from safetensors import safe_open
from safetensors.torch import save_file
from tqdm import tqdm

from sglang_dsv41.checkpoint.errors import CheckpointError
from sglang_dsv41.checkpoint.schema import TensorSpec, checkpoint_schema, is_ignored
from sglang_dsv41.checkpoint.shards import INDEX_FILE, shard_files
from sglang_dsv41.config import ModelConfig

SAFETENSORS_DTYPES: dict[str, torch.dtype] = {
    "BF16": torch.bfloat16,
    "F32": torch.float32,
    "F8_E4M3": torch.float8_e4m3fn,
    "F8_E8M0": torch.float8_e8m0fnu,
    "I8": torch.int8,
    "U8": torch.uint8,
}
_TORCH_TO_ST = {v: k for k, v in SAFETENSORS_DTYPES.items()}
# Packed FP4 experts are released as I8 or U8 (same bytes); both load as int8.
_EQUIVALENT = {("I8", "U8")}


def read_tensors(path: str | os.PathLike, cfg: ModelConfig, device: str | torch.device = "cpu", progress: bool = True,
                 select: Callable[[str], tuple[str, tuple[slice, ...] | None] | None] | None = None) -> dict[str, torch.Tensor]:
    """Load and validate every tensor of the checkpoint directory. Returns {name: tensor}.

    `select(name)` (a sharded load, parallel/load.py) -> None: this process holds none of the tensor
    (it is not read); or (key, index): read only `index` (a tuple of slices, None = all of it; the
    safetensors slice read touches only those bytes) and return it under `key`. Shapes and dtypes
    are checked against the whole tensor's schema first, as without `select`."""
    path = Path(path)
    schema = checkpoint_schema(cfg)
    out: dict[str, torch.Tensor] = {}
    seen: dict[str, None] = {}
    files = [path.resolve() / f for f in shard_files(path.resolve())[0]]
    bar = tqdm(total=len(schema), desc="loading DeepSeek-V4.1 checkpoint", unit="tensor", disable=not progress)
    for file in files:
        with safe_open(str(file), framework="pt", device="cpu") as f:
            for name in f.keys():
                spec = _spec_of(schema, name, file.name)
                if spec is None:
                    continue
                sl = f.get_slice(name)  # header only: fail before reading a wrong tensor
                _check(spec, sl.get_dtype(), tuple(sl.get_shape()), file.name)
                seen[name] = None
                bar.update(1)
                key, index = (name, None) if select is None else (select(name) or (None, None))
                if key is None:
                    continue
                t = f.get_tensor(name) if index is None else sl[index]
                out[key] = _as_stored(t, spec).to(device)
    bar.close()
    _check_complete(schema, seen, "")  # type: ignore[arg-type]
    return out


def check_tensors(tensors: dict[str, torch.Tensor], cfg: ModelConfig, where: str, complete: bool = True,
                  finite: bool = True) -> dict[str, torch.Tensor]:
    """Validate already-read tensors (e.g. from an engine's weight iterator) against the schema,
    like `read_tensors`: skips ignored names, raises `CheckpointError` naming the tensor. Packed FP4
    experts stored as U8 are viewed as int8. `complete=False` accepts any subset (a weight update);
    `finite` also refuses a NaN or Inf value (`check_finite`)."""
    schema = checkpoint_schema(cfg)
    out: dict[str, torch.Tensor] = {}
    for name, t in tensors.items():
        if not isinstance(name, str) or not isinstance(t, torch.Tensor):
            raise CheckpointError(f"{where}: entries must be (name, tensor), found ({type(name).__name__}, "
                                  f"{type(t).__name__})")
        spec = _spec_of(schema, name, where)
        if spec is None:
            continue
        _check(spec, _TORCH_TO_ST.get(t.dtype, str(t.dtype)), tuple(t.shape), where)
        out[name] = _as_stored(t, spec)
        if finite:
            check_finite(name, out[name], where)
    if complete:
        _check_complete(schema, out, f" in {where}")
    return out


_FINITE_CHUNK = 1 << 24


def check_finite(name: str, t: torch.Tensor, where: str) -> None:
    """Raise `CheckpointError` if a float tensor holds a NaN or Inf. FP8 E4M3 has no Inf and NaN is
    S.1111.111 (low 7 bits all set); E8M0 NaN is 0xFF; integer tensors (packed FP4) have no NaN.
    Scans in chunks of 2^24 elements, so the temporary mask stays small. A meta tensor (a placeholder for
    data held elsewhere, e.g. an Engram host table) has no values to check."""
    if t.is_meta:
        return
    if t.dtype == torch.float8_e4m3fn:
        bad = lambda c: (c.view(torch.uint8) & 0x7F) == 0x7F  # noqa: E731
    elif t.dtype == torch.float8_e8m0fnu:
        bad = lambda c: c.view(torch.uint8) == 0xFF  # noqa: E731
    elif t.is_floating_point():
        bad = lambda c: ~torch.isfinite(c)  # noqa: E731
    else:
        return
    flat = t.reshape(-1)
    for at in range(0, flat.numel(), _FINITE_CHUNK):
        mask = bad(flat[at:at + _FINITE_CHUNK])
        if bool(mask.any()):
            i = at + int(mask.nonzero()[0, 0])
            raise CheckpointError(f"tensor '{name}' in {where}: holds NaN or Inf (first at flat index {i})")


def _spec_of(schema: dict[str, TensorSpec], name: str, where: str) -> TensorSpec | None:
    """The tensor's spec; None for release-only tensors we skip; CheckpointError if unexpected."""
    if name in schema:
        return schema[name]
    if is_ignored(name):
        return None
    if name not in schema:
        raise CheckpointError(f"unexpected tensor '{name}' in {where}: not part of this config's model")
    return schema[name]


def _as_stored(t: torch.Tensor, spec: TensorSpec) -> torch.Tensor:
    return t.view(torch.int8) if (t.dtype == torch.uint8 and spec.dtype == "I8") else t


def _check_complete(schema: dict[str, TensorSpec], found: dict[str, torch.Tensor], where: str) -> None:
    missing = [n for n in schema if n not in found]
    if missing:
        spec = schema[missing[0]]
        more = f" (and {len(missing) - 1} more)" if len(missing) > 1 else ""
        raise CheckpointError(f"missing tensor '{spec.name}'{where}: expected {spec.dtype} {list(spec.shape)}{more}")


def _check(spec: TensorSpec, dtype: str, shape: tuple[int, ...], where: str) -> None:
    if dtype != spec.dtype and (spec.dtype, dtype) not in _EQUIVALENT:
        raise CheckpointError(f"tensor '{spec.name}' in {where}: expected dtype {spec.dtype}, found {dtype}")
    if shape != spec.shape:
        raise CheckpointError(f"tensor '{spec.name}' in {where}: expected shape {list(spec.shape)}, found {list(shape)}")


def write_checkpoint(
    out_dir: str | os.PathLike,
    tensors: dict[str, torch.Tensor],
    cfg: ModelConfig,
    max_shard_bytes: int = 2 << 30,
) -> None:
    """Write `tensors` (validated against the schema) as shards + index json into out_dir."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    schema = checkpoint_schema(cfg)
    for name, spec in schema.items():
        if name not in tensors:
            raise CheckpointError(f"missing tensor '{name}': expected {spec.dtype} {list(spec.shape)}")
        t = tensors[name]
        _check(spec, _TORCH_TO_ST.get(t.dtype, str(t.dtype)), tuple(t.shape), "the tensors to write")
    extra = [n for n in tensors if n not in schema]
    if extra:
        raise CheckpointError(f"unexpected tensor '{extra[0]}': not part of this config's model")

    shards: list[dict[str, torch.Tensor]] = [{}]
    size = 0
    for name in schema:  # schema order keeps the files deterministic
        t = tensors[name].detach().contiguous().cpu()
        nbytes = t.numel() * t.element_size()
        if shards[-1] and size + nbytes > max_shard_bytes:
            shards.append({})
            size = 0
        shards[-1][name] = t
        size += nbytes
    weight_map, total = {}, 0
    for i, shard in enumerate(shards):
        fname = f"model-{i + 1:05d}-of-{len(shards):05d}.safetensors"
        save_file(shard, str(out / fname), metadata={"format": "pt"})
        for name, t in shard.items():
            weight_map[name] = fname
            total += t.numel() * t.element_size()
    index = {"metadata": {"total_size": total}, "weight_map": weight_map}
    (out / INDEX_FILE).write_text(json.dumps(index, indent=2) + "\n")

"""Streaming the Engram table rows into an `EngramHostTables`, and a whole model with its tables in
host memory (the engine-agnostic twin of `checkpoint.loader.load_model`).

Peak extra memory: from a checkpoint directory (`stream_from_checkpoint`) rows are read as
safetensors slices of at most CHUNK_BYTES, never a whole table; from an engine's weight iterator
(`TableSink`) it is the one tensor the iterator holds at a time (at most one checkpoint shard).
Before a row is copied the tensor's header is checked against the config: a table whose rows,
width or dtype do not match raises `CheckpointError` naming the tensor and the config field.
`per_rank` drops each safetensors file's page cache after reading it (posix_fadvise DONTNEED), so
the page cache does not compete with the table for huge pages.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Iterable, Iterator

import torch
from safetensors import safe_open
from tqdm import tqdm

from sglang_dsv41.checkpoint.io import INDEX_FILE, SAFETENSORS_DTYPES, CheckpointError, check_tensors
from sglang_dsv41.config import ModelConfig
from sglang_dsv41.engram_host.lookup import place_host_tables, table_tensor_names
from sglang_dsv41.engram_host.table import EngramHostTables

CHUNK_BYTES = 64 << 20
_DTYPE = {"weight": "F8_E4M3", "scale": "F8_E8M0"}


def check_table_header(cfg: ModelConfig, name: str, k: int, part: str, dtype: str, shape: tuple[int, ...], where: str) -> None:
    e = cfg.engram
    width = e.head_dim if part == "weight" else e.head_dim // 32
    rows = e.num_embeddings[k]
    if len(shape) != 2 or shape[0] != rows:
        found = shape[0] if len(shape) == 2 else list(shape)
        raise CheckpointError(f"Engram table '{name}' in {where} has {found} rows but the config's "
                              f"engram_num_embeddings[{k}] (layer {e.layer_ids[k]}) is {rows}: the table rows must match the config")
    if shape[1] != width:
        raise CheckpointError(f"Engram table '{name}' in {where}: expected width {width} (engram_head_dim "
                              f"{e.head_dim}), found {shape[1]}")
    if dtype != _DTYPE[part]:
        raise CheckpointError(f"Engram table '{name}' in {where}: expected dtype {_DTYPE[part]}, found {dtype}")


class TableSink:
    """Routes an engine's (name, tensor) stream: table tensors are copied into `tables` (and
    dropped), every other tensor passes through. `placeholders()` then gives meta tensors with the
    tables' shapes and dtypes, so the usual schema check (`check_tensors`) still sees every name."""

    def __init__(self, tables: EngramHostTables, where: str = "the checkpoint", progress: bool = True):
        self.tables, self.where, self.progress = tables, where, progress
        self.names = table_tensor_names(tables.cfg)
        self.seen: dict[str, torch.Tensor] = {}

    def filter(self, weights: Iterable[tuple[str, torch.Tensor]]) -> Iterator[tuple[str, torch.Tensor]]:
        st = {v: k for k, v in SAFETENSORS_DTYPES.items()}
        for name, t in weights:
            if name not in self.names:
                yield name, t
                continue
            k, part = self.names[name]
            check_table_header(self.tables.cfg, name, k, part, st.get(t.dtype, str(t.dtype)), tuple(t.shape), self.where)
            _copy_chunked(self.tables, k, part, lambda a, b: t[a:b], t.size(0), name, self.progress)
            self.seen[name] = torch.empty(t.shape, dtype=t.dtype, device="meta")
            del t

    def placeholders(self) -> dict[str, torch.Tensor]:
        return dict(self.seen)


def _copy_chunked(tables: EngramHostTables, k: int, part: str, read, rows: int, name: str, progress: bool) -> None:
    """Copy this rank's rows of one table tensor in chunks of at most CHUNK_BYTES."""
    sec = tables.sections[k]
    width = sec.head_dim if part == "weight" else sec.head_dim // 32
    step = max(1, CHUNK_BYTES // width)
    lo, hi = sec.write_lo, min(sec.write_hi, rows)
    with tqdm(total=(hi - lo) * width, desc=f"Engram host table {name}", unit="B", unit_scale=True,
              disable=not progress) as bar:
        for a in range(lo, hi, step):
            b = min(a + step, hi)
            tables.write_rows(k, part, read(a, b), a)
            bar.update((b - a) * width)


def shard_files(path: Path) -> list[Path]:
    index = path / INDEX_FILE
    if index.exists():
        return [path / f for f in sorted(set(json.loads(index.read_text())["weight_map"].values()))]
    return sorted(path.glob("*.safetensors"))


def stream_from_checkpoint(path: str | os.PathLike, tables: EngramHostTables, progress: bool = True,
                           others: dict[str, torch.Tensor] | None = None, device: str | torch.device = "cpu") -> None:
    """Copy this rank's table rows from the checkpoint directory, file by file, slice by slice.
    With `others` (a dict), every non-table tensor is read into it as well (on `device`)."""
    path = Path(path)
    names = table_tensor_names(tables.cfg)
    files = shard_files(path)
    if not files:
        raise CheckpointError(f"no *.safetensors files in {path}")
    for file in files:
        with safe_open(str(file), framework="pt", device="cpu") as f:
            for name in f.keys():
                if name in names:
                    k, part = names[name]
                    sl = f.get_slice(name)  # header only
                    shape = tuple(sl.get_shape())
                    check_table_header(tables.cfg, name, k, part, sl.get_dtype(), shape, file.name)
                    _copy_chunked(tables, k, part, lambda a, b: sl[a:b], shape[0], name, progress)
                    if others is not None:
                        others[name] = torch.empty(shape, dtype=SAFETENSORS_DTYPES[sl.get_dtype()], device="meta")
                elif others is not None:
                    others[name] = f.get_tensor(name).to(device)
        if tables.layout == "per_rank":
            _drop_page_cache(file)


def _drop_page_cache(file: Path) -> None:
    fd = os.open(file, os.O_RDONLY)
    try:
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)


def load_model_host_tables(path: str | os.PathLike, layout: str, device: str | torch.device = "cpu",
                           group=None, progress: bool = True):
    """`checkpoint.loader.load_model` with the Engram tables in host memory (`layout` 'shared' or
    'per_rank'): the tables are streamed into an `EngramHostTables` and the model's `EngramTable`s
    are swapped for `HostEngramTable`s; nothing of the tables is allocated on `device`.
    Returns (model, tables)."""
    from sglang_dsv41.embedded import resolve_model_path
    from sglang_dsv41.engram_host.rank_group import RankGroup
    from sglang_dsv41.layers.transformer import DeepseekV41

    path = resolve_model_path(path)
    cfg = ModelConfig.from_pretrained(path)
    with torch.device("meta"):
        model = DeepseekV41(cfg)
    tables = EngramHostTables(cfg, layout, group or RankGroup(), device)
    tensors: dict[str, torch.Tensor] = {}
    stream_from_checkpoint(path, tables, progress, others=tensors, device=device)
    tensors = check_tensors(tensors, cfg, where=str(path))  # every name, table headers included
    tables.finish_load()
    place_host_tables(model, tables)
    model.load_state_dict({n: t for n, t in tensors.items() if n not in table_tensor_names(cfg)}, strict=True, assign=True)
    for p in model.parameters():
        p.requires_grad_(False)
    from sglang_dsv41.tokenizer.token_map import token_map_tensor

    model.set_token_map(token_map_tensor(str(path), device=device))
    return model.eval(), tables

"""Export: trainable masters -> a checkpoint in the released layout, bit-exact with the QAT forward.

Every tensor is produced by the same quantizer call the QAT forward makes on the same master
(`QATFP8Linear.quantized`, `QATMXFP4Linear.quantized`, bf16(master) for BF16 tensors, fp32 as is,
frozen tensors copied), so `ReferenceModel` (or the server) on the exported directory computes what
the trainer computed: logits equal bit for bit on the CPU. Written with `checkpoint.write_checkpoint`
(schema-validated safetensors shards + index); config.json and tokenizer files come from the source
checkpoint directory (training never changes the config).
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import torch
from torch.nn.utils import parametrize

from sglang_dsv41.checkpoint.io import INDEX_FILE, write_checkpoint
from sglang_dsv41.embedded import resolve_model_path
from sglang_dsv41.layers.transformer import DeepseekV41
from sglang_dsv41.train.trainable import QATFP8Linear, QATMXFP4Linear, _is_frozen


@torch.no_grad()
def checkpoint_tensors(model: DeepseekV41, include_frozen: bool = True) -> dict[str, torch.Tensor]:
    """{released name: tensor in the checkpoint dtype} for a trainable model. `include_frozen=False`
    leaves out the frozen tensors (Engram tables, router bias): what a weight sync sends."""
    out: dict[str, torch.Tensor] = {}
    for mname, mod in model.named_modules():
        if ".parametrizations" in f".{mname}":
            continue
        prefix = f"{mname}." if mname else ""
        if isinstance(mod, (QATFP8Linear, QATMXFP4Linear)):
            out[prefix + "weight"], out[prefix + "scale"] = mod.quantized()
            continue
        names = list(mod._parameters)
        if parametrize.is_parametrized(mod):
            names += list(mod.parametrizations)
        for pname in names:
            t = getattr(mod, pname)
            if t is not None:
                out[prefix + pname] = t.detach()
    if not include_frozen:
        out = {k: v for k, v in out.items() if not _is_frozen(k)}
    return out


def export_checkpoint(model: DeepseekV41, out_dir: str | os.PathLike, source: str | os.PathLike) -> Path:
    """Write the model as a checkpoint directory: shards via `write_checkpoint` (validated against the
    schema), plus config.json and tokenizer files copied from `source` (a checkpoint directory or
    embedded alias with the same config). Returns the directory."""
    src, out = resolve_model_path(source), Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    for f in src.iterdir():
        if f.is_file() and not f.name.endswith(".safetensors") and f.name != INDEX_FILE:
            shutil.copy2(f, out / f.name)
    write_checkpoint(out, checkpoint_tensors(model), model.cfg)
    return out

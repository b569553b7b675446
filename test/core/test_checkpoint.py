"""Checkpoint I/O tests. Oracle: the tensors handed to the writer (bitwise), and the schema of the
released names/dtypes (spec model 7.1, attention 10)."""

from __future__ import annotations

import hashlib
import json
import shutil

import pytest
import torch
from safetensors.torch import save_file

from sglang_dsv41.checkpoint import CheckpointError, checkpoint_schema, read_tensors, write_checkpoint
from sglang_dsv41.checkpoint.loader import load_model
from sglang_dsv41.config import ModelConfig
from sglang_dsv41.tiny import random_tensors, write_tiny_checkpoint


def _bytes(t: torch.Tensor) -> bytes:
    return t.contiguous().view(torch.uint8).numpy().tobytes()


@pytest.fixture(scope="module")
def cfg(tiny_dir) -> ModelConfig:
    return ModelConfig.from_pretrained(tiny_dir)


@pytest.fixture(scope="module")
def tensors(cfg):
    return random_tensors(cfg, seed=0)


def test_round_trip_is_bitwise(tiny_dir, cfg, tensors):
    loaded = read_tensors(tiny_dir, cfg, progress=False)
    assert loaded.keys() == tensors.keys()
    for name, t in tensors.items():
        assert loaded[name].dtype == t.dtype and loaded[name].shape == t.shape, name
        assert _bytes(loaded[name]) == _bytes(t), name


def test_model_parameters_are_the_checkpoint(tiny_model, tensors):
    sd = tiny_model.state_dict()
    assert sd.keys() == tensors.keys()
    for name in ("layers.2.attn.wq_a.weight", "layers.2.attn.wq_a.scale", "layers.0.ffn.experts.3.w2.weight",
                 "layers.1.engram.embed.scale", "layers.4.hc_ffn_fn", "head.weight"):
        assert sd[name].dtype == tensors[name].dtype and _bytes(sd[name]) == _bytes(tensors[name])


def test_released_dtypes_in_schema(cfg):
    s = checkpoint_schema(cfg)
    assert s["layers.0.attn.wq_a.weight"].dtype == "F8_E4M3" and s["layers.0.attn.wq_a.scale"].dtype == "F8_E8M0"
    assert s["layers.0.ffn.experts.0.w1.weight"].dtype == "I8"
    assert s["layers.0.ffn.experts.0.w1.weight"].shape == (cfg.moe.moe_inter_dim, cfg.hidden_size // 2)
    assert s["layers.0.ffn.experts.0.w1.scale"].shape == (cfg.moe.moe_inter_dim, cfg.hidden_size // 32)
    assert s["layers.0.attn.attn_sink"].dtype == "F32" and s["layers.0.hc_attn_fn"].dtype == "F32"
    assert "layers.3.attn.compressor.wkv.weight" not in s  # consumers own no compressor
    assert "layers.2.attn.compressor.wgate.weight" in s and "layers.6.attn.compressor.wgate.weight" not in s
    assert "layers.8.attn.indexer.wq_b.weight" in s and "layers.8.attn.indexer.wk.weight" not in s


def test_generation_is_deterministic(tiny_dir, tmp_path):
    again = write_tiny_checkpoint(tmp_path / "again", "tiny", seed=0)
    for f in sorted(tiny_dir.iterdir()):
        assert hashlib.sha256(f.read_bytes()).digest() == hashlib.sha256((again / f.name).read_bytes()).digest(), f.name


def test_sharded_write_loads(cfg, tensors, tmp_path, tiny_dir):
    write_checkpoint(tmp_path, tensors, cfg, max_shard_bytes=1 << 20)
    shutil.copy(tiny_dir / "config.json", tmp_path)
    index = json.loads((tmp_path / "model.safetensors.index.json").read_text())
    assert len(set(index["weight_map"].values())) > 1
    loaded = read_tensors(tmp_path, cfg, progress=False)
    assert all(_bytes(loaded[n]) == _bytes(t) for n, t in tensors.items())


def _corrupt(tmp_path, tiny_dir, tensors, edit):
    t = dict(tensors)
    edit(t)
    shutil.copy(tiny_dir / "config.json", tmp_path)
    save_file({k: v.contiguous() for k, v in t.items()}, str(tmp_path / "model.safetensors"))
    return tmp_path


@pytest.mark.parametrize(
    "edit, message",
    [
        (lambda t: t.pop("layers.3.attn.wkv.scale"), "missing tensor 'layers.3.attn.wkv.scale': expected F8_E8M0"),
        (lambda t: t.__setitem__("layers.2.attn.attn_sink", torch.zeros(5)),
         "tensor 'layers.2.attn.attn_sink' in model.safetensors: expected shape [4], found [5]"),
        (lambda t: t.__setitem__("layers.2.attn.wq_a.weight", t["layers.2.attn.wq_a.weight"].to(torch.bfloat16)),
         "tensor 'layers.2.attn.wq_a.weight' in model.safetensors: expected dtype F8_E4M3, found BF16"),
        (lambda t: t.__setitem__("layers.3.attn.compressor.wkv.weight", torch.zeros(2, 2)),
         "unexpected tensor 'layers.3.attn.compressor.wkv.weight'"),
    ],
)
def test_corruption_names_the_tensor(tmp_path, tiny_dir, cfg, tensors, edit, message):
    path = _corrupt(tmp_path, tiny_dir, tensors, edit)
    with pytest.raises(CheckpointError) as e:
        read_tensors(path, cfg, progress=False)
    assert message in str(e.value)


def test_release_only_tensors_are_skipped(tmp_path, tiny_dir, cfg, tensors):
    """Vision tensors and DSpark stages the config does not build are skipped; the stages it builds
    are validated like the backbone's."""
    extra = f"mtp.{cfg.dspark.n_stages}.attn.wq_a.weight"
    path = _corrupt(tmp_path, tiny_dir, tensors, lambda t: t.update({extra: torch.zeros(2),
                                                                      "layers.0.ffn.gate.bias_vl": torch.zeros(2)}))
    loaded = read_tensors(path, cfg, progress=False)
    assert extra not in loaded and "mtp.0.attn.wq_a.weight" in loaded and "mtp.1.markov_head.head.weight" in loaded
    (tmp_path / "bad").mkdir()
    path = _corrupt(tmp_path / "bad", tiny_dir, tensors, lambda t: t.update({"mtp.0.main_proj.weight": torch.zeros(2)}))
    with pytest.raises(CheckpointError, match="mtp.0.main_proj.weight"):
        read_tensors(path, cfg, progress=False)


def test_packed_experts_accept_u8(tmp_path, tiny_dir, cfg, tensors):
    name = "layers.0.ffn.experts.0.w1.weight"
    path = _corrupt(tmp_path, tiny_dir, tensors, lambda t: t.__setitem__(name, t[name].view(torch.uint8)))
    loaded = read_tensors(path, cfg, progress=False)
    assert loaded[name].dtype == torch.int8 and _bytes(loaded[name]) == _bytes(tensors[name])


def test_writer_validates(cfg, tensors, tmp_path):
    bad = dict(tensors)
    bad["layers.0.attn.wkv.weight"] = torch.zeros(3, 3, dtype=torch.float8_e4m3fn)
    with pytest.raises(CheckpointError, match="layers.0.attn.wkv.weight"):
        write_checkpoint(tmp_path, bad, cfg)


def test_config_mismatch_fails_at_load(tmp_path, tiny_dir):
    shutil.copytree(tiny_dir, tmp_path / "m")
    raw = json.loads((tmp_path / "m" / "config.json").read_text())
    raw["text_config"]["q_lora_rank"] = 96
    (tmp_path / "m" / "config.json").write_text(json.dumps(raw))
    with pytest.raises(CheckpointError, match=r"tensor 'layers\.0\.attn\.(q_norm|wq_a|wq_b)\.weight' .*expected shape \[96"):
        load_model(tmp_path / "m", progress=False)

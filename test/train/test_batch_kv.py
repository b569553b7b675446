"""CPU: DenseKV over a batch of sequences (reference/dense_kv.py), the training batch KV. Oracle: ReferenceModel (DenseKV) run
on each sequence alone; a right-padded shorter sequence keeps its real rows."""

from __future__ import annotations

import pytest
import torch

from sglang_dsv41.reference.dense_kv import DenseKV

T = 10


@torch.inference_mode()
def test_batch_rows_equal_one_dense_forward_per_sequence(tiny_model, tiny_reference):
    g = torch.Generator().manual_seed(5)
    seqs = torch.randint(3, 1000, (2, T), generator=g)
    seqs[1, 7:] = 2  # the second sequence is 7 tokens, right-padded
    out = tiny_model(seqs.flatten(), DenseKV(tiny_model.cfg, T, "cpu", batch=2))
    logits = out.logits.view(2, T, -1)
    assert torch.equal(logits[0], tiny_reference.forward(seqs[0]).logits)
    assert torch.equal(logits[1, :7], tiny_reference.forward(seqs[1, :7]).logits)


def test_odd_length_is_refused(tiny_model):
    with pytest.raises(ValueError, match="multiple of every compress ratio"):
        DenseKV(tiny_model.cfg, 9, "cpu", batch=2)


def test_trained_default_resolves_to_the_asset_dir_when_present(tmp_path, monkeypatch):
    from sglang_dsv41 import embedded

    monkeypatch.setenv("SGLANG_DSV41_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr(embedded, "ASSETS", tmp_path / "assets")
    (tmp_path / "assets" / "deepseek-v4.1-tiny").mkdir(parents=True)
    (tmp_path / "assets" / "deepseek-v4.1-tiny" / "config.json").write_text("{}")
    assert embedded.resolve_model_path("deepseek-v4.1-tiny") == tmp_path / "assets" / "deepseek-v4.1-tiny"
    assert "deepseek-v4.1-tiny-random" in embedded.EMBEDDED_MODELS and "deepseek-v4.1-mini-random" in embedded.EMBEDDED_MODELS

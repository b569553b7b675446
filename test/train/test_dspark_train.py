"""Drafter distillation (train/dspark.py) and the shipped drafter of `deepseek-v4.1-tiny`.

Oracles: the loss and gradients of a few real optimizer steps (the backbone must not move, the
drafter must learn the sequences it is shown), the source checkpoint's bytes (export keeps the
backbone), and the shipped drafter's acceptance measured here through the paged speculative decoder.
"""

from __future__ import annotations

import json

import pytest
import torch

from sglang_dsv41.checkpoint.io import read_tensors
from sglang_dsv41.checkpoint.loader import load_model
from sglang_dsv41.config import ModelConfig


@pytest.fixture(scope="module")
def mini(tmp_path_factory):
    from sglang_dsv41.tiny import write_tiny_checkpoint

    return write_tiny_checkpoint(tmp_path_factory.mktemp("dspark-train") / "ckpt", "mini")


def _bytes(t: torch.Tensor) -> torch.Tensor:
    return t.contiguous().view(torch.uint8) if t.dtype.itemsize == 1 else t


def test_training_moves_only_the_drafter_and_learns(mini, tmp_path):
    from sglang_dsv41.train.dspark import export_drafter, step_loss
    from sglang_dsv41.train.trainable import make_trainable, trainable_parameters

    model = load_model(mini, progress=False)
    cfg = model.cfg
    g = torch.Generator().manual_seed(0)
    B, T = 8, 24
    ids = torch.randint(3, cfg.vocab_size - 2, (B, T), generator=g)
    with torch.no_grad():
        from sglang_dsv41.reference.dense_kv import DenseKV

        hidden = model(ids.flatten(), DenseKV(cfg, T, "cpu", batch=B), capture_draft=True).draft_hidden.view(B, T, -1)
    starts, ends = torch.full((B,), 10), torch.full((B,), T)
    make_trainable(model, part="drafter")
    names = [n for n, _ in trainable_parameters(model)]
    assert names and all(n.startswith("mtp.") for n in names)
    params = [p for _, p in trainable_parameters(model)]
    opt = torch.optim.AdamW(params, lr=3e-3)
    losses = []
    for _ in range(12):
        loss, _, n = step_loss(model, ids, hidden, starts, ends)
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(float(loss))
    assert n == sum(min(5, T - 2 - p) for p in range(9, T - 2)) * B  # every target position counted once
    assert losses[-1] < 0.5 * losses[0], losses
    out = export_drafter(model, tmp_path / "out", mini)
    before, after = read_tensors(mini, cfg, progress=False), read_tensors(out, cfg, progress=False)
    for k, v in before.items():
        if not k.startswith("mtp."):
            assert torch.equal(_bytes(v), _bytes(after[k])), k  # the backbone keeps its bytes
    for k in ("mtp.0.main_proj.weight", "mtp.0.attn.wq_a.weight", "mtp.1.markov_head.head.weight"):
        assert not torch.equal(_bytes(before[k]), _bytes(after[k])), k  # the drafter was trained


def test_embedded_default_has_its_trained_drafter():
    """The shipped `deepseek-v4.1-tiny` carries a trained drafter: its record says how it was trained,
    and greedy speculative decoding of held-out task prompts accepts about what the record says."""
    from sglang_dsv41.embedded import resolve_model_path
    from sglang_dsv41.runtime.driver import Driver
    from sglang_dsv41.runtime.speculative import SpecDecoder
    from sglang_dsv41.train import task
    from sglang_dsv41.train.dspark import sample_problems

    path = resolve_model_path("deepseek-v4.1-tiny")
    cfg = ModelConfig.from_pretrained(path)
    assert cfg.dspark is not None and cfg.dspark.block_size == 5
    rec = json.loads((path / "training.json").read_text())["dspark"]
    assert rec["command"].startswith("python -m sglang_dsv41.train.dspark") and rec["heldout"]["accept_length"] >= 3.0
    model = load_model(path, progress=False)
    renderer = task.ChatRenderer(path)
    prompts = [renderer.prompt(p.question) for p in sample_problems({1: 1, 2: 4}, 24, "test", seed=1)]
    drv = Driver(model, 4096, len(prompts), page_size=64, speculative=True)
    new, stats = SpecDecoder(drv).generate(prompts, 24, eos=(renderer.eos_id,))
    assert stats.accept_length >= 3.0, (stats.accept_length, stats.accepted_at)
    plain, _ = Driver(model, 4096, len(prompts), page_size=64).generate(prompts, 24)
    for n, p in zip(new, plain):  # lossless: the plain greedy tokens up to end-of-sentence
        assert n == p[: len(n)] and n[-1] == renderer.eos_id

"""CPU: the shipped trained default `deepseek-v4.1-tiny` (python/sglang_dsv41/assets/).

Oracles: its training.json against the generators in this tree (task and tiny versions), its
tokenizer against the `mini-digits` preset's, and the task's answers: on problems this test draws
itself (seeded, from the test split only), the exact QAT forward (the serving numerics, bit for bit)
decodes the right boxed answer greedily for at least a stated fraction of each operation.
"""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from sglang_dsv41.embedded import ASSETS, resolve_model_path
from sglang_dsv41.tiny import BACKBONE_SINCE, GENERATOR_VERSION as TINY_VERSION
from sglang_dsv41.tiny import PRESETS
from sglang_dsv41.tokenizer.tiny_tokenizer import build_tiny_tokenizer
from sglang_dsv41.train import sft, task

DEFAULT = ASSETS / "deepseek-v4.1-tiny"
pytestmark = pytest.mark.skipif(not (DEFAULT / "config.json").exists(), reason="trained default not shipped")

# Floors of the greedy exact-match accuracy on the problems `_own_problems` draws: per operator at level 2,
# and over all of level 1 (its test split holds only 5 + 10 + 5 problems, too few for a floor per operator
# with any margin). Measured on the CPU (exact QAT forward, 2026-12-03): level 2: + 12/12, - 12/12, * 4/12
# (training.json's own 400-problem eval: 1.0, 1.0, 0.37); level 1: 15/20 (+ 4/5, - 10/10, * 1/5).
# The floors leave room for a few flipped argmaxes (numerics changes), not for a model that lost an operation.
FLOORS = {(2, "+"): 0.9, (2, "-"): 0.9, (2, "*"): 0.15, (1, "all"): 0.6}
LEVEL2_PER_OP = 12
SEED = 29


def _test_split(level: int, op: str) -> list:
    """Every problem of (level, op) that task.split_of puts in the test split: the SFT data come only from
    `task.problems(..., "train", ...)`, which keeps split_of == "train" problems, so none of these was
    trained on."""
    lo, hi = task.RANGES[level]
    blo, bhi = task.MUL_RANGE[level] if op == "*" else (lo, hi)
    space = (task.Problem(level, a, op, b) for a in range(lo, hi + 1) for b in range(blo, bhi + 1))
    return [p for p in space if task.split_of(p) == "test"]


def _own_problems() -> list:
    """Level 1: all its test-split problems (20); level 2: LEVEL2_PER_OP per operator, drawn without
    replacement by a seeded generator of this test (not task.problems' streams)."""
    rng = np.random.default_rng(SEED)
    out = [p for op in task.OPS for p in _test_split(1, op)]
    for op in task.OPS:
        pool = _test_split(2, op)
        out += [pool[i] for i in sorted(rng.choice(len(pool), LEVEL2_PER_OP, replace=False))]
    return out


def test_default_resolves_to_the_shipped_checkpoint():
    assert resolve_model_path("deepseek-v4.1-tiny") == DEFAULT


def test_training_json_matches_generators():
    info = json.loads((DEFAULT / "training.json").read_text())
    assert info["task_generator_version"] == task.GENERATOR_VERSION
    # the backbone was trained from a start checkpoint whose backbone bytes this tree's generator draws
    assert BACKBONE_SINCE <= info["tiny_generator_version"] <= TINY_VERSION


def test_tokenizer_is_the_single_digit_preset_tokenizer():
    shipped = json.loads((DEFAULT / "tokenizer.json").read_text())
    built = json.loads(build_tiny_tokenizer(PRESETS["mini-digits"].tokenizer_vocab, single_digits=True).to_str())
    assert shipped["model"] == built["model"] and shipped["pre_tokenizer"] == built["pre_tokenizer"]


def test_default_answers_every_operation_above_its_floor():
    """Teacher-forced greedy: a problem is right when every target token (`\\boxed{N}` then the
    end-of-sentence token) is the argmax after the tokens before it, i.e. greedy decoding emits exactly
    the answer and stops."""
    from sglang_dsv41.train.trainable import load_trainable

    pytest.importorskip("deepseek_recipe", reason="the chat renderer needs deepseek-recipe (pip install -e '.[test]')")
    probs = _own_problems()
    assert all(task.split_of(p) == "test" for p in probs) and len(set(probs)) == len(probs)
    assert {(p.level, p.op) for p in probs} == {(lv, op) for lv in (1, 2) for op in task.OPS}
    model = load_trainable("deepseek-v4.1-tiny").eval()
    renderer = task.ChatRenderer("deepseek-v4.1-tiny")
    ids, mask, t = sft.collate([renderer.example(p.question, p.completion) for p in probs], "cpu")
    with torch.no_grad():
        _, right = sft.batch_loss(model, ids, mask, t)
    scores = {}
    for p, ok in zip(probs, right.tolist()):
        scores.setdefault((p.level, p.op if p.level == 2 else "all"), []).append(ok)
    got = {k: sum(v) / len(v) for k, v in scores.items()}
    low = {k: (round(got[k], 3), floor) for k, floor in FLOORS.items() if got[k] < floor}
    assert not low, f"(accuracy, floor) below the floor: {low}; all: {got}"

"""CPU: the shipped trained default `deepseek-v4.1-tiny` (python/sglang_dsv41/assets/).

Oracles: its training.json against the generators in this tree (task and tiny versions), its
tokenizer against the `mini-digits` preset's, and the task's answers: the exact QAT forward (the
serving numerics, bit for bit) decodes the right boxed answer greedily for fixed held-out problems.
"""

from __future__ import annotations

import json

import pytest
import torch

from sglang_dsv41.embedded import ASSETS, resolve_model_path
from sglang_dsv41.tiny import GENERATOR_VERSION as TINY_VERSION
from sglang_dsv41.tiny import PRESETS
from sglang_dsv41.tokenizer.tiny_tokenizer import build_tiny_tokenizer
from sglang_dsv41.train import sft, task

DEFAULT = ASSETS / "deepseek-v4.1-tiny"
pytestmark = pytest.mark.skipif(not (DEFAULT / "config.json").exists(), reason="trained default not shipped")

# test-split problems (task.split_of == 'test'), never trained on; answers checked by Python
HELD_OUT = [(10, "-", 75), (17, "+", 40), (27, "-", 95), (27, "+", 30), (78, "+", 58), (86, "+", 91), (99, "-", 33)]


def test_default_resolves_to_the_shipped_checkpoint():
    assert resolve_model_path("deepseek-v4.1-tiny") == DEFAULT


def test_training_json_matches_generators():
    info = json.loads((DEFAULT / "training.json").read_text())
    assert info["task_generator_version"] == task.GENERATOR_VERSION
    assert info["tiny_generator_version"] == TINY_VERSION
    assert info["heldout"]["greedy_exact_match"]["all"] >= 0.6
    assert info["served_heldout"]["level2"]["accuracy"] >= 0.6


def test_tokenizer_is_the_single_digit_preset_tokenizer():
    shipped = json.loads((DEFAULT / "tokenizer.json").read_text())
    built = json.loads(build_tiny_tokenizer(PRESETS["mini-digits"].tokenizer_vocab, single_digits=True).to_str())
    assert shipped["model"] == built["model"] and shipped["pre_tokenizer"] == built["pre_tokenizer"]


def test_default_answers_held_out_problems():
    from sglang_dsv41.train.trainable import load_trainable

    pytest.importorskip("deepseek_recipe", reason="the chat renderer needs deepseek-recipe (pip install -e '.[test]')")
    probs = [task.Problem(2, a, op, b) for a, op, b in HELD_OUT]
    assert all(task.split_of(p) == "test" for p in probs)
    model = load_trainable("deepseek-v4.1-tiny").eval()
    renderer = task.ChatRenderer("deepseek-v4.1-tiny")
    ids, mask, t = sft.collate([renderer.example(p.question, f"\\boxed{{{p.answer}}}") for p in probs], "cpu")
    with torch.no_grad():
        _, right = sft.batch_loss(model, ids, mask, t)  # every target token is the greedy argmax
    assert right.tolist() == [True] * len(probs)

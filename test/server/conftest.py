"""Fixtures of the server tests; launching lives in launch.py."""

from __future__ import annotations

import pytest


@pytest.fixture(scope="session")
def tiny_tokenizer(tiny_dir):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(tiny_dir))

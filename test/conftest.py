"""Shared fixtures: one tiny checkpoint per test session (generated in ~3 s, deterministic)."""

from __future__ import annotations

import os
import sys
from pathlib import Path

# Scalar ATen CPU kernels: vectorized exp/sigmoid/rsqrt round differently in a loop's SIMD body and
# its scalar tail, so a row's value would depend on the batch size (docs/numerics.md). Must be set
# before torch runs its first CPU kernel.
os.environ.setdefault("ATEN_CPU_CAPABILITY", "default")
# MKL's conditional numerical reproducibility: without it MKL picks CPU- and shape-dependent GEMM code
# paths, and on an AMD EPYC (AVX-512) the tests that compare bits across processes (TP=2 vs one process,
# trainer vs server logprobs) differed (docs/rl.md). Inherited by the servers and ranks the tests start.
os.environ.setdefault("MKL_CBWR", "COMPATIBLE")

import pytest  # noqa: E402

# Tests run against the source tree even before `pip install -e .`.
ROOT = Path(__file__).resolve().parents[1]
for sub in ("python", "sgl-kernel"):
    p = str(ROOT / sub)
    if p not in sys.path:
        sys.path.insert(0, p)


@pytest.fixture(scope="session")
def tiny_dir(tmp_path_factory) -> Path:
    from sglang_dsv41.tiny import write_tiny_checkpoint

    return write_tiny_checkpoint(tmp_path_factory.mktemp("tiny") / "ckpt", "tiny", seed=0)


@pytest.fixture(scope="session")
def tiny_model(tiny_dir):
    from sglang_dsv41.checkpoint.loader import load_model

    return load_model(tiny_dir, progress=False)


@pytest.fixture(scope="session")
def tiny_reference(tiny_model):
    from sglang_dsv41.reference.model import ReferenceModel

    return ReferenceModel(tiny_model)

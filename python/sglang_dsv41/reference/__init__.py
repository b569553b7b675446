"""The pure-PyTorch reference forward (the oracle). See `reference/model.py`."""

from sglang_dsv41.reference.model import Decisions, ReferenceModel, ReferenceOutput

__all__ = ["Decisions", "ReferenceModel", "ReferenceOutput"]

"""Checkpoint schema (names/shapes/dtypes), safetensors I/O and model loading."""

from sglang_dsv41.checkpoint.io import CheckpointError, read_tensors, write_checkpoint
from sglang_dsv41.checkpoint.schema import TensorSpec, checkpoint_schema

__all__ = ["CheckpointError", "TensorSpec", "checkpoint_schema", "read_tensors", "write_checkpoint"]

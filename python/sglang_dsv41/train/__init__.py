"""Training backend: the ONE forward (`DeepseekV41.forward`) over a dense KV with autograd, QAT.

Public API (see docs/training.md):
  make_trainable(model)       built DeepseekV41 -> QAT trainable model, in place (master weights)
  apply_numerics(m, NumericsPolicy.train(fast=True))   the fast forms (sglang_dsv41/numerics.py)
  load_trainable(path)        checkpoint dir / embedded alias -> trainable model
  trainable_parameters(m)     [(name, param)] that get gradients
  forward_train(m, ids, replay=None)        THE forward over a DenseKV, with autograd
  token_logprobs(m, ids, replay=None)       log p(ids[t+1] | ids[:t+1])
  sequence_loss(m, ids, loss_mask, replay=None)  summed CE over masked targets
  checkpoint_tensors(m, include_frozen=True)     released-layout tensors, bit-exact with the forward
  export_checkpoint(m, out_dir, source)          write a checkpoint directory
"""

from sglang_dsv41.train.export import checkpoint_tensors, export_checkpoint
from sglang_dsv41.train.trainable import (
    QATFP8Linear,
    QATMXFP4Linear,
    forward_train,
    load_trainable,
    make_trainable,
    sequence_loss,
    token_logprobs,
    trainable_parameters,
)

__all__ = [
    "QATFP8Linear", "QATMXFP4Linear", "checkpoint_tensors", "export_checkpoint",
    "forward_train", "load_trainable", "make_trainable", "sequence_loss", "token_logprobs",
    "trainable_parameters",
]

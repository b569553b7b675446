"""One profiled decode MoE call (E=16, T=8, fast pick) of the stacked kernel or the previous one (moe_prev.py next to this file; argv[1] = new|prev)."""
import os
import sys

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(HERE)))
sys.path[:0] = [HERE] + [os.path.join(ROOT, p) for p in ("python", "sgl-kernel", "benchmark", "test/kernels")]
import kernels as K  # noqa: E402
from decode_sweep import HID, INTER, moe_inputs  # noqa: E402
from dsv41_kernels import moe_triton  # noqa: E402
import moe_prev  # noqa: E402

mod = moe_prev if sys.argv[1] == "prev" else moe_triton
ws = K.expert_weights(16, INTER, HID) + K.expert_weights(16, INTER, HID) + K.expert_weights(16, HID, INTER)
args, _ = moe_inputs(8, 16, ws, "cuda")
mod.moe_experts_triton(*args)
torch.cuda.synchronize()
torch.cuda.profiler.start()
mod.moe_experts_triton(*args)
torch.cuda.synchronize()
torch.cuda.profiler.stop()

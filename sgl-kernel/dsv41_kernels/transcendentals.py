"""fp32 transcendentals of the Triton kernels, computed as torch computes them on the same device.

On the GPU, exp and log1p are libdevice `__nv_expf` / `__nv_log1pf`, which is what torch CUDA's
`std::exp` / `::log1p` on fp32 compile to (nvcc without fast math), and the composite functions are
written as ATen's CUDA kernels write them for fp32, every division IEEE (`div_rn`):
  sigmoid  1 / (1 + exp(-x))                    (UnarySpecialOpsKernel.cu, `sigmoid_kernel_cuda`)
  silu     x / (1 + exp(-x))                    (ActivationSiluKernel.cu)
  softplus x > 20 ? x : log1p(exp(x))           (ActivationSoftplusKernel.cu, beta 1, threshold 20)
  sqrt     IEEE (sqrt.rn; nvcc's default -prec-sqrt=true)
Triton links libdevice in its flush-to-zero flavour (the sm_90 PTX of `__nv_expf` has `fma.rn.ftz`
and `ex2.approx.ftz` on the reduced argument, then a non-ftz `mul` by 2^j); we assume it gives torch's
non-ftz bits, which can differ only where an input or result is subnormal: exp(subnormal) is 1 either
way, and a subnormal exp result is swallowed by the next add (1 + e). The GPU tests of the kernels that
call these check this on inputs that reach those corners.

Triton's CPU interpreter cannot run libdevice (extern calls raise), and its `tl.exp` (NumPy's fp32
exp) differs from torch CPU's exp for 4.9% of all fp32 inputs; torch CPU's sigmoid is not
1 / (1 + torch.exp(-x)) either (0.06% of inputs differ: another exp), both measured over every fp32
input under ATEN_CPU_CAPABILITY=default; torch CPU's fp32 sqrt is not correctly rounded either (15% of
uniform inputs on [0, 30) differ from the IEEE result, torch 2.14 with MKL). So under `triton_numerics.INTERPRET` each function runs
torch's CPU function on the interpreter's NumPy data: the interpreter checks everything else of a
kernel against its twin bit for bit, and only the GPU tests check the libdevice transcendentals.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
import triton
import triton.language as tl

from dsv41_kernels.triton_numerics import INTERPRET

if INTERPRET:
    import numpy as np
    from triton.runtime.interpreter import TensorHandle

    def _host_map(x, fn):
        """Interpreter only (plain Python on its tensors): fn, a torch CPU fp32 elementwise op, on x's data."""
        out = fn(torch.from_numpy(np.ascontiguousarray(x.handle.data))).numpy()
        return tl.tensor(TensorHandle(out, x.dtype), x.type)

    def exp_f32(x):
        return _host_map(x, torch.exp)

    def sigmoid_f32(x):
        return _host_map(x, torch.sigmoid)

    def silu_f32(x):
        return _host_map(x, F.silu)

    def softplus_f32(x):
        return _host_map(x, F.softplus)

    def sqrt_f32(x):
        return _host_map(x, torch.sqrt)

else:
    from triton.language.extra import libdevice

    @triton.jit
    def exp_f32(x):
        """fp32 exp as torch CUDA computes it (__nv_expf)."""
        return libdevice.exp(x)

    @triton.jit
    def sigmoid_f32(x):
        """fp32 sigmoid as ATen's CUDA kernel computes it: 1 / (1 + exp(-x)), IEEE division."""
        return tl.math.div_rn(1.0, 1.0 + libdevice.exp(-x))

    @triton.jit
    def silu_f32(x):
        """fp32 silu as ATen's CUDA kernel computes it: x / (1 + exp(-x)), IEEE division."""
        return tl.math.div_rn(x, 1.0 + libdevice.exp(-x))

    @triton.jit
    def softplus_f32(x):
        """fp32 softplus (beta 1, threshold 20) as ATen's CUDA kernel computes it."""
        return tl.where(x > 20.0, x, libdevice.log1p(libdevice.exp(x)))

    @triton.jit
    def sqrt_f32(x):
        """fp32 sqrt as torch CUDA computes it: IEEE round to nearest."""
        return tl.sqrt_rn(x)

"""sglang-dsv41 kernel package.

Each public op (`dsv41_kernels.ops`) pairs a Triton kernel with a pure-PyTorch twin of the same
signature; the registry (`registry.py`) runs the kernel on CUDA tensors and the twin on CPU, and
`SGLANG_DSV41_TORCH_OPS=1` (or a list of op names) forces ops onto their twins for bisecting
numerics. On CUDA, an op whose Triton module failed to import raises with the reason instead of
falling back silently.

The twins are this package's own torch implementation of the reference math (shared helpers in
`twin_math.py`), bit for bit equal to `sglang_dsv41.layers` (test/kernels/test_twins_vs_reference.py)
but importing nothing from it: the package depends only on `sglang_dsv41.quant` (storage formats),
`sglang_dsv41.reduction` (the RMSNorm statistic) and, for the kernels, Triton. Importing the
package compiles nothing.
"""

"""sglang-dsv41 kernel package.

Each public op (`dsv41_kernels.ops`) pairs a Triton kernel with a pure-PyTorch twin of the same
signature; the registry (`registry.py`) runs the kernel on CUDA tensors and the twin on CPU, and
`SGLANG_DSV41_TORCH_OPS=1` (or a list of op names) forces ops onto their twins for bisecting
numerics. On CUDA, an op whose Triton module failed to import raises with the reason instead of
falling back silently.

The twins are pure torch. Where a twin's math is the layers' math it is the same function, imported
from `sglang_dsv41.shared_math` (each formula exists once); the package imports nothing from
`sglang_dsv41.layers`, only the core modules test/core/test_import_graph.py allows (`quant`,
`reduction`, `determinism`, `shared_math`, ...) and, for the kernels, Triton. The twins are checked
against independent oracles (float64 formulations, hand-worked cases, DeepSeek's own functions) in
test/kernels/test_twin_oracles_*.py; the kernels against the twins (test/kernels/*_gpu.py, the
interpreter checks). Importing the package compiles nothing.
"""

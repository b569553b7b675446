"""sglang-dsv41 kernel package.

Each public op pairs a Triton kernel with a pure-PyTorch twin of the same signature; a registry
picks one, and `SGLANG_DSV41_TORCH_OPS=1` forces every op onto its twin (for bisecting numerics).
Until the kernels land, the twins are the layer functions in `sglang_dsv41.layers` and
`sglang_dsv41.quant`; importing this package compiles nothing.
"""

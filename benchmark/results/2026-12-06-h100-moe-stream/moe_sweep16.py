"""The MoE decode sweep of `benchmark/kernels.py --only decode_moe` (decode_sweep.sweep_moe) at 16 experts only,
with the first two one-pass configs: run from the repository root,
    python benchmark/results/2026-12-06-h100-moe-stream/moe_sweep16.py
(kernels.py's ceilings are measured first, as its main does)."""
import sys

sys.path[:0] = ["benchmark", "python", "sgl-kernel"]
import decode_sweep as D  # noqa: E402
import kernels as K  # noqa: E402

K.PEAK_BW, K.PEAK_FLOPS = K.ceilings()
D.MOE_CONFIGS = D.MOE_CONFIGS[:2]
D.report(D.sweep_moe(K.bench_graph, K.record, K.expert_weights, K.PEAK_BW, experts=(16,)))

"""The model adapter: DeepSeek-V4.1 as an SGLang model (the class SGLang builds, ForwardBatch -> runtime
`Batch`, the KV budget, request windows, server-arg rules, CUDA graphs, Engram host tables, tensor
parallelism).

SGLang imports this package as its external model package (`SGLANG_EXTERNAL_MODEL_PACKAGE`): its
registry imports every module directly in it and collects each `EntryClass` (only `deepseek_v41.py`
defines one). Nothing here imports `sglang_dsv41.sglang.requests`.
"""

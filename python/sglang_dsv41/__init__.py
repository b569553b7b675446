"""sglang-dsv41: DeepSeek-V4.1 for SGLang.

Engine-agnostic core (imports nothing from SGLang): `config`, `quant`, `checkpoint`, `layers`,
`reference` (the oracle forward), `tokenizer`, `engram_hash`, `tiny` (random checkpoints).
"""

__version__ = "0.1.0"

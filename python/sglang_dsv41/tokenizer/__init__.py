"""Tokenizer helpers: the deterministic tiny test tokenizer and Engram's compressed token map."""

from sglang_dsv41.tokenizer.tiny_tokenizer import (
    ALL_SPECIAL_TOKENS,
    BOS_TOKEN,
    BOS_TOKEN_ID,
    CHAT_SPECIAL_TOKENS,
    EOS_TOKEN,
    EOS_TOKEN_ID,
    PAD_TOKEN,
    PAD_TOKEN_ID,
    build_tiny_tokenizer,
    save_tiny_tokenizer,
    tokenizer_config_dict,
)
from sglang_dsv41.tokenizer.token_map import (
    as_backend_tokenizer,
    build_compressed_token_map,
    engram_normalizer,
    token_key,
    token_map_tensor,
)

__all__ = [
    "ALL_SPECIAL_TOKENS",
    "BOS_TOKEN",
    "BOS_TOKEN_ID",
    "CHAT_SPECIAL_TOKENS",
    "EOS_TOKEN",
    "EOS_TOKEN_ID",
    "PAD_TOKEN",
    "PAD_TOKEN_ID",
    "as_backend_tokenizer",
    "build_compressed_token_map",
    "build_tiny_tokenizer",
    "engram_normalizer",
    "save_tiny_tokenizer",
    "token_key",
    "token_map_tensor",
    "tokenizer_config_dict",
]

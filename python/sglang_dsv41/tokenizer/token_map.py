"""Engram's compressed token map: tokenizer id -> normalised token class.

Each vocabulary id is decoded on its own with the raw Rust backend (`skip_special_tokens=False`).
* If the decoded text contains U+FFFD (the token holds a partial UTF-8 sequence), its key is the
  raw vocabulary string (`id_to_token(id)`).
* Otherwise the key is the text normalised by, in order: NFKC, NFD, strip accents, lowercase,
  every run of [ \\t\\r\\n] -> one space, a string that is exactly " " -> a private-use sentinel,
  strip surrounding whitespace, sentinel -> " ". (So whitespace-only tokens all key as " ", which
  stays distinct from the empty string.) An empty normalised key falls back to the unnormalised
  decoded text.
Classes are numbered 0, 1, 2, ... in order of first appearance over ids 0..len(tokenizer)-1.
"""

from __future__ import annotations

import os
from typing import Any

import torch
from tokenizers import Regex, Tokenizer, normalizers

REPLACEMENT_CHAR = "\ufffd"
_SENTINEL = "\ue000"


def engram_normalizer() -> normalizers.Normalizer:
    """The normaliser sequence described in the module docstring (a fresh object per call)."""
    return normalizers.Sequence(
        [
            normalizers.NFKC(),
            normalizers.NFD(),
            normalizers.StripAccents(),
            normalizers.Lowercase(),
            normalizers.Replace(Regex(r"[ \t\r\n]+"), " "),
            normalizers.Replace(Regex(r"^ $"), _SENTINEL),
            normalizers.Strip(left=True, right=True),
            normalizers.Replace(_SENTINEL, " "),
        ]
    )


def as_backend_tokenizer(tokenizer: Any) -> Tokenizer:
    """Return the raw `tokenizers.Tokenizer` behind `tokenizer`.

    Accepts a `tokenizers.Tokenizer`, a HF fast tokenizer (anything with `.backend_tokenizer`),
    a directory holding `tokenizer.json`, or a path to a `tokenizer.json` file.
    """
    if isinstance(tokenizer, Tokenizer):
        return tokenizer
    if isinstance(tokenizer, (str, os.PathLike)):
        path = os.fspath(tokenizer)
        if os.path.isdir(path):
            path = os.path.join(path, "tokenizer.json")
        return Tokenizer.from_file(path)
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if isinstance(backend, Tokenizer):
        return backend
    raise TypeError(f"cannot get a tokenizers.Tokenizer from {type(tokenizer).__name__}")


def _num_ids(tokenizer: Any, backend: Tokenizer) -> int:
    """len(tokenizer) for HF tokenizers, the full (added tokens included) size otherwise."""
    if not isinstance(tokenizer, (Tokenizer, str, os.PathLike)):
        try:
            return len(tokenizer)
        except TypeError:
            pass
    return backend.get_vocab_size(with_added_tokens=True)


def token_key(backend: Tokenizer, token_id: int, normalizer: normalizers.Normalizer | None = None) -> str:
    """The Engram class key of one token id (see module docstring)."""
    norm = normalizer if normalizer is not None else engram_normalizer()
    text = backend.decode([token_id], skip_special_tokens=False)
    if REPLACEMENT_CHAR in text:
        raw = backend.id_to_token(token_id)
        return raw if raw is not None else text
    key = norm.normalize_str(text)
    return key if key else text


def build_compressed_token_map(tokenizer: Any) -> tuple[list[int], int]:
    """Map every tokenizer id to its Engram class.

    Args:
        tokenizer: `tokenizers.Tokenizer`, HF fast tokenizer, or a path (directory or
            `tokenizer.json`).
    Returns:
        (token_map, num_classes): token_map[i] is the class of id i for i in range(len(tokenizer)),
        classes numbered by first appearance; num_classes = max(token_map) + 1 (Engram's
        `compressed_vocab_size` for this tokenizer).
    """
    backend = as_backend_tokenizer(tokenizer)
    n = _num_ids(tokenizer, backend)
    norm = engram_normalizer()
    classes: dict[str, int] = {}
    out: list[int] = []
    for i in range(n):
        key = token_key(backend, i, norm)
        cls = classes.get(key)
        if cls is None:
            cls = len(classes)
            classes[key] = cls
        out.append(cls)
    return out, len(classes)


def token_map_tensor(tokenizer: Any, device: torch.device | str | None = None) -> torch.Tensor:
    """`build_compressed_token_map` as a LongTensor [len(tokenizer)] (int64) on `device`."""
    mapping, _ = build_compressed_token_map(tokenizer)
    return torch.tensor(mapping, dtype=torch.long, device=device)

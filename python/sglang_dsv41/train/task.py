"""A verifiable task: integer arithmetic problems in the V4.1 chat format, answer `\\boxed{N}`.

Problems (`GENERATOR_VERSION` names this exact generator; bump it on any change):
  level 1   a, b in [0, 9]              a+b, a-b, a*b
  level 2   a, b in [10, 99]            a+b, a-b;  a*b with b in [2, 9]
  level 3   a, b in [100, 999]          a+b, a-b;  a*b with b in [2, 9]
The operator is uniform over + - *. The question is "What is {a}{op}{b}?"; the answer is the exact
integer (negative for a-b < 0), written `\\boxed{N}`.

Train and test are disjoint twice: each problem (level, a, op, b) belongs to exactly one split by a
fixed hash (TEST_PERCENT of the problem space is held out), and the two splits draw from different
seed streams (numpy PCG64 seeded with (split, level, seed)).

Rendering is the server's: SGLang renders a DeepSeek-V4.1 chat request with deepseek-recipe's
`DeepseekV41Encoding` (request -> `ChatCompletionRequest.convert` -> `encode`, thinking off unless the
request enables it); `ChatRenderer` makes the same calls on the checkpoint's tokenizer.json (a test
checks the ids against SGLang's own renderer). The target tokens are what the same encoding renders
for the assistant turn: the answer text, then the end-of-sentence token.
"""

from __future__ import annotations

import os
import zlib
from dataclasses import dataclass
from pathlib import Path

import numpy as np

GENERATOR_VERSION = 1
TEST_PERCENT = 10
OPS = ("+", "-", "*")
RANGES = {1: (0, 9), 2: (10, 99), 3: (100, 999)}
MUL_RANGE = {1: (0, 9), 2: (2, 9), 3: (2, 9)}
SPLITS = {"train": 0, "test": 1}
IMAGE_TOKEN = "<｜deepseek_image｜>"
RECIPE_MODEL = "DeepSeek-V4.1-Flash"


@dataclass(frozen=True)
class Problem:
    level: int
    a: int
    op: str
    b: int

    @property
    def question(self) -> str:
        return f"What is {self.a}{self.op}{self.b}?"

    @property
    def answer(self) -> int:
        return self.a + self.b if self.op == "+" else self.a - self.b if self.op == "-" else self.a * self.b

    @property
    def completion(self) -> str:
        return f"\\boxed{{{self.answer}}}"


def split_of(p: Problem, test_percent: int = TEST_PERCENT) -> str:
    """'test' for a fixed `test_percent` of all problems (by a CRC32 of the problem), else 'train'."""
    return "test" if zlib.crc32(f"{p.level}:{p.a}{p.op}{p.b}".encode()) % 100 < test_percent else "train"


def problems(level: int, n: int, split: str = "train", seed: int = 0) -> list[Problem]:
    """n problems of `level` from `split` ('train' | 'test'), deterministic in (split, level, seed).
    Problems repeat only as often as sampling with replacement makes them."""
    if level not in RANGES:
        raise ValueError(f"level must be one of {sorted(RANGES)}, got {level}")
    if split not in SPLITS:
        raise ValueError(f"split must be 'train' or 'test', got {split!r}")
    rng = np.random.default_rng([SPLITS[split], level, seed])
    lo, hi = RANGES[level]
    out: list[Problem] = []
    while len(out) < n:
        op = OPS[int(rng.integers(len(OPS)))]
        a = int(rng.integers(lo, hi + 1))
        blo, bhi = MUL_RANGE[level] if op == "*" else (lo, hi)
        p = Problem(level, a, op, int(rng.integers(blo, bhi + 1)))
        if split_of(p) == split:
            out.append(p)
    return out


class ChatRenderer:
    """Prompt / target token ids exactly as the server renders a chat request for the model
    (deepseek-recipe's DeepSeek-V4.1 encoding over the checkpoint's tokenizer.json)."""

    def __init__(self, model: str | os.PathLike):
        import deepseek_recipe as recipe
        from tokenizers import Tokenizer

        from sglang_dsv41.embedded import resolve_model_path

        path = Path(resolve_model_path(model)) / "tokenizer.json"
        self.tokenizer = Tokenizer.from_file(str(path))
        self._recipe = recipe
        special = recipe.SpecialTokens(image=IMAGE_TOKEN)
        self._options = recipe.ConversionOptions().with_special_tokens(special)
        tok = recipe.Tokenizer.from_str(self.tokenizer.to_str())
        self._encoding = recipe.DeepseekV41Encoding().with_special_tokens(special).with_tokenizer(tok)
        self.eos_id = self.tokenizer.token_to_id("<｜end▁of▁sentence｜>")

    def encode(self, messages: list[dict], thinking: bool = False) -> list[int]:
        """Chat messages -> prompt ids (the generation header included when the last turn is the user's)."""
        body = {"model": RECIPE_MODEL, "messages": messages, "thinking": {"type": "enabled" if thinking else "disabled"}}
        conv = self._recipe.ChatCompletionRequest(body).convert(self._options).conversation
        return list(self._encoding.encode(conv))

    def prompt(self, question: str) -> list[int]:
        return self.encode([{"role": "user", "content": question}])

    def example(self, question: str, answer: str) -> tuple[list[int], list[int]]:
        """-> (prompt ids, target ids): the target is the assistant turn as the encoding renders it
        in a conversation (answer tokens then end-of-sentence)."""
        prompt = self.prompt(question)
        full = self.encode([{"role": "user", "content": question}, {"role": "assistant", "content": answer}])
        if full[: len(prompt)] != prompt or self.eos_id not in full[len(prompt):]:
            raise ValueError("the encoding does not render the assistant turn after the prompt")
        end = full.index(self.eos_id, len(prompt)) + 1
        return prompt, full[len(prompt): end]

"""Reward of the arithmetic task (train/task.py): exact match of the boxed answer.

`extract_boxed(text)` returns the content of the LAST `\\boxed{...}` (braces balanced), or None.
`reward(text, answer)` is 1.0 when that content, stripped of surrounding whitespace, is exactly the
decimal integer `str(answer)` (no leading zeros, '+', spaces inside or trailing text inside the box),
else 0.0. Text outside the box is ignored.
"""

from __future__ import annotations

BOX = "\\boxed{"


def extract_boxed(text: str) -> str | None:
    start = text.rfind(BOX)
    if start < 0:
        return None
    i, depth = start + len(BOX), 1
    for j in range(i, len(text)):
        if text[j] == "{":
            depth += 1
        elif text[j] == "}":
            depth -= 1
            if depth == 0:
                return text[i:j]
    return None


def reward(text: str, answer: int) -> float:
    got = extract_boxed(text)
    return 1.0 if got is not None and got.strip() == str(int(answer)) else 0.0

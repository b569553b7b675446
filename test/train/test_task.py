"""CPU: the arithmetic task (train/task.py) and its reward (train/reward.py).

Oracles: SGLang's own DeepSeek-V4.1 chat renderer (`sglang.srt.parser.deepseek_recipe_renderer`, the
code the server runs for a chat request) for the prompt ids; Python integer arithmetic and hand-written
strings for problems and rewards.
"""

from __future__ import annotations

import pytest
from tokenizers import Tokenizer

from sglang_dsv41.train import task
from sglang_dsv41.train.reward import extract_boxed, reward


def test_prompt_ids_equal_the_servers_chat_rendering(tiny_dir):
    renderer = pytest.importorskip("sglang.srt.parser.deepseek_recipe_renderer",
                                   reason="needs SGLang (pip install -e '.[test]')")

    server = renderer.DeepSeekRecipe("dsv41", Tokenizer.from_file(str(tiny_dir / "tokenizer.json")))
    ours = task.ChatRenderer(tiny_dir)
    for p in task.problems(2, 6, "test") + task.problems(3, 3, "train"):
        body = {"messages": [{"role": "user", "content": p.question}], "thinking": False}
        assert ours.prompt(p.question) == server.encode(body)
        # the target is the assistant turn the same encoding renders in a two-turn conversation
        prompt, target = ours.example(p.question, p.completion)
        two = server.encode({"messages": [{"role": "user", "content": p.question},
                                          {"role": "assistant", "content": p.completion}], "thinking": False})
        assert two[: len(prompt) + len(target)] == prompt + target
        assert ours.tokenizer.decode(target, skip_special_tokens=False) == p.completion + "<｜end▁of▁sentence｜>"


def test_problems_levels_answers_and_disjoint_splits():
    train = task.problems(2, 3000, "train", seed=0)
    test = task.problems(2, 300, "test", seed=0)
    assert {(p.a, p.op, p.b) for p in train}.isdisjoint({(p.a, p.op, p.b) for p in test})
    assert all(task.split_of(p) == "test" for p in test)
    for p in train[:300]:
        assert 10 <= p.a <= 99 and (2 <= p.b <= 9 if p.op == "*" else 10 <= p.b <= 99)
        assert p.answer == {"+": p.a + p.b, "-": p.a - p.b, "*": p.a * p.b}[p.op]
    assert {p.op for p in train} == set(task.OPS)
    assert task.problems(2, 50, "train", seed=3) == task.problems(2, 50, "train", seed=3)
    assert task.problems(2, 50, "train", seed=3) != task.problems(2, 50, "train", seed=4)
    assert all(0 <= p.a <= 9 and 0 <= p.b <= 9 for p in task.problems(1, 100))
    assert task.Problem(2, 37, "+", 48).question == "What is 37+48?"
    assert task.Problem(2, 23, "-", 57).completion == "\\boxed{-34}"
    with pytest.raises(ValueError, match="level"):
        task.problems(4, 1)


@pytest.mark.parametrize("text, answer, want", [
    ("\\boxed{85}", 85, 1.0),
    ("so the sum is \\boxed{ 85 }.", 85, 1.0),
    ("\\boxed{84} no wait \\boxed{85}", 85, 1.0),
    ("\\boxed{85} no wait \\boxed{84}", 85, 0.0),
    ("\\boxed{085}", 85, 0.0),
    ("\\boxed{+85}", 85, 0.0),
    ("\\boxed{-34}", -34, 1.0),
    ("85", 85, 0.0),
    ("\\boxed{85", 85, 0.0),
    ("\\boxed{{85}}", 85, 0.0),
])
def test_reward_is_exact_match_of_the_last_box(text, answer, want):
    assert reward(text, answer) == want


def test_extract_boxed_balances_braces():
    assert extract_boxed("x \\boxed{\\frac{1}{2}} y") == "\\frac{1}{2}"
    assert extract_boxed("none") is None

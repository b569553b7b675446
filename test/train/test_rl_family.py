"""CPU, no server: the RL problem families of train.rl (`--family`): the train and test splits are
disjoint and each problem lies in the family's ranges; malformed specifications are refused with a
message naming the flag."""

from __future__ import annotations

import pytest

from sglang_dsv41.train import task
from sglang_dsv41.train.rl import Family


def test_family_splits_are_disjoint_and_in_range():
    fam = Family.parse("1-9,10-99,*")
    train = fam.problems(300, "train", seed=0)
    test = fam.problems(60, "test", seed=0)
    assert len(train) == 300 and len(test) == 60
    assert {(p.a, p.op, p.b) for p in train}.isdisjoint({(p.a, p.op, p.b) for p in test})
    for p in train + test:
        assert 1 <= p.a <= 9 and 10 <= p.b <= 99 and p.op == "*" and p.answer == p.a * p.b
    assert all(task.split_of(p) == "test" for p in test)
    assert fam.problems(5, "train", seed=3) == fam.problems(5, "train", seed=3) != fam.problems(5, "train", seed=4)


@pytest.mark.parametrize("spec", ["1-9,10-99", "9-1,10-99,*", "1-9,10-99,/", "a-9,10-99,+", "1-9,10-99,"])
def test_bad_family_is_refused_naming_the_flag(spec):
    with pytest.raises(ValueError, match="--family"):
        Family.parse(spec)

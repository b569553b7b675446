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


def test_unseen_family_holds_only_problems_the_sft_never_saw():
    """--family 10-99,2-9,* --family-unseen-level 2 --family-heldout-percent 50: the level-2 multiplications
    of level 2's test split (the SFT data come from its train split), half of them held out."""
    fam = Family.parse("10-99,2-9,*", unseen_level=2, heldout_percent=50)
    train, test = fam.pool("train"), fam.pool("test")
    space = [task.Problem(2, a, "*", b) for a in range(10, 100) for b in range(2, 10)]
    unseen = {(p.a, p.b) for p in space if task.split_of(p) == "test"}
    assert {(p.a, p.b) for p in train + test} == unseen and not {(p.a, p.b) for p in train} & {(p.a, p.b) for p in test}
    assert 0.3 < len(test) / len(unseen) < 0.7
    drawn = fam.problems(200, "train", seed=1)
    assert {(p.a, p.b) for p in drawn} <= {(p.a, p.b) for p in train}
    assert fam.heldout(len(test), seed=0) == test  # each held-out problem once
    assert len(fam.heldout(len(test) - 1, seed=0)) == len(test) - 1


@pytest.mark.parametrize("kw, flag", [({"unseen_level": 7}, "--family-unseen-level"),
                                      ({"heldout_percent": 0}, "--family-heldout-percent")])
def test_bad_family_options_are_refused_naming_the_flag(kw, flag):
    with pytest.raises(ValueError, match=flag):
        Family.parse("10-99,2-9,*", **kw)


def test_family_options_without_a_family_are_refused(capsys):
    from sglang_dsv41.train.rl import main

    with pytest.raises(SystemExit):
        main(["--server", "http://127.0.0.1:1", "--family-unseen-level", "2"])
    assert "apply to a --family" in capsys.readouterr().err

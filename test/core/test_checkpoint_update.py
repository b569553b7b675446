"""Weight-update bytes from outside the server (checkpoint/update.py, safetensors_file.py, shards.py).

Oracles: the `safetensors` library's own decoder (whatever our reader accepts, it must decode to the same
bytes; what it refuses, ours must refuse too unless noted), and for each corruption class the error it
must raise: a `CheckpointError` naming the file or tensor, never another exception, never a hang. The
seeded fuzzer mutates a real partial checkpoint of the tiny model (bit flips anywhere, truncations,
shuffled offsets, duplicate names, wrong dtypes, NaN/Inf payloads, header lengths)."""

from __future__ import annotations

import json
import os
import random
import signal
import struct

import pytest
import torch
from safetensors import deserialize as st_deserialize
from safetensors.torch import save as st_save

from sglang_dsv41.checkpoint.errors import CheckpointError
from sglang_dsv41.checkpoint.io import check_finite
from sglang_dsv41.checkpoint.update import read_update_dir, read_update_payload, scan_checkpoint
from sglang_dsv41.config import ModelConfig
from sglang_dsv41.embedded import resolve_model_path

from checkpoint_mutations import KINDS, mutate, pack

FUZZ_SEED = int(os.environ.get("DSV41_FUZZ_SEED", 20261203))
FUZZ_CASES = int(os.environ.get("DSV41_FILE_FUZZ_CASES", 400))
NAMES = ("norm.weight", "layers.0.attn.wq_a.weight", "layers.0.attn.wq_a.scale", "layers.0.hc_attn_fn")


@pytest.fixture(scope="module")
def tiny():
    path = resolve_model_path("deepseek-v4.1-tiny")
    cfg = ModelConfig.from_pretrained(path)
    return path, cfg, read_update_dir(path, cfg)


@pytest.fixture(scope="module")
def partial(tiny):
    """A partial update of four tensors, one of each stored float dtype (BF16, F8_E4M3, F8_E8M0, F32)."""
    _, _, tensors = tiny
    picked = {n: tensors[n] for n in NAMES}
    assert {str(t.dtype) for t in picked.values()} == {"torch.bfloat16", "torch.float8_e4m3fn",
                                                        "torch.float8_e8m0fnu", "torch.float32"}
    return picked, st_save(picked)


@pytest.fixture(autouse=True)
def deadline():
    """A reader that blocks (a FIFO, a huge read) fails the test instead of hanging it."""
    signal.signal(signal.SIGALRM, lambda *_: (_ for _ in ()).throw(TimeoutError("reader blocked")))
    signal.alarm(60)
    yield
    signal.alarm(0)


def _same_bytes(a: torch.Tensor, b: torch.Tensor) -> bool:
    return a.shape == b.shape and torch.equal(a.contiguous().view(torch.uint8), b.contiguous().view(torch.uint8))


def test_whole_checkpoint_reads_as_safetensors_does(tiny):
    path, cfg, tensors = tiny
    names = scan_checkpoint(path, cfg)
    assert len(names) == len(tensors) > 800 and set(names) == set(tensors)
    from safetensors.torch import load_file

    ref = {}
    for f in sorted(path.glob("*.safetensors")):
        ref.update(load_file(str(f)))
    assert all(_same_bytes(tensors[n], ref[n]) for n in tensors)


def test_payload_round_trip(partial, tiny):
    picked, buf = partial
    out = read_update_payload(buf, tiny[1])
    assert set(out) == set(picked) and all(_same_bytes(out[n], picked[n]) for n in picked)


CORRUPT = {
    "empty": (lambda b: b"", "shorter than the 8-byte header length"),
    "seven bytes": (lambda b: b[:7], "shorter than the 8-byte header length"),
    "cut inside the header": (lambda b: b[:40], "runs past the end"),
    "cut in half": (lambda b: b[:len(b) // 2], "cut short"),
    "one byte short": (lambda b: b[:-1], "cut short"),
    "2^40 header length": (lambda b: struct.pack("<Q", 1 << 40) + b[8:], "over the"),
    "header not covering the file": (lambda b: b + b"\0" * 16, "covers"),
    "random bytes": (lambda b: random.Random(1).randbytes(len(b)), None),
    "header is a list": (lambda b: pack("[]", b""), "not an object"),
    "duplicate name": (lambda b: pack(
        '{"norm.weight": {"dtype": "BF16", "shape": [1], "data_offsets": [0, 2]}, '
        '"norm.weight": {"dtype": "BF16", "shape": [1], "data_offsets": [2, 4]}}', b"\0" * 4), "twice"),
    "overlapping offsets": (lambda b: pack(
        '{"a": {"dtype": "U8", "shape": [4], "data_offsets": [0, 4]}, '
        '"b": {"dtype": "U8", "shape": [4], "data_offsets": [2, 6]}}', b"\0" * 6), "overlaps"),
    "a gap": (lambda b: pack('{"a": {"dtype": "U8", "shape": [2], "data_offsets": [2, 4]}}', b"\0" * 4), "unused"),
    "size disagrees with shape": (lambda b: pack(
        '{"norm.weight": {"dtype": "BF16", "shape": [3], "data_offsets": [0, 4]}}', b"\0" * 4), "needs 6"),
    "unknown dtype": (lambda b: pack('{"a": {"dtype": "F128", "shape": [1], "data_offsets": [0, 16]}}',
                                      b"\0" * 16), "unknown dtype"),
    "negative dim": (lambda b: pack('{"a": {"dtype": "U8", "shape": [-1], "data_offsets": [0, 0]}}', b""),
                     "non-negative"),
    "NaN literal in the header": (lambda b: pack('{"a": {"dtype": "U8", "shape": [NaN], "data_offsets": [0, 0]}}',
                                                  b""), "non-JSON number"),
}


@pytest.mark.parametrize("case", list(CORRUPT))
def test_corrupt_payload_is_refused(partial, tiny, case):
    mutate, fragment = CORRUPT[case]
    with pytest.raises(CheckpointError) as e:
        read_update_payload(mutate(partial[1]), tiny[1])
    assert fragment is None or fragment in str(e.value), str(e.value)


@pytest.mark.parametrize("name,value", [("norm.weight", float("nan")), ("layers.0.hc_attn_fn", float("inf")),
                                        ("layers.0.attn.wq_a.weight", float("nan")),
                                        ("layers.0.attn.wq_a.scale", float("nan"))])
def test_non_finite_values_are_refused(partial, tiny, name, value):
    picked = {n: t.clone() for n, t in partial[0].items()}
    t = picked[name]
    if t.dtype in (torch.float8_e4m3fn, torch.float8_e8m0fnu):
        t.view(torch.uint8).view(-1)[7] = 0x7F if t.dtype == torch.float8_e4m3fn else 0xFF
    else:
        t.view(-1)[7] = value
    with pytest.raises(CheckpointError, match=rf"'{name}'.*NaN or Inf \(first at flat index 7\)"):
        read_update_payload(st_save(picked), tiny[1])


def test_finite_check_on_every_float_format():
    check_finite("x", torch.tensor([1.0, -2.0], dtype=torch.bfloat16), "here")
    check_finite("x", torch.tensor([448.0, -448.0]).to(torch.float8_e4m3fn), "here")
    check_finite("x", torch.tensor([127], dtype=torch.int8), "here")  # packed FP4: no NaN exists
    for bad in (torch.tensor([0.0, float("-inf")]), torch.tensor([0x7F, 0], dtype=torch.uint8).view(torch.float8_e4m3fn),
                torch.tensor([0xFF], dtype=torch.uint8).view(torch.float8_e4m3fn),
                torch.tensor([1, 0xFF], dtype=torch.uint8).view(torch.float8_e8m0fnu)):
        with pytest.raises(CheckpointError, match="NaN or Inf"):
            check_finite("x", bad, "here")


def test_seeded_fuzz_of_update_payloads(partial, tiny):
    """Every mutation is either refused with a CheckpointError or read exactly as the safetensors library
    reads it, with finite values; each class is seen and some of each outcome happen."""
    cfg = tiny[1]
    rng = random.Random(FUZZ_SEED)
    seen: dict[str, list[int]] = {}
    for i in range(FUZZ_CASES):
        kind, buf = mutate(partial[1], rng)
        try:
            out = read_update_payload(buf, cfg)
        except CheckpointError:
            seen.setdefault(kind, [0, 0])[0] += 1
            continue
        seen.setdefault(kind, [0, 0])[1] += 1
        ref = dict(st_deserialize(buf))  # accepted by us -> the library reads the same bytes
        for name, t in out.items():
            assert list(t.shape) == ref[name]["shape"], (i, kind, name)
            assert bytes(t.contiguous().view(torch.uint8).reshape(-1).numpy()) == bytes(ref[name]["data"]), (i, kind, name)
            check_finite(name, t, "fuzz")
    assert len(seen) == len(KINDS), seen
    assert seen["non-finite"][1] == 0 and seen["truncate"][1] == 0 and seen["header length"][1] == 0, seen
    assert seen["data bit flip"][1] > 0, seen  # a flip in a finite value's bits is still a valid update


def test_library_refusals_are_ours_too(partial, tiny):
    """What the safetensors library refuses, our reader refuses (a second direction of the oracle)."""
    rng = random.Random(FUZZ_SEED + 1)
    checked = 0
    for _ in range(FUZZ_CASES // 2):
        _, buf = mutate(partial[1], rng)
        try:
            st_deserialize(buf)
        except Exception:  # the library raises several types
            checked += 1
            with pytest.raises(CheckpointError):
                read_update_payload(buf, tiny[1])
    assert checked > 10


# ------------------------------------------------------------------ directories
def _write(d, picked, name="model.safetensors"):
    d.mkdir(parents=True, exist_ok=True)
    (d / name).write_bytes(st_save(picked))
    return d


def _index(d, weight_map):
    (d / "model.safetensors.index.json").write_text(json.dumps(weight_map))


DIRS = {
    "index {}": (lambda d, p: (_write(d, p), _index(d, {})), "non-empty 'weight_map'"),
    "index []": (lambda d, p: (_write(d, p), _index(d, [])), "non-empty 'weight_map'"),
    "list weight_map": (lambda d, p: (_write(d, p), _index(d, {"weight_map": ["model.safetensors"]})),
                        "non-empty 'weight_map'"),
    "index not JSON": (lambda d, p: (_write(d, p), (d / "model.safetensors.index.json").write_text("{")), "not valid JSON"),
    "absolute shard": (lambda d, p: (_write(d, p), _index(d, {"weight_map": {"norm.weight": str(d / "model.safetensors")}})),
                       "only a plain file name"),
    "../ shard": (lambda d, p: (_write(d.parent / "outside", p), d.mkdir(),
                                _index(d, {"weight_map": {"norm.weight": "../outside/model.safetensors"}})),
                  "only a plain file name"),
    "symlink out": (lambda d, p: (_write(d.parent / "elsewhere", p), d.mkdir(),
                                  os.symlink(d.parent / "elsewhere" / "model.safetensors", d / "model.safetensors")),
                    "a link out of the directory"),
    "index symlink out": (lambda d, p: (_write(d, p), (d.parent / "idx.json").write_text("{}"),
                                        os.symlink(d.parent / "idx.json", d / "model.safetensors.index.json")),
                          "a link out of the directory"),
    "FIFO shard": (lambda d, p: (d.mkdir(), os.mkfifo(d / "model.safetensors")), "not a regular file"),
    "directory shard": (lambda d, p: (d.mkdir(), (d / "model.safetensors").mkdir()), "not a regular file"),
    "zero-byte shard": (lambda d, p: (d.mkdir(), (d / "model.safetensors").write_bytes(b"")), "shorter than"),
    "missing shard": (lambda d, p: (_write(d, p), _index(d, {"weight_map": {"norm.weight": "gone.safetensors"}})),
                      "gone.safetensors: cannot open"),
    "tensor in another shard than the index says": (
        lambda d, p: (_write(d, p), _write(d, {}, "b.safetensors"),
                      _index(d, {"weight_map": {**{n: "model.safetensors" for n in p}, "norm.weight": "b.safetensors"}})),
        "the index says b.safetensors"),
    "no shard": (lambda d, p: d.mkdir(), "no *.safetensors file"),
    "no model tensor": (lambda d, p: _write(d, {}), "no tensor of this model"),
    "unexpected tensor": (lambda d, p: _write(d, {"bogus.weight": torch.zeros(2)}), "unexpected tensor 'bogus.weight'"),
    "wrong shape": (lambda d, p: _write(d, {"norm.weight": torch.zeros(3, dtype=torch.bfloat16)}),
                    "'norm.weight' in model.safetensors: expected shape"),
}


@pytest.mark.parametrize("case", list(DIRS))
def test_bad_update_directory_is_refused(tmp_path, partial, tiny, case):
    d = tmp_path / "update"
    DIRS[case][0](d, partial[0])
    with pytest.raises(CheckpointError) as e:
        read_update_dir(d, tiny[1])
    assert DIRS[case][1] in str(e.value), str(e.value)
    if case != "absolute shard":  # (which echoes the client's own string)
        assert str(tmp_path) not in str(e.value)  # files are named by their name in the directory


def test_not_a_directory(tmp_path, tiny):
    with pytest.raises(CheckpointError, match="is not a directory"):
        read_update_dir(tmp_path / "nope", tiny[1])


def test_symlink_inside_and_index_are_followed(tmp_path, partial, tiny):
    d = _write(tmp_path / "u", partial[0], "real.safetensors")
    os.symlink(d / "real.safetensors", d / "model.safetensors")
    _index(d, {"weight_map": {n: "model.safetensors" for n in partial[0]}})
    out = read_update_dir(d, tiny[1])
    assert all(_same_bytes(out[n], partial[0][n]) for n in partial[0])

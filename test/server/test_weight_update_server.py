"""Weight updates from outside cannot kill, hang or silently break the server (issue 34, items 1, 2, 5, 7, 8).

One real SGLang server on the tiny checkpoint, started under a served name. Every bad update (corrupt
shards and indexes, paths out of the directory, a FIFO, a bogus load_format, NaN weights; tensor
payloads of random bytes, wrong types, a pickle that would run code; a seeded fuzz of both) must get a
400 whose message names the file or field, within a deadline, and afterwards the server must answer a
greedy request with exactly the logprobs it gave before (the old weights keep serving, bit for bit).
A good update must change the answer to the new weights' and keep the served name."""

from __future__ import annotations

import base64
import json
import os
import pickle
import random
import struct

import pytest
import requests
import torch
from safetensors.torch import save as st_save

from checkpoint_mutations import mutate
from launch import start_server, stop_server

NAME = "dsv41-weights-test"
PROMPT = [5, 17, 99, 250, 3, 77, 1000, 12]
DEADLINE_S = 60
FUZZ_SEED = int(os.environ.get("DSV41_FUZZ_SEED", 20261203))
FUZZ_CASES = int(os.environ.get("DSV41_UPDATE_FUZZ_CASES", 24))


@pytest.fixture(scope="module")
def server(tiny_dir, tmp_path_factory):
    log = tmp_path_factory.mktemp("weights") / "server.log"
    srv = start_server(tiny_dir, log, "--served-model-name", NAME,
                       env={"SGLANG_ENABLE_HEALTH_ENDPOINT_GENERATION": "0"})
    yield srv
    stop_server(srv.proc)


@pytest.fixture(scope="module")
def tensors(tiny_dir):
    from sglang_dsv41.checkpoint.update import read_update_dir
    from sglang_dsv41.config import ModelConfig

    return read_update_dir(tiny_dir, ModelConfig.from_pretrained(tiny_dir))


def _greedy(server) -> tuple[list[int], list[float]]:
    r = requests.post(server.url + "/generate", timeout=DEADLINE_S, json={
        "input_ids": PROMPT, "return_logprob": True,
        "sampling_params": {"max_new_tokens": 6, "temperature": 0, "ignore_eos": True}})
    assert r.status_code == 200, r.text
    out = r.json()["meta_info"]["output_token_logprobs"]
    return [t for _, t, _ in out], [lp for lp, _, _ in out]


@pytest.fixture(scope="module")
def baseline(server):
    return _greedy(server)


def _still_serving(server, baseline) -> None:
    assert server.proc.poll() is None, server.log_text()[-3000:]
    assert requests.get(server.url + "/health", timeout=DEADLINE_S).status_code == 200
    assert _greedy(server) == baseline  # ids and logprobs, exactly
    assert "Traceback" not in server.log_text()


def _from_disk(server, path, **extra) -> requests.Response:
    return requests.post(server.url + "/update_weights_from_disk", json={"model_path": str(path), **extra},
                         timeout=DEADLINE_S)


def _shard(d, tensors: dict, name="model.safetensors", raw: bytes | None = None):
    d.mkdir(parents=True, exist_ok=True)
    (d / name).write_bytes(raw if raw is not None else st_save(tensors))
    return d


def _index(d, obj):
    d.mkdir(parents=True, exist_ok=True)
    (d / "model.safetensors.index.json").write_text(json.dumps(obj))


def _nan_norm(t):
    t = {"norm.weight": t["norm.weight"].clone()}
    t["norm.weight"][3] = float("nan")
    return t


BAD_DIRS = {
    "truncated in half": (lambda d, t: _shard(d, {}, raw=st_save(t)[: len(st_save(t)) // 2]), "model.safetensors"),
    "one byte short": (lambda d, t: _shard(d, {}, raw=st_save(t)[:-1]), "cut short"),
    "cut inside the header": (lambda d, t: _shard(d, {}, raw=st_save(t)[:20]), "runs past the end"),
    "zero bytes": (lambda d, t: _shard(d, {}, raw=b""), "shorter than the 8-byte header length"),
    "random bytes": (lambda d, t: _shard(d, {}, raw=random.Random(3).randbytes(4096)), "model.safetensors"),
    "2^40 header length": (lambda d, t: _shard(d, {}, raw=struct.pack("<Q", 1 << 40) + st_save(t)[8:]), "over the"),
    "header not covering the file": (lambda d, t: _shard(d, {}, raw=st_save(t) + b"\0" * 64), "covers"),
    "index {}": (lambda d, t: (_shard(d, t), _index(d, {})), "weight_map"),
    "index []": (lambda d, t: (_shard(d, t), _index(d, [])), "weight_map"),
    "list weight_map": (lambda d, t: (_shard(d, t), _index(d, {"weight_map": ["model.safetensors"]})), "weight_map"),
    "absolute path in the index": (lambda d, t: (_shard(d, t), _index(d, {"weight_map": {
        "norm.weight": str(d / "model.safetensors")}})), "only a plain file name"),
    "../ in the index": (lambda d, t: (_shard(d.parent / (d.name + "-out"), t), _index(d, {"weight_map": {
        "norm.weight": f"../{d.name}-out/model.safetensors"}})), "only a plain file name"),
    "symlink out": (lambda d, t: (_shard(d.parent / (d.name + "-else"), t), d.mkdir(), os.symlink(
        d.parent / (d.name + "-else") / "model.safetensors", d / "model.safetensors")), "a link out"),
    "FIFO named model.safetensors": (lambda d, t: (d.mkdir(), os.mkfifo(d / "model.safetensors")),
                                     "not a regular file"),
    "NaN norm.weight": (lambda d, t: _shard(d, _nan_norm(t)), "'norm.weight' in model.safetensors: holds NaN"),
    "wrong shape": (lambda d, t: _shard(d, {"norm.weight": torch.zeros(3, dtype=torch.bfloat16)}), "expected shape"),
    "not a directory": (lambda d, t: None, "is not a directory"),
}


@pytest.mark.parametrize("case", list(BAD_DIRS))
def test_bad_update_directory_is_a_400_and_the_old_weights_serve(server, baseline, tensors, tmp_path, case):
    d = tmp_path / "update"
    BAD_DIRS[case][0](d, {"norm.weight": tensors["norm.weight"], "layers.0.attn.wq_a.weight":
                          tensors["layers.0.attn.wq_a.weight"]})
    r = _from_disk(server, d)
    assert r.status_code == 400, r.text
    message = r.json()["message"]
    assert "the served weights are unchanged" in message and BAD_DIRS[case][1] in message, message
    _still_serving(server, baseline)


def test_bogus_load_format_is_a_400(server, baseline, tiny_dir):
    r = _from_disk(server, tiny_dir, load_format="bogus")
    assert r.status_code == 400 and "load_format 'bogus'" in r.json()["message"], r.text
    _still_serving(server, baseline)


def test_seeded_fuzz_of_disk_updates(server, baseline, tensors, tmp_path):
    """Mutated shards (test/checkpoint_mutations.py): each is refused with a 400, or, when the mutation
    left a valid update (a flipped data bit), served and then undone by restoring the original file."""
    good = {n: tensors[n] for n in ("norm.weight", "layers.0.attn.wq_a.weight", "layers.0.attn.wq_a.scale",
                                    "layers.0.hc_attn_fn")}
    rng = random.Random(FUZZ_SEED)
    refused = 0
    for i in range(FUZZ_CASES):
        kind, raw = mutate(st_save(good), rng)
        r = _from_disk(server, _shard(tmp_path / f"fuzz{i}", {}, raw=raw))
        assert r.status_code in (200, 400), (i, kind, r.text)
        if r.status_code == 400:
            refused += 1
            assert "model.safetensors" in r.json()["message"] or "tensor" in r.json()["message"], (i, kind, r.text)
        else:
            assert _from_disk(server, _shard(tmp_path / f"undo{i}", good)).status_code == 200
    assert refused >= FUZZ_CASES // 2
    _still_serving(server, baseline)


def test_good_update_serves_new_weights_under_the_same_name(server, baseline, tensors, tmp_path):
    changed = {"norm.weight": (tensors["norm.weight"].float() * 1.5).to(torch.bfloat16)}
    r = _from_disk(server, _shard(tmp_path / "good", changed), weight_version="v-good")
    assert r.status_code == 200 and r.json()["success"], r.text
    assert _greedy(server) != baseline
    models = requests.get(server.url + "/v1/models", timeout=DEADLINE_S).json()
    assert [m["id"] for m in models["data"]] == [NAME]
    r = requests.post(server.url + "/v1/completions", timeout=DEADLINE_S,
                      json={"model": NAME, "prompt": "Hello", "max_tokens": 2})
    assert r.status_code == 200, r.text
    r = _from_disk(server, _shard(tmp_path / "undo", {"norm.weight": tensors["norm.weight"]}))
    assert r.status_code == 200, r.text
    _still_serving(server, baseline)


# ------------------------------------------------------------------ /update_weights_from_tensor
def _payload(raw: bytes) -> str:
    return base64.b64encode(raw).decode()


def _from_tensor(server, payloads, **extra) -> requests.Response:
    return requests.post(server.url + "/update_weights_from_tensor", timeout=DEADLINE_S,
                         json={"serialized_named_tensors": payloads, **extra})


@pytest.fixture
def session(server):
    assert requests.post(server.url + "/begin_weight_update", json={}, timeout=DEADLINE_S).status_code == 200
    yield
    assert requests.post(server.url + "/end_weight_update", json={}, timeout=DEADLINE_S).status_code == 200


class _RunsCode:
    """Unpickling this calls a function that leaves a file behind."""

    def __init__(self, path):
        self.path = path

    def __reduce__(self):
        return (os.mkdir, (self.path,))


def _bad_tensor_cases(tmp_path, tensors):
    good = st_save({"norm.weight": tensors["norm.weight"]})
    return {
        "random bytes": ([_payload(random.Random(5).randbytes(512))], {}, "serialized_named_tensors[0]"),
        "a pickle that calls a function": (
            [_payload(pickle.dumps([("norm.weight", _RunsCode(str(tmp_path / "ran")))]))], {},
            "serialized_named_tensors[0]"),
        "a pickled tensor list": ([_payload(pickle.dumps([("norm.weight", tensors["norm.weight"])]))], {},
                                  "serialized_named_tensors[0]"),
        "load_format bogus": ([_payload(good)], {"load_format": "bogus"}, "load_format 'bogus'"),
        "load_format direct": ([_payload(good)], {"load_format": "direct"}, "load_format 'direct'"),
        "NaN weight": ([_payload(st_save(_nan_norm(tensors)))], {}, "holds NaN"),
        "no payload": ([], {}, "one payload per TP rank"),
        "unexpected tensor": ([_payload(st_save({"bogus": torch.zeros(2)}))], {}, "unexpected tensor 'bogus'"),
    }


def test_bad_tensor_update_is_a_400_and_runs_no_code(server, baseline, tensors, tmp_path, session):
    for case, (payloads, extra, fragment) in _bad_tensor_cases(tmp_path, tensors).items():
        r = _from_tensor(server, payloads, **extra)
        assert r.status_code == 400, (case, r.text)
        assert fragment in r.json()["message"], (case, r.text)
    assert not (tmp_path / "ran").exists()
    for body in ({"serialized_named_tensors": [[1, 2]]}, {"serialized_named_tensors": [{"a": 1}]},
                 {"serialized_named_tensors": "not a list"}, {"serialized_named_tensors": ["not base64!"]}):
        r = requests.post(server.url + "/update_weights_from_tensor", json=body, timeout=DEADLINE_S)
        assert 400 <= r.status_code < 500, (body, r.text)
    _still_serving(server, baseline)


def test_good_tensor_update_applies(server, baseline, tensors, session):
    changed = {"norm.weight": (tensors["norm.weight"].float() * 1.5).to(torch.bfloat16)}
    r = _from_tensor(server, [_payload(st_save(changed))])
    assert r.status_code == 200, r.text
    assert _greedy(server) != baseline
    r = _from_tensor(server, [_payload(st_save({"norm.weight": tensors["norm.weight"]}))])
    assert r.status_code == 200, r.text
    assert _greedy(server) == baseline


def test_seeded_fuzz_of_tensor_updates(server, baseline, tensors, session):
    good = {n: tensors[n] for n in ("norm.weight", "layers.0.hc_attn_fn")}
    rng = random.Random(FUZZ_SEED + 7)
    for i in range(FUZZ_CASES):
        kind, raw = mutate(st_save(good), rng)
        r = _from_tensor(server, [_payload(raw)])
        assert r.status_code in (200, 400), (i, kind, r.text)
        if r.status_code == 200:
            assert _from_tensor(server, [_payload(st_save(good))]).status_code == 200
    _still_serving(server, baseline)


def test_bad_checkpoint_stops_startup_naming_file_and_tensor(tmp_path):
    """A checkpoint with a NaN in one tensor: the server stops at startup with one error naming the file
    and the tensor (SGLang's own loader would have served it)."""
    from safetensors.torch import save_file

    from sglang_dsv41.checkpoint.update import read_update_dir
    from sglang_dsv41.config import ModelConfig
    from sglang_dsv41.tiny import write_tiny_checkpoint

    ckpt = write_tiny_checkpoint(tmp_path / "ckpt", "tiny", seed=0)
    shard = sorted(ckpt.glob("*.safetensors"))[0]
    assert len(list(ckpt.glob("*.safetensors"))) == 1
    tensors = read_update_dir(ckpt, ModelConfig.from_pretrained(ckpt))
    tensors["layers.1.ffn_norm.weight"][0] = float("nan")
    save_file(tensors, str(shard), metadata={"format": "pt"})
    with pytest.raises(RuntimeError) as e:
        srv = start_server(ckpt, tmp_path / "server.log")
        stop_server(srv.proc)
    assert f"tensor 'layers.1.ffn_norm.weight' in {shard.name}: holds NaN or Inf" in str(e.value), str(e.value)[-2000:]

"""The server half of training (issue 13), against one real SGLang server on the tiny model, started with the RL
flag alone (`--rl-on-policy-target sglang_dsv41`, none of the variables it sets: docs/rl.md):
- the server reports what the flag set (`/server_info`, the scheduler's own state);
- train/serve mismatch is exactly zero on the CPU (sampled at temperature 1), with and without R3, through the
  `train.mismatch` CLI, which checks the server at start;
- the samples of a group differ (each sample has its own seed under deterministic sampling) and a seed
  reproduces its samples;
- a weight update into the running server (full checkpoint, then a partial one) makes its logprobs
  exactly the new weights', and a bad update is refused with a 400 while the server keeps serving.
Oracle: the trainer's forward (`train.logprobs.response_logprobs`, the one forward over a dense KV)
on the checkpoint the server should be serving. The trainer side (this process) runs SGLANG_DSV41_DETERMINISTIC=1
(this module's fixture, for the in-process `measure()`) and MKL_CBWR=COMPATIBLE (test/conftest.py), as the flag
sets them in the server.
The split-schedule mismatch of earlier versions is fixed (docs/rl.md "Split schedules";
benchmark/split_schedule_mismatch.py is its stress run)."""

from __future__ import annotations

import json

import pytest
import requests
import torch

from launch import start_server, stop_server
from sglang_dsv41.train.mismatch import main as mismatch_main, random_prompts
from sglang_dsv41.train.rollout import ServerClient
from sglang_dsv41.train.logprobs import response_logprobs
from sglang_dsv41.train.weight_sync import write_partial_checkpoint
from sglang_dsv41.determinism import DETERMINISTIC_ENV


@pytest.fixture(scope="module", autouse=True)
def deterministic_trainer():
    """The trainer side of this module (this process) in deterministic mode, like the server."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv(DETERMINISTIC_ENV, "1")
        yield


@pytest.fixture(scope="module")
def server(tiny_dir, tmp_path_factory):
    log = tmp_path_factory.mktemp("rl_server") / "server.log"
    srv = start_server(tiny_dir, log, "--rl-on-policy-target", "sglang_dsv41",
                       unset=("SGLANG_RETURN_ORIGINAL_LOGPROB", DETERMINISTIC_ENV, "MKL_CBWR"))
    yield srv
    stop_server(srv.proc)


@pytest.fixture(scope="module")
def client(server):
    return ServerClient(server.url, timeout=600)


def test_server_reports_what_the_flag_set(server):
    info = requests.get(server.url + "/server_info", timeout=60).json()
    assert info["rl_on_policy_target"] == "sglang_dsv41" and info["device"] == "cpu"
    assert info["enable_deterministic_inference"] is True and info["enable_return_routed_experts"] is True
    assert info["enable_decoder_swa_bounded_replay"] is False and info["disable_radix_cache"] is False
    assert info["sampling_backend"] == "pytorch"
    (state,) = info["internal_states"]
    assert state["dsv41"] == {"deterministic": True, "return_original_logprob": True, "mkl_cbwr": "COMPATIBLE",
                              "aten_cpu_capability": "default", "torch_threads": torch.get_num_threads()}


def test_samples_of_a_group_differ_and_a_seed_reproduces_them(server, client, tiny_dir):
    """Deterministic sampling draws from (seed, position, token) alone: SGLang's `n` copies one seed into every
    sample of a group, the client gives each sample its own."""
    prompt = random_prompts(1, 8, 1000, seed=21)[0]
    group = [r.response for r in client.sample([prompt], 4, 6, temperature=1.0, seed=500)[0]]
    assert len(set(map(tuple, group))) > 1, group
    assert [r.response for r in client.sample([prompt], 4, 6, temperature=1.0, seed=500)[0]] == group
    body = {"input_ids": prompt, "sampling_params": {"max_new_tokens": 6, "temperature": 1.0, "n": 4}}
    copies = requests.post(server.url + "/generate", json=body, timeout=600).json()
    assert len({tuple(o["output_ids"]) for o in copies}) == 1


def test_mismatch_is_zero_with_and_without_r3(server, tiny_dir, capsys):
    """The CLI: sampled (temperature 1) responses, trainer recompute with the server's experts forced
    and (under "unforced") with the trainer's own routing."""
    mismatch_main(["--model", str(tiny_dir), "--server", server.url, "--prompts", "1", "--n", "2",
                   "--prompt-len", "8", "--max-new-tokens", "6", "--r3", "--seed", "3"])
    out = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert out["r3"] is True and out["sequences"] == 2 and out["tokens"] >= 2
    for m in (out, out["unforced"]):
        assert m["kl_mean"] == 0.0 and m["kl_p99"] == 0.0 and m["kl_max"] == 0.0
        assert m["dlogp_mean"] == 0.0 and m["dlogp_max"] == 0.0
    assert out["routing_agreement"] == 1.0


def _greedy(client, prompt, n=4):
    ro = client.sample([prompt], 1, n, temperature=0.0)[0][0]
    return ro.response, torch.tensor(ro.logprobs)


def _expected(model, prompt, response):
    with torch.no_grad():
        return response_logprobs(model, prompt, response)[0]


def test_weight_update_serves_the_new_weights(server, client, tiny_dir, tmp_path_factory):
    from sglang_dsv41.checkpoint.loader import load_model
    from sglang_dsv41.tiny import write_tiny_checkpoint

    root = tmp_path_factory.mktemp("updates")
    new_dir = write_tiny_checkpoint(root / "seed1", "tiny", seed=1)
    new = load_model(new_dir, progress=False)
    prompt = random_prompts(1, 10, new.cfg.vocab_size, seed=11)[0]
    _, before = _greedy(client, prompt)

    client.update_weights_from_disk(str(new_dir), weight_version="seed1")
    ids, after = _greedy(client, prompt)
    assert torch.equal(after, _expected(new, prompt, ids))
    assert not torch.equal(after, before[: len(after)])

    # A bad update is refused before any tensor is written; the server keeps serving.
    bad = root / "bad"
    bad.mkdir()
    from safetensors.torch import save_file

    save_file({"embed.weight": torch.zeros(3, 3, dtype=torch.bfloat16)}, str(bad / "model.safetensors"))
    r = requests.post(server.url + "/update_weights_from_disk", json={"model_path": str(bad)}, timeout=60)
    assert r.status_code == 400 and "embed.weight" in r.json()["message"] and "[3, 3]" in r.json()["message"]
    assert requests.get(server.url + "/health", timeout=30).status_code == 200

    # A partial update (one tensor, the embedding of the first checkpoint): the prompt's radix-cached KV
    # from before must not be reused, so the logprobs are exactly those of seed1 + the old embedding.
    old = load_model(tiny_dir, progress=False)
    with torch.no_grad():
        new.embed.weight.copy_(old.embed.weight)
    write_partial_checkpoint(root / "partial", {"embed.weight": old.embed.weight}, new.cfg)
    client.update_weights_from_disk(str(root / "partial"), weight_version="partial")
    ids, mixed = _greedy(client, prompt)
    assert torch.equal(mixed, _expected(new, prompt, ids))
    assert not torch.equal(mixed[: len(after)], after[: len(mixed)])


def test_weight_sync_of_trained_weights_serves_the_trainers_logprobs(server, client, tiny_dir, tmp_path_factory):
    """An RL step's weight sync (train/weight_sync.py: the trainer's non-frozen tensors after an
    optimizer step) into the running server: sampled rollouts (temperature 1, a group of 2) then carry
    exactly the trainer's logprobs, unforced and under R3 (KL and every |dlogp| exactly 0), and the
    rollouts report the pushed weight_version. The trainer runs at torch's default thread count, the
    server's (on the CPU the forward's last bits depend on it: docs/rl.md)."""
    from sglang_dsv41.train.mismatch import measure
    from sglang_dsv41.train.trainable import load_trainable, sequence_loss, trainable_parameters
    from sglang_dsv41.train.export import checkpoint_tensors
    from sglang_dsv41.train.weight_sync import WeightSync

    client.update_weights_from_disk(str(tiny_dir), weight_version="base")  # undo the updates above
    model = load_trainable(tiny_dir)
    opt = torch.optim.AdamW([p for _, p in trainable_parameters(model)], lr=1e-3)
    ids = torch.tensor(random_prompts(1, 16, model.cfg.vocab_size, seed=5)[0])
    loss, n = sequence_loss(model, ids, torch.ones(16, dtype=torch.bool))
    (loss / n).backward()
    opt.step()
    root = tmp_path_factory.mktemp("sync")
    WeightSync(client, root).push(checkpoint_tensors(model, include_frozen=False), model.cfg, "trained-1")
    groups = client.sample(random_prompts(1, 8, model.cfg.vocab_size, seed=7), 2, 6, temperature=1.0,
                           routed_experts=True, layers=model.cfg.num_layers, top_k=model.cfg.moe.n_activated_experts)
    rollouts = [r for g in groups for r in g]
    assert {r.weight_version for r in rollouts} == {"trained-1"}
    res = measure(model, rollouts, r3=True)
    for m in res.values():
        assert m.tokens >= 2 and m.kl_max == 0.0 and m.dlogp_max == 0.0, m
        assert m.routing_agreement == 1.0


def test_batch_response_logprobs_equal_the_servers(server, client, tiny_dir):
    """The RL step's batched trainer forward (`train.policy.batch_response_logprobs`: all rollouts
    right-padded into one forward of the trainable model) on rollouts sampled by the server (greedy and
    at temperature 1, several prompt lengths, one request at a time): every response token's logprob
    equals the server's bit for bit, with the trainer's own routing and with the server's experts
    forced (R3), and the trainer's routing equals the server's."""
    from sglang_dsv41.train.mismatch import same_expert_sets
    from sglang_dsv41.train.policy import batch_response_logprobs
    from sglang_dsv41.train.trainable import load_trainable

    client.update_weights_from_disk(str(tiny_dir), weight_version="base-batch")  # undo the sync above
    model = load_trainable(tiny_dir)
    cfg = model.cfg
    rollouts = []
    for i, (length, temperature) in enumerate([(3, 0.0), (11, 0.0), (6, 1.0), (9, 1.0)]):
        prompt = random_prompts(1, length, cfg.vocab_size, seed=40 + i)[0]
        rollouts += client.sample([prompt], 1, 3 + i, temperature=temperature, routed_experts=True,
                                  layers=cfg.num_layers, top_k=cfg.moe.n_activated_experts)[0]
    assert {r.weight_version for r in rollouts} == {"base-batch"}
    with torch.no_grad():
        own = batch_response_logprobs(model, rollouts)
        forced = batch_response_logprobs(model, rollouts, r3=True)
    for ro, lp, lp_r3, routed in zip(rollouts, own.logprobs, forced.logprobs, own.routed):
        server_lp = torch.tensor(ro.logprobs, dtype=torch.float32)
        assert torch.equal(lp, server_lp), (ro.prompt, ro.response, lp - server_lp)
        assert torch.equal(lp_r3, server_lp)
        assert bool(same_expert_sets(routed, ro.routed_experts).all())

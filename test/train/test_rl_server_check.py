"""The trainer's side of `--rl-on-policy-target sglang_dsv41` without a real server (train/rollout.py): the
start-up check of `/server_info`, one-line errors for every failed call, one `/generate` row per sample with
its own seed, and the CLIs stopping with one line before any model loads. Oracles: hand-written `/server_info`
bodies and an `http.server` thread that answers what each test gives it and records the requests."""

from __future__ import annotations

import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
import torch

from sglang_dsv41.train import rollout
from sglang_dsv41.train.rollout import ServerClient, ServerError, derive_seed, require_rl_server, rl_server_problem

URL = "http://srv"
NOT_RL = ("the server at http://srv was not started with --rl-on-policy-target sglang_dsv41 (rl_on_policy_target "
          "is None); restart it with that flag")
STALE = "its sglang-dsv41 is not this trainer's version"
CPU_ENV = {"MKL_CBWR": "COMPATIBLE", "ATEN_CPU_CAPABILITY": "default"}


def rl_info(**changes) -> dict:
    """A `/server_info` body of an RL server on the CPU (only the fields the check reads, as SGLang names them)."""
    state = {"deterministic": True, "return_original_logprob": True, "mkl_cbwr": "COMPATIBLE",
             "aten_cpu_capability": "default", "torch_threads": 2, **changes.pop("state", {})}
    info = {"rl_on_policy_target": "sglang_dsv41", "enable_deterministic_inference": True,
            "enable_return_routed_experts": True, "enable_decoder_swa_bounded_replay": False, "device": "cpu",
            "internal_states": [{"tp_size": 1, "dsv41": state}]}
    info.update(changes)
    return info


def test_rl_server_passes():
    assert rl_server_problem(rl_info(), URL, "cpu", 0, CPU_ENV) is None
    assert rl_server_problem(rl_info(), URL, "cpu", 2, CPU_ENV) is None
    assert rl_server_problem(rl_info(), URL, "cpu", 0, {**CPU_ENV, "SGLANG_DSV41_DETERMINISTIC": "1"}) is None
    # a trainer on another device than the server's CPU compares no CPU settings
    assert rl_server_problem(rl_info(), URL, "cuda", 3, {}) is None


@pytest.mark.parametrize("info, device, threads, env, message", [
    ({"rl_on_policy_target": None, "device": "cpu"}, "cpu", 0, CPU_ENV, NOT_RL),
    (rl_info(rl_on_policy_target="fsdp"), "cpu", 0, CPU_ENV, NOT_RL.replace("is None", "is 'fsdp'")),
    (rl_info(enable_return_routed_experts=False), "cpu", 0, CPU_ENV, "the server reports "
     f"enable_return_routed_experts=False under --rl-on-policy-target sglang_dsv41; {STALE}"),
    (rl_info(enable_decoder_swa_bounded_replay=None), "cpu", 0, CPU_ENV, "the server reports "
     f"enable_decoder_swa_bounded_replay=None under --rl-on-policy-target sglang_dsv41; {STALE}"),
    (rl_info(internal_states=[{"tp_size": 1}]), "cpu", 0, CPU_ENV, "the server reports no internal_states[].dsv41 "
     f"under --rl-on-policy-target sglang_dsv41; {STALE}"),
    (rl_info(state={"return_original_logprob": False}), "cpu", 0, CPU_ENV, "the server reports "
     f"dsv41.return_original_logprob=False under --rl-on-policy-target sglang_dsv41; {STALE}"),
    (rl_info(), "cpu", 0, {**CPU_ENV, "SGLANG_DSV41_DETERMINISTIC": "0"}, "SGLANG_DSV41_DETERMINISTIC='0' in this "
     "trainer contradicts the server's deterministic mode: unset it"),
    (rl_info(), "cpu", 0, {"ATEN_CPU_CAPABILITY": "default"}, "the server runs MKL_CBWR=COMPATIBLE, this trainer "
     "MKL_CBWR=None: export MKL_CBWR=COMPATIBLE before starting it"),
    (rl_info(), "cpu", 0, {**CPU_ENV, "ATEN_CPU_CAPABILITY": "avx2"}, "the server runs ATEN_CPU_CAPABILITY=default, "
     "this trainer ATEN_CPU_CAPABILITY=avx2: export ATEN_CPU_CAPABILITY=default before starting it"),
    (rl_info(), "cpu", 1, CPU_ENV, "the server's scheduler runs 2 torch threads, this trainer 1: pass --threads 2 "
     "(CPU logprobs depend on the thread count)"),
])
def test_rl_server_problems_are_one_line(info, device, threads, env, message):
    assert rl_server_problem(info, URL, device, threads, env) == message


def test_require_rl_server_adopts_the_servers_settings(monkeypatch):
    threads = []
    monkeypatch.setattr(torch, "set_num_threads", threads.append)
    monkeypatch.delenv("SGLANG_DSV41_DETERMINISTIC", raising=False)
    for name, value in CPU_ENV.items():
        monkeypatch.setenv(name, value)
    client = ServerClient(URL)
    monkeypatch.setattr(client, "server_info", lambda: rl_info(state={"torch_threads": 3}))
    assert require_rl_server(client, "cpu", 0)["device"] == "cpu"
    assert threads == [3]
    import os

    assert os.environ["SGLANG_DSV41_DETERMINISTIC"] == "1"
    monkeypatch.setattr(client, "server_info", lambda: {"rl_on_policy_target": None})
    with pytest.raises(ServerError, match=f"^{NOT_RL.replace('(', '[(]').replace(')', '[)]')}$"):
        require_rl_server(client, "cpu", 0)


# ---------------------------------------------------------------------- a fake server
class FakeServer:
    """Answers `routes[(method, path)]` = (status, content type, body text) or a callable(body) -> that tuple;
    records (method, path, parsed body) of every request."""

    def __init__(self, routes: dict):
        self.routes, self.requests = routes, []
        fake = self

        class Handler(BaseHTTPRequestHandler):
            def _answer(self, method):
                length = int(self.headers.get("content-length") or 0)
                body = json.loads(self.rfile.read(length)) if length else None
                fake.requests.append((method, self.path, body))
                route = fake.routes.get((method, self.path), (404, "application/json", '{"detail": "Not Found"}'))
                status, ctype, text = route(body) if callable(route) else route
                data = text.encode()
                try:
                    self.send_response(status)
                    self.send_header("content-type", ctype)
                    self.send_header("content-length", str(len(data)))
                    self.end_headers()
                    self.wfile.write(data)
                except (BrokenPipeError, ConnectionResetError):
                    pass

            def do_GET(self):  # noqa: N802
                self._answer("GET")

            def do_POST(self):  # noqa: N802
                self._answer("POST")

            def log_message(self, *args):
                pass

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.httpd.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        self.thread = threading.Thread(target=self.httpd.serve_forever, args=(0.05,), daemon=True)
        self.thread.start()

    def close(self):
        self.httpd.shutdown()
        self.httpd.server_close()


@pytest.fixture
def fake():
    servers = []

    def start(routes):
        servers.append(FakeServer(routes))
        return servers[-1]

    yield start
    for s in servers:
        s.close()


JSON = "application/json"


@pytest.mark.parametrize("route, client_timeout, message", [
    ((400, JSON, json.dumps({"error": {"message": "sampling_params[0].top_k: must be an integer,\n got 'x'"}})), 30,
     "POST /generate: HTTP 400: sampling_params[0].top_k: must be an integer, got 'x'"),
    ((400, JSON, json.dumps({"detail": [{"msg": "field required"}, {"msg": "not a list"}]})), 30,
     "POST /generate: HTTP 400: field required; not a list"),
    ((500, "text/html", "<html>\n<head><title>500 Internal Server Error</title></head><body>boom</body></html>"), 30,
     "POST /generate: HTTP 500: 500 Internal Server Error"),
    ((401, JSON, json.dumps({"error": "Unauthorized"})), 30,
     "POST /generate: HTTP 401 (ServerClient sends no API key): Unauthorized"),
    ((200, "text/plain", "ok\nmore"), 30, "POST /generate: HTTP 200 with a body that is not JSON: ok"),
    ((503, "text/plain", ""), 30, "POST /generate: HTTP 503: (empty body)"),
    ((400, JSON, json.dumps({"message": "x" * 1000})), 30, "POST /generate: HTTP 400: " + "x" * 297 + "..."),
])
def test_http_errors_are_one_line(fake, route, client_timeout, message):
    srv = fake({("POST", "/generate"): route})
    with pytest.raises(ServerError) as e:
        ServerClient(srv.url, timeout=client_timeout).sample([[5, 6]], 1, 2)
    assert str(e.value) == message


def test_unreachable_and_slow_servers(fake):
    srv = fake({("POST", "/generate"): lambda body: time.sleep(2) or (200, JSON, "[]")})
    with pytest.raises(ServerError) as e:
        ServerClient(srv.url, timeout=0.3).sample([[5, 6]], 1, 2)
    assert str(e.value) == f"POST /generate: the SGLang server at {srv.url} did not answer within 0.3 s (ReadTimeout)"
    srv.close()
    with pytest.raises(ServerError) as e:
        ServerClient(srv.url).server_info()
    assert str(e.value) == f"cannot reach the SGLang server at {srv.url} (ConnectionError)"
    with pytest.raises(ServerError) as e:
        ServerClient("127.0.0.1:30000").server_info()
    assert str(e.value) == "'127.0.0.1:30000' is not a server URL (e.g. http://127.0.0.1:30000)"


def _result(prompt_len: int, response: list[int], version: str = "v1") -> dict:
    return {"output_ids": response, "meta_info": {"output_token_logprobs": [[-0.5 * (i + 1), t, None]
                                                                         for i, t in enumerate(response)],
                                                "finish_reason": {"type": "length"}, "weight_version": version}}


def test_sample_sends_one_row_per_sample_with_its_own_seed(fake):
    answers = [_result(2, [10 + k, 20 + k]) for k in range(6)]
    srv = fake({("POST", "/generate"): (200, JSON, json.dumps(answers))})
    groups = ServerClient(srv.url).sample([[5, 6], [7, 8, 9]], 3, 2, temperature=0.7, seed=100, stop_token_ids=[1])
    ((method, path, body),) = srv.requests
    assert (method, path) == ("POST", "/generate")
    assert body["input_ids"] == [[5, 6]] * 3 + [[7, 8, 9]] * 3  # prompt-major, one row per sample
    assert body["sampling_params"] == [{"max_new_tokens": 2, "temperature": 0.7, "stop_token_ids": [1],
                                        "sampling_seed": 100 + k} for k in range(6)]
    assert body["return_logprob"] is True and "return_routed_experts" not in body
    assert [[r.prompt for r in g] for g in groups] == [[[5, 6]] * 3, [[7, 8, 9]] * 3]
    assert [r.response for g in groups for r in g] == [[10 + k, 20 + k] for k in range(6)]
    assert groups[1][2].logprobs == [-0.5, -1.0] and groups[1][2].finish == "length"
    assert groups[0][0].weight_version == "v1"


def test_sample_refuses_bad_answers(fake):
    srv = fake({("POST", "/generate"): (200, JSON, json.dumps([_result(2, [3, 4])]))})
    client = ServerClient(srv.url)
    with pytest.raises(ServerError, match=r"^POST /generate: 1 results for 1 prompts x n=2$"):
        client.sample([[5, 6]], 2, 2)
    with pytest.raises(ServerError, match=r"^POST /generate: result 0 has no routed_experts: start the server with "
                                          r"--rl-on-policy-target sglang_dsv41$"):
        client.sample([[5, 6]], 1, 2, routed_experts=True, layers=2, top_k=2)
    srv.routes[("POST", "/generate")] = (200, JSON, json.dumps([{"error": "x"}]))
    with pytest.raises(ServerError, match=r"^POST /generate: result 0 is not a generate result with logprobs "
                                          r"\(KeyError: 'meta_info'\)$"):
        client.sample([[5, 6]], 1, 2)
    with pytest.raises(ValueError, match="seed must be in"):
        client.sample([[5, 6]], 2, 2, seed=2**63 - 2)
    assert client.sample([], 2, 2) == []


def test_weight_update_refusal_is_one_line(fake):
    srv = fake({("POST", "/update_weights_from_disk"): (200, JSON, json.dumps(
        {"success": False, "message": "embed.weight: expected shape [32, 8],\n got [3, 3]"}))})
    with pytest.raises(ServerError) as e:
        ServerClient(srv.url).update_weights_from_disk("/x", weight_version="v2")
    assert str(e.value) == "POST /update_weights_from_disk: embed.weight: expected shape [32, 8], got [3, 3]"
    assert srv.requests == [("POST", "/update_weights_from_disk", {"model_path": "/x", "weight_version": "v2"})]


def test_derive_seed():
    seeds = {derive_seed(0, step, rnd) for step in range(50) for rnd in range(4)}
    assert len(seeds) == 200 and all(0 <= s < 2**62 for s in seeds)
    assert derive_seed(3, 1, 2) == derive_seed(3, 1, 2) != derive_seed(3, 2, 1)


# ---------------------------------------------------------------------- the CLIs against a server without the flag
@pytest.fixture
def plain_server(fake):
    info = {"rl_on_policy_target": None, "enable_deterministic_inference": False, "device": "cpu",
            "internal_states": [{"tp_size": 1}]}
    return fake({("GET", "/server_info"): (200, JSON, json.dumps(info))})


def _no_model_load(monkeypatch):
    def refuse(*args, **kwargs):
        raise AssertionError("a model was loaded before the server check")

    import sglang_dsv41.checkpoint.loader as loader
    import sglang_dsv41.train.trainable as trainable

    monkeypatch.setattr(loader, "load_model", refuse)
    monkeypatch.setattr(trainable, "load_trainable", refuse)


def test_mismatch_stops_with_one_line(plain_server, monkeypatch):
    from sglang_dsv41.train import mismatch

    _no_model_load(monkeypatch)
    with pytest.raises(SystemExit) as e:
        mismatch.main(["--model", "deepseek-v4.1-tiny", "--server", plain_server.url])
    assert str(e.value) == "train.mismatch: " + NOT_RL.replace(URL, plain_server.url)
    assert [r[:2] for r in plain_server.requests] == [("GET", "/server_info")]


def test_mismatch_any_server_warns_and_measures(plain_server, monkeypatch, capsys):
    """--any-server goes on to load the model (here refused by the stand-in, which proves it got that far)."""
    from sglang_dsv41.train import mismatch

    _no_model_load(monkeypatch)
    with pytest.raises(AssertionError, match="a model was loaded"):
        mismatch.main(["--model", "deepseek-v4.1-tiny", "--server", plain_server.url, "--any-server"])
    assert capsys.readouterr().err == ("train.mismatch: measuring anyway (--any-server): "
                                       + NOT_RL.replace(URL, plain_server.url) + "\n")


def test_rl_stops_with_one_line(plain_server, monkeypatch, tmp_path):
    from sglang_dsv41.train import rl

    _no_model_load(monkeypatch)
    with pytest.raises(SystemExit) as e:
        rl.main(["--server", plain_server.url, "--out", str(tmp_path / "out")])
    assert str(e.value) == "train.rl: " + NOT_RL.replace(URL, plain_server.url)
    assert [r[:2] for r in plain_server.requests] == [("GET", "/server_info")]


def test_rl_unreachable_server_is_one_line(tmp_path, fake):
    from sglang_dsv41.train import rl

    srv = fake({})
    srv.close()
    with pytest.raises(SystemExit) as e:
        rl.main(["--server", srv.url, "--out", str(tmp_path / "out")])
    assert str(e.value) == f"train.rl: cannot reach the SGLang server at {srv.url} (ConnectionError)"


def test_served_eval_errors_are_one_line(fake):
    from sglang_dsv41.train import served_eval

    srv = fake({("POST", "/v1/chat/completions"): (400, JSON, json.dumps(
        {"object": "error", "message": "The model `m` does not exist.", "type": "BadRequestError", "code": 400}))})
    with pytest.raises(SystemExit) as e:
        served_eval.main(["--server", srv.url, "--model", "m", "--n", "2", "--workers", "1"])
    assert str(e.value) == "served_eval: POST /v1/chat/completions: HTTP 400: The model `m` does not exist."
    assert rollout.one_line("a\n  b\tc") == "a b c"

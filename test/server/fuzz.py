"""A seeded generator of malformed and extreme requests for the HTTP surface, and the check of one reply.

Every case is built from its own seed (`case_seed(seed, i)`), so a failure reproduces alone:

    python test/server/fuzz.py --url http://127.0.0.1:30000 --case-seed 123456   # one case, printed
    python test/server/fuzz.py --url http://127.0.0.1:30000 --seed 7 --count 500  # a run

Each case is labelled by construction:
  valid    a small valid request to `/generate`, `/v1/completions` or `/v1/chat/completions` (at most a few
           new tokens, so it is quick) with zero to three variations that keep it inside the API's contract
           (legal sampling and logprob parameters, token-id or batched prompts, several samples, system and
           multi-turn chats, streaming). It must be served: a 200 whose answer has the endpoint's shape and
           counts consistent with the request (`check_served`).
  invalid  the same bases with one to three mutations from pools of wrong types, out-of-range numbers, token
           ids around the vocabulary, empty / huge / odd-encoding prompts, batch shapes, unsupported features
           or a broken raw body. Some pools hold edge values the API also allows, so such a case may be
           refused (a 4xx whose body carries a message, and no server path or traceback) or served (a
           well-formed 200; a stream may end in SGLang's in-stream error event).
"""

from __future__ import annotations

import argparse
import json
import random
from dataclasses import dataclass, field

import requests

MAX_NEW = 2
"""New tokens of an accepted case; with prompts of at most a few dozen tokens this keeps a run of hundreds
of cases short on a CPU (a forward of the tiny model's exact FP8/FP4 emulation takes about a second on a
loaded 2-core machine)."""

PATHS = ("/generate", "/v1/completions", "/v1/chat/completions")
SERVER_TRACES = ('File "', "Traceback", "site-packages", ".py\", line")


@dataclass
class Case:
    seed: int
    path: str
    body: bytes
    headers: dict = field(default_factory=lambda: {"Content-Type": "application/json"})
    stream: bool = False
    what: list[str] = field(default_factory=list)
    valid: bool = False
    """True: built only from valid parts, so the server must serve it (200, well-formed, consistent)."""

    def describe(self, limit: int = 600) -> str:
        text = self.body.decode("utf-8", "replace")
        if len(text) > limit:
            text = text[:limit] + f"... ({len(self.body)} bytes)"
        kind = "valid" if self.valid else "invalid"
        return f"case seed {self.seed} ({kind}): POST {self.path} [{', '.join(self.what)}] {text}"


def case_seed(seed: int, index: int) -> int:
    return seed * 1_000_003 + index


# ---------------------------------------------------------------------------- value pools
def _odd_values(r: random.Random, vocab: int) -> list:
    """Values of the wrong type or at the edges of any numeric range."""
    return [None, True, False, 0, -1, 1, 2, vocab - 1, vocab, vocab + 1, 2**31, 2**63, 2**64, -(2**63), 1e308,
            -0.0, 0.5, -1.5, "", "1", "abc", "\u0000", "😀" * 3, [], [1], [[1]], {}, {"a": 1}, [1, "a"],
            r.random() * 10 - 5, r.randint(-10, 10 * vocab)]


def _token_ids(r: random.Random, vocab: int, n: int | None = None) -> list[int]:
    n = r.choice([1, 2, 5, 11, 17]) if n is None else n
    return [r.randrange(3, vocab - 1) for _ in range(n)]


def _bad_token_ids(r: random.Random, vocab: int) -> list:
    ids = _token_ids(r, vocab)
    ids[r.randrange(len(ids))] = r.choice([-1, -(2**31), vocab, vocab + 1, vocab * 100, 2**31, 2**62, 2**63 - 1])
    return ids


def _text(r: random.Random) -> str:
    return r.choice(["Hello", "The quick brown fox", " ", "\n\n", "日本語のテキスト", "😀👍🏽", "a" * 40,
                     "<｜begin▁of▁sentence｜>", "<|im_start|>", "\u200b\u200d", "x\u0000y", "\t" * 5, "é" * 20])


# ---------------------------------------------------------------------------- valid bases
def _base(r: random.Random, path: str, model: str, vocab: int, text=_text) -> dict:
    """A valid request (`text(r)` draws its text prompts)."""
    if path == "/generate":
        body = {"sampling_params": {"max_new_tokens": r.randint(1, MAX_NEW), "temperature": r.choice([0, 0.7, 1.0])}}
        if r.random() < 0.5:
            body["text"] = text(r)
        else:
            body["input_ids"] = _token_ids(r, vocab)
        return body
    if path == "/v1/completions":
        prompt = text(r) if r.random() < 0.6 else _token_ids(r, vocab)
        return {"model": model, "prompt": prompt, "max_tokens": r.randint(1, MAX_NEW), "temperature": r.choice([0, 1.0])}
    return {"model": model, "messages": [{"role": "user", "content": text(r)}], "max_tokens": r.randint(1, MAX_NEW),
            "temperature": r.choice([0, 1.0])}


# ---------------------------------------------------------------------------- mutations
# Each takes (rng, body, path, vocab) and edits body in place, returning a short label.
def _params(body: dict, path: str) -> dict:
    """Where sampling parameters live for this endpoint (the body itself for OpenAI)."""
    if path == "/generate":
        sp = body.setdefault("sampling_params", {})
        return sp if isinstance(sp, dict) else body
    return body


def _max_field(path: str) -> str:
    return "max_new_tokens" if path == "/generate" else "max_tokens"


def m_odd_field(r, body, path, vocab):
    """Any known field set to a value of the wrong type or range."""
    fields = {
        "/generate": ["text", "input_ids", "sampling_params", "return_logprob", "logprob_start_len",
                      "top_logprobs_num", "token_ids_logprob", "stream", "rid", "return_text_in_logprobs",
                      "routed_experts_start_len", "priority", "lora_path", "session_params", "log_metrics"],
        "/v1/completions": ["prompt", "max_tokens", "n", "logprobs", "echo", "stop", "temperature", "top_p",
                            "seed", "suffix", "best_of", "user", "stream_options", "logit_bias", "min_tokens"],
        "/v1/chat/completions": ["messages", "max_tokens", "max_completion_tokens", "n", "logprobs",
                                 "top_logprobs", "stop", "tools", "tool_choice", "response_format", "seed",
                                 "stream_options", "logit_bias", "reasoning_effort", "chat_template_kwargs"],
    }[path]
    name = r.choice(fields)
    value = r.choice(_odd_values(r, vocab))
    if name in ("max_tokens", "max_completion_tokens") and (value is None or (
            isinstance(value, int) and not isinstance(value, bool) and MAX_NEW < value < 40_000)):
        value = 10**9  # unset or a legal large limit is a long generation, not an odd input
    body[name] = value
    return f"{name}={value!r}"[:80]


def m_sampling(r, body, path, vocab):
    """One sampling parameter at an edge or of the wrong type."""
    choices = {
        "temperature": [-1, 0, 1e-9, 1e-30, 100, 1e308, "hot", None],
        "top_p": [0, 1e-9, 1, 1.0001, -1, 2, "x"],
        "top_k": [-2, -1, 0, 1, vocab, vocab + 1, 2**31, 2**63, 1.5],
        "min_p": [-0.1, 0, 1, 1.5],
        "frequency_penalty": [-2.1, -2, 2, 2.1, 1e9],
        "presence_penalty": [-2.1, 2, 2.1],
        "repetition_penalty": [0, -1, 1, 2, 2.1, 1e-9],
        "min_new_tokens" if path == "/generate" else "min_tokens": [-1, 0, 1, MAX_NEW, 10**6],
        _max_field(path): [0, -1, 1, 2**31, 10**9, 40000, 1.5, "2", True],
        "n": [0, -1, 1, 2, 3, 129, 1000, 2.5, "2"],
        "stop": ["", "a", ["", ""], ["x"] * 100, "z" * 1000, [1, 2], None],
        "stop_token_ids": [[], [0], [vocab - 1], [vocab], [-1], ["a"], [2**63]],
        "logit_bias": [{}, {"5": 100}, {str(vocab): 1}, {"-1": 1}, {"abc": 1}, {"5": "x"}, {"5": 1e308}, [1]],
        "seed": [-1, 0, 2**63, 2**64, "s", 1.5],
        "ignore_eos": [True, "yes"],
        "skip_special_tokens": [False, 3],
        # Only broken grammars: compiling a valid one takes 10-60 s on a 2-core CPU (not a fuzz case).
        "regex": ["(", "\\", "[z-a]"],
        "json_schema": ["{", '{"type": "nonsense"}', "[]"],
        "ebnf": ["root ::=", "::="],
    }
    name = r.choice(sorted(choices))
    value = r.choice(choices[name])
    if path != "/generate" and name in ("regex", "json_schema", "ebnf"):
        if name == "json_schema":
            value = r.choice([[1], "json", {"type": "json_schema"}, {"type": "nonsense"},
                              {"type": "json_schema", "json_schema": {"name": "x", "schema": "{"}}])
            body["response_format"] = value
            return f"response_format={value!r}"[:80]
        body[name] = value
    elif path != "/generate" and name == "n" and value in (2, 3):
        body["n"] = value
    else:
        _params(body, path)[name] = value
    return f"{name}={value!r}"[:80]


def m_token_ids(r, body, path, vocab):
    """Token-id prompts around the vocabulary and of odd shapes."""
    kind = r.choice(["bad", "bad", "empty", "nested-empty", "boundary", "too-long", "floats", "batch-bad", "strings"])
    ids = {"bad": lambda: _bad_token_ids(r, vocab), "empty": lambda: [], "nested-empty": lambda: [[]],
           "boundary": lambda: [0, vocab - 1, 1, vocab - 2], "too-long": lambda: [5] * 40000,
           "floats": lambda: [5.0, 6.5], "batch-bad": lambda: [_token_ids(r, vocab), _bad_token_ids(r, vocab)],
           "strings": lambda: ["5", "6"]}[kind]()
    if path == "/generate":
        body.pop("text", None)
        body["input_ids"] = ids
    elif path == "/v1/completions":
        body["prompt"] = ids
    else:
        body["messages"] = [{"role": "user", "content": ids}]
    return f"ids:{kind}"


def m_text(r, body, path, vocab):
    """Empty, huge and odd-encoding text prompts."""
    kind = r.choice(["empty", "space", "huge", "over-context", "surrogate", "controls", "batch-empty", "batch-huge",
                     "rtl"])
    text = {"empty": "", "space": " ", "huge": "ab " * 700_000, "over-context": "hello " * 40_000,
            "surrogate": "a\ud800b", "controls": "".join(map(chr, range(32))), "rtl": "\u202eabc\u202c",
            "batch-empty": ["hi", ""], "batch-huge": ["hi", "x" * 1_100_000]}[kind]
    if path == "/generate":
        body.pop("input_ids", None)
        body["text"] = text
    elif path == "/v1/completions":
        body["prompt"] = text
    else:
        body["messages"] = [{"role": "user", "content": text if isinstance(text, str) else text[-1]}]
    return f"text:{kind}"


def m_logprobs(r, body, path, vocab):
    """Logprob requests past the vocabulary, the prompt or the types."""
    k = r.choice([-1, 0, 1, 5, 20, 21, vocab - 1, vocab, vocab + 1, 10**6, "3", 2.5])
    if path == "/generate":
        body["return_logprob"] = r.choice([True, True, "yes", 1])
        body[r.choice(["top_logprobs_num", "logprob_start_len", "token_ids_logprob"])] = (
            r.choice([k, [k], [5, vocab], [-1], []]))
        body["logprob_start_len"] = r.choice([-2, -1, 0, 1, 3, 10**6, body.get("logprob_start_len", -1)])
    elif path == "/v1/completions":
        body["logprobs"] = k
        body["echo"] = r.choice([True, False])
    else:
        body["logprobs"] = r.choice([True, False, "x"])
        body["top_logprobs"] = k
    return f"logprobs:{k!r}"


def m_batch(r, body, path, vocab):
    """Batch shapes: empty, mismatched parameter lists, mixed prompt kinds, parallel samples."""
    size = r.choice([0, 1, 2, 3, 9])
    if path == "/generate":
        kind = r.choice(["text", "ids", "both", "params-list", "params-mismatch", "n-batch", "rid-dupe"])
        body.pop("text", None)
        body.pop("input_ids", None)
        if kind in ("text", "params-list", "params-mismatch", "n-batch", "rid-dupe"):
            body["text"] = [_text(r) for _ in range(size)]
        if kind in ("ids", "both"):
            body["input_ids"] = [_token_ids(r, vocab) for _ in range(size)]
        if kind == "both":
            body["text"] = [_text(r) for _ in range(size)]
        if kind in ("params-list", "params-mismatch"):
            n = size if kind == "params-list" else size + 1
            body["sampling_params"] = [{"max_new_tokens": r.randint(1, MAX_NEW)} for _ in range(n)]
        if kind == "n-batch":
            body["sampling_params"] = {"max_new_tokens": 1, "n": r.choice([2, 3])}
        if kind == "rid-dupe":
            body["rid"] = ["same"] * size
        return f"batch:{kind}x{size}"
    if path == "/v1/completions":
        body["prompt"] = r.choice([[_text(r) for _ in range(size)], [_token_ids(r, vocab) for _ in range(size)],
                                   [_text(r), _token_ids(r, vocab)]])
        return f"batch:prompts x{size}"
    body["messages"] = r.choice([[], [{"role": "user", "content": _text(r)}] * size,
                                 [{"role": "assistant", "content": "hi"}], [{"role": "system", "content": ""}],
                                 [{"role": "tool", "content": "x"}], [{"role": "nobody", "content": "x"}],
                                 [{"content": "no role"}], [{"role": "user"}], [{"role": "user", "content": None}]])
    return "batch:messages"


def m_feature(r, body, path, vocab):
    """Features this server does not serve, or serves only with a flag it was not started with."""
    if path == "/generate":
        name, value = r.choice([("image_data", "abc"), ("image_data", ["data:image/png;base64,AAAA"]),
                                ("audio_data", "x"), ("video_data", "x"), ("input_embeds", [[0.0] * 8]),
                                ("return_hidden_states", True), ("return_routed_experts", True),
                                ("routed_experts_start_len", -1), ("custom_logit_processor", "x"),
                                ("lora_path", "nope"), ("session_params", {"id": "nope"}),
                                ("return_sampling_mask", True), ("max_thinking_tokens", 5), ("bootstrap_room", -1),
                                ("data_parallel_rank", 3), ("routed_dp_rank", 5), ("return_indexer_topk", True)])
        body[name] = value
        return f"feature:{name}"
    if path == "/v1/completions":
        name, value = r.choice([("suffix", "x"), ("best_of", 3), ("model", "no-such-model"), ("model", ""),
                                ("lora_path", "x"), ("return_hidden_states", True), ("echo", True)])
        body[name] = value
        return f"feature:{name}"
    part = r.choice([{"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}},
                     {"type": "input_audio", "input_audio": {"data": "AAAA", "format": "wav"}},
                     {"type": "video_url", "video_url": {"url": "http://127.0.0.1:1/x.mp4"}},
                     {"type": "text", "text": "hi"}, {"type": "nonsense"}])
    body["messages"] = [{"role": "user", "content": [{"type": "text", "text": "look"}, part]}]
    if r.random() < 0.3:
        body["tools"] = [{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}]
        # "required" or a named tool would compile a grammar (slow here); a missing tool is refused.
        body["tool_choice"] = r.choice(["auto", "none", {"type": "function", "function": {"name": "g"}}])
    return f"feature:{part.get('type')}"


MUTATIONS = (m_odd_field, m_sampling, m_sampling, m_token_ids, m_text, m_logprobs, m_batch, m_feature)


def _raw_body(r: random.Random, body: dict) -> tuple[bytes, dict, str]:
    """A broken body: truncated, not JSON, wrong shape, wrong encoding or wrong content type."""
    text = json.dumps(body)
    kind = r.choice(["truncated", "not-json", "array", "string", "deep", "latin1", "bom", "nan", "huge-number",
                     "dup-keys", "content-type", "empty", "null"])
    headers = {"Content-Type": "application/json"}
    raw = {
        "truncated": lambda: text[: r.randrange(max(len(text), 1))].encode(),
        "not-json": lambda: b"hello there",
        "array": lambda: b"[1, 2, 3]",
        "string": lambda: b'"just a string"',
        "deep": lambda: b'{"text": ' + b"[" * 5000 + b"]" * 5000 + b"}",
        "latin1": lambda: text.encode()[:-1] + b' , "x": "\xff\xfe"}',
        "bom": lambda: b"\xef\xbb\xbf" + text.encode(),
        "nan": lambda: text[:-1].encode() + b', "temperature": NaN}',
        "huge-number": lambda: text[:-1].encode() + b', "seed": 1' + b"0" * 400 + b"}",
        "dup-keys": lambda: text[:-1].encode() + b', "stream": true, "stream": false}',
        "content-type": lambda: text.encode(),
        "empty": lambda: b"",
        "null": lambda: b"null",
    }[kind]()
    if kind == "content-type":
        headers = {"Content-Type": r.choice(["text/plain", "application/x-www-form-urlencoded", ""])}
    return raw, headers, f"raw:{kind}"


# ---------------------------------------------------------------------------- valid variations
# Each takes (rng, body, path, vocab), edits a valid body into another valid one and returns a short label.
# Values stay inside SGLang's documented ranges (sampling_params.verify, the OpenAI protocol models).
GOOD_TEXTS = ("Hello", "The quick brown fox", "日本語のテキスト", "😀👍🏽", "a" * 40, "é" * 20, "1+1=")


def _all_params(body: dict, path: str) -> list[dict]:
    """Every sampling-parameter dict of a valid body (one per prompt when /generate has a list)."""
    sp = body["sampling_params"] if path == "/generate" else body
    return sp if isinstance(sp, list) else [sp]


def v_sampling(r, body, path, vocab):
    """One sampling parameter at a legal value (range ends included)."""
    gen = path == "/generate"
    choices = {
        "temperature": [0, 0.5, 1.0, 2.0], "top_p": [0.1, 1.0], "top_k": [-1, 1, 5, vocab], "min_p": [0.0, 0.5, 1.0],
        "frequency_penalty": [-2.0, 0.0, 2.0], "presence_penalty": [-2.0, 1.0, 2.0], "repetition_penalty": [0.5, 1.0, 2.0],
        "min_new_tokens" if gen else "min_tokens": [0, 1], "stop": ["x", ["a", "zz"]], "stop_token_ids": [[5], [vocab - 1]],
        "logit_bias": [{"5": 1.0}, {str(vocab - 1): -100}, {"7": 100}], "ignore_eos": [True, False],
        "skip_special_tokens": [True, False], "sampling_seed" if gen else "seed": [0, 7, 2**31],
    }
    name = r.choice(sorted(choices))
    value = r.choice(choices[name])
    for params in _all_params(body, path):
        params[name] = min(value, params[_max_field(path)]) if name in ("min_new_tokens", "min_tokens") else value
    return f"{name}={value!r}"


def v_samples(r, body, path, vocab):
    """Several samples of one prompt."""
    n = r.choice([1, 2, 3])
    for params in _all_params(body, path):
        params["n"] = n
    return f"n={n}"


def v_logprobs(r, body, path, vocab):
    """Logprobs of the sampled tokens, with top alternatives in range."""
    if path == "/generate":
        body["return_logprob"] = True
        body["top_logprobs_num"] = r.choice([0, 1, 5])
        body["logprob_start_len"] = r.choice([-1, 0])
    elif path == "/v1/completions":
        body["logprobs"] = r.choice([0, 1, 5])
    else:
        body["logprobs"] = True
        body["top_logprobs"] = r.choice([0, 3, 20])
    return "logprobs"


def v_prompt(r, body, path, vocab):
    """Another prompt of the same endpoint: token ids or a batch of 1-3 prompts of one kind (with a
    per-prompt parameter list on /generate), or a system / multi-turn / content-part chat."""
    size = r.choice([1, 2, 3])
    if path == "/generate":
        body.pop("text", None)
        body.pop("input_ids", None)
        key = r.choice(["text", "input_ids"])
        make = (lambda: r.choice(GOOD_TEXTS)) if key == "text" else (lambda: _token_ids(r, vocab))
        body[key] = [make() for _ in range(size)]
        if r.random() < 0.5:
            sp = body["sampling_params"]
            body["sampling_params"] = [{**sp, "max_new_tokens": r.randint(1, MAX_NEW)} for _ in range(size)]
        return f"batch:{key}x{size}"
    if path == "/v1/completions":
        make = (lambda: r.choice(GOOD_TEXTS)) if r.random() < 0.5 else (lambda: _token_ids(r, vocab))
        body["prompt"] = [make() for _ in range(size)] if r.random() < 0.7 else make()
        return "prompt"
    turns = [{"role": "user", "content": r.choice(GOOD_TEXTS)}]
    if r.random() < 0.5:
        turns = [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": r.choice(GOOD_TEXTS)}] + turns
    if r.random() < 0.5:
        turns = [{"role": "system", "content": r.choice(GOOD_TEXTS)}] + turns
    if r.random() < 0.3:
        turns[-1]["content"] = [{"type": "text", "text": turns[-1]["content"]}]
    body["messages"] = turns
    return f"messages x{len(turns)}"


def v_stream(r, body, path, vocab):
    """Streaming (OpenAI: sometimes with the usage chunk)."""
    body["stream"] = True
    if path != "/generate" and r.random() < 0.5:
        body["stream_options"] = {"include_usage": True}
    return "stream"


VARIATIONS = (v_sampling, v_sampling, v_samples, v_logprobs, v_prompt, v_stream)
VALID_SHARE = 0.4
"""Share of the cases built valid."""


def make_case(seed: int, model: str, vocab: int) -> Case:
    r = random.Random(seed)
    path = r.choice(PATHS)
    if r.random() < VALID_SHARE:
        body = _base(r, path, model, vocab, text=lambda r: r.choice(GOOD_TEXTS))
        what = [v(r, body, path, vocab) for v in r.sample(VARIATIONS, r.choice([0, 1, 2, 3]))]
        return Case(seed, path, json.dumps(body, ensure_ascii=r.random() < 0.5).encode(),
                    stream=body.get("stream") is True, what=what, valid=True)
    body = _base(r, path, model, vocab)
    what = [m(r, body, path, vocab) for m in r.sample(MUTATIONS, r.choice([1, 1, 2, 3]))]
    if r.random() < 0.2:
        body["stream"] = True
    stream = body.get("stream") is True
    if r.random() < 0.1:
        raw, headers, label = _raw_body(r, body)
        return Case(seed, path, raw, headers, stream, [*what, label])
    return Case(seed, path, json.dumps(body, ensure_ascii=r.random() < 0.5).encode("utf-8", "surrogatepass"),
                stream=stream, what=what)


# ---------------------------------------------------------------------------- reply check
def _message(body) -> str | None:
    """The error message of SGLang's error shapes ({"message"}, {"error": str}, {"error": {"message"}})."""
    if not isinstance(body, dict):
        return None
    err = body.get("error", body)
    if isinstance(err, str):
        return err
    if isinstance(err, dict) and isinstance(err.get("message"), str):
        return err["message"]
    return body.get("message") if isinstance(body.get("message"), str) else None


def _valid_answer(path: str, body) -> bool:
    if path == "/generate":
        items = body if isinstance(body, list) else [body]
        return all(isinstance(x, dict) and isinstance(x.get("text"), str) and "finish_reason" in x.get("meta_info", {})
                   for x in items)
    choices = body.get("choices") if isinstance(body, dict) else None
    if not isinstance(choices, list) or not choices:
        return False
    if path == "/v1/completions":
        return all(isinstance(c.get("text"), str) for c in choices)
    return all(isinstance(c.get("message"), dict) for c in choices)


def _expected(case: Case) -> tuple[int, list[int]]:
    """A valid case's (number of answers, max new tokens of each answer): prompts x n, prompt-major."""
    body = json.loads(case.body)
    if case.path == "/generate":
        prompts = body.get("text", body.get("input_ids"))
        batch = isinstance(prompts, list) and bool(prompts) and isinstance(prompts[0], (str, list))
        size = len(prompts) if batch else 1
        sp = body["sampling_params"]
        sps = sp if isinstance(sp, list) else [sp] * size
        n = sps[0].get("n", 1)
        return size * n, [s["max_new_tokens"] for s in sps for _ in range(n)]
    n = body.get("n", 1)
    prompt = body.get("prompt")
    size = len(prompt) if isinstance(prompt, list) and prompt and isinstance(prompt[0], (str, list)) else 1
    return size * n, [body["max_tokens"]] * (size * n)


FINISH = ("stop", "length")


def _usage_problem(usage, limits: list[int]) -> str | None:
    if not isinstance(usage, dict):
        return f"usage is {usage!r}"
    p, c, t = usage.get("prompt_tokens"), usage.get("completion_tokens"), usage.get("total_tokens")
    if not (isinstance(p, int) and p >= 1 and isinstance(c, int) and 0 <= c <= sum(limits) and t == p + c):
        return f"usage counts inconsistent with max_tokens {limits}: {usage}"
    return None


def check_served(case: Case, status: int, text: str) -> str | None:
    """A valid case: None when the reply is a 200 whose answer has the endpoint's shape and counts that
    agree with the request (answers = prompts x n; finish_reason stop or length; generated tokens within
    max_tokens, equal to it on 'length'; logprobs per generated token when asked); else what is wrong."""
    if status != 200:
        return f"a valid request was not served: {status} {text[:300]}"
    count, limits = _expected(case)
    body = json.loads(case.body)
    if case.stream:
        events = [line[5:].strip() for line in text.splitlines() if line.startswith("data:")]
        if not events or events[-1] != "[DONE]":
            return f"stream did not end with [DONE]: {text[-300:]}"
        try:
            chunks = [json.loads(e) for e in events[:-1]]
        except ValueError:
            return f"stream event is not JSON: {text[:300]}"
        if any(not isinstance(c, dict) or "error" in c for c in chunks):
            return f"stream of a valid request carries an error or a non-object: {text[:300]}"
        if case.path == "/generate":
            ends = {}
            for c in chunks:
                fr = c.get("meta_info", {}).get("finish_reason")
                if fr:
                    ends[c.get("index", 0)] = fr.get("type")
        else:
            ends = {ch.get("index"): ch.get("finish_reason") for c in chunks for ch in c.get("choices", [])
                    if ch.get("finish_reason")}
            if (body.get("stream_options") or {}).get("include_usage"):
                problem = _usage_problem(chunks[-1].get("usage") if chunks else None, limits)
                if problem:
                    return f"stream usage: {problem}"
        if len(ends) != count or any(v not in FINISH for v in ends.values()):
            return f"stream ended {len(ends)} answers of {count} ({ends}): {text[-300:]}"
        return None
    try:
        answer = json.loads(text)
    except ValueError:
        return f"200 with a body that is not JSON: {text[:300]}"
    if case.path == "/generate":
        items = answer if isinstance(answer, list) else [answer]
        if len(items) != count:
            return f"{len(items)} answers for {count} prompts x samples: {text[:300]}"
        for item, limit in zip(items, limits):
            meta = item.get("meta_info", {}) if isinstance(item, dict) else {}
            fr, done = (meta.get("finish_reason") or {}).get("type"), meta.get("completion_tokens")
            if not isinstance(item.get("text"), str) or fr not in FINISH or not isinstance(done, int):
                return f"malformed answer: {str(item)[:300]}"
            if not (0 <= done <= limit) or (fr == "length" and done != limit) or meta.get("prompt_tokens", 0) < 1:
                return f"token counts inconsistent with max_new_tokens {limit}: {meta}"
            if body.get("return_logprob") and len(meta.get("output_token_logprobs") or []) != done:
                return f"{len(meta.get('output_token_logprobs') or [])} logprobs for {done} tokens: {meta}"
        return None
    choices = answer.get("choices") if isinstance(answer, dict) else None
    if not isinstance(choices, list) or sorted(c.get("index") for c in choices) != list(range(count)):
        return f"choices are not indices 0..{count - 1}: {text[:300]}"
    for c in choices:
        if c.get("finish_reason") not in FINISH:
            return f"finish_reason {c.get('finish_reason')!r}: {text[:300]}"
        if case.path == "/v1/completions" and not isinstance(c.get("text"), str):
            return f"choice without text: {c}"
        if case.path == "/v1/chat/completions":
            msg = c.get("message")
            if not isinstance(msg, dict) or msg.get("role") != "assistant" or not isinstance(msg.get("content"), (str, type(None))):
                return f"malformed message: {c}"
        if body.get("logprobs") and not c.get("logprobs"):
            return f"logprobs asked for and missing: {c}"
    return _usage_problem(answer.get("usage"), limits)


def check_reply(case: Case, status: int, text: str) -> str | None:
    """None when the reply is a 4xx with a clean message or a well-formed 200 (a valid case: only a
    served one, `check_served`); else what is wrong."""
    if any(t in text for t in SERVER_TRACES):
        return f"{status} reply exposes server internals: {text[:300]}"
    if case.valid:
        return check_served(case, status, text)
    if 400 <= status < 500:
        try:
            message = _message(json.loads(text))
        except ValueError:
            message = None
        return None if message else f"{status} without an error message: {text[:300]}"
    if status != 200:
        return f"status {status}: {text[:300]}"
    if case.stream and text.lstrip().startswith("data:"):
        events = [line[5:].strip() for line in text.splitlines() if line.startswith("data:")]
        if not events or events[-1] != "[DONE]":
            return f"stream did not end with [DONE]: {text[-300:]}"
        for event in events[:-1]:
            try:
                chunk = json.loads(event)
            except ValueError:
                return f"stream event is not JSON: {event[:200]}"
            if isinstance(chunk, dict) and "error" in chunk and not _message(chunk):
                return f"stream error event without a message: {event[:200]}"
        return None
    try:
        body = json.loads(text)
    except ValueError:
        return f"200 with a body that is not JSON: {text[:300]}"
    return None if _valid_answer(case.path, body) else f"200 with a malformed answer: {text[:300]}"


def send(url: str, case: Case, timeout: float = 120) -> tuple[int, str]:
    r = requests.post(url + case.path, data=case.body, headers=case.headers, timeout=timeout)
    return r.status_code, r.text


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--url", default="http://127.0.0.1:30000")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--count", type=int, default=100)
    ap.add_argument("--case-seed", type=int, help="run this one case and print it")
    ap.add_argument("--vocab", type=int, default=1024)
    ap.add_argument("--model", default="deepseek-v4.1-tiny")
    args = ap.parse_args()
    seeds = [args.case_seed] if args.case_seed is not None else [case_seed(args.seed, i) for i in range(args.count)]
    for s in seeds:
        case = make_case(s, args.model, args.vocab)
        try:
            status, text = send(args.url, case)
            problem = check_reply(case, status, text)
        except requests.RequestException as e:
            status, problem = -1, f"no reply: {e}"
        health = requests.get(args.url + "/health", timeout=30).status_code if problem is None else None
        print(f"{'FAIL' if problem else 'ok  '} {status} {case.describe(200)}" + (f"\n     {problem}" if problem else ""))
        if problem or health != 200:
            if health not in (None, 200):
                print(f"     /health -> {health}")
            break


if __name__ == "__main__":
    main()

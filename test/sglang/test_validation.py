"""Request validation rules without a server (python/sglang_dsv41/sglang/requests/validation.py) and the hook
adapters that apply them to SGLang's objects. Oracles: hand-built requests with the expected field in the
message, SGLang's own request classes (GenerateReqInput, CompletionRequest, ChatCompletionRequest), and
the tiny checkpoint's real tokenizer for the byte budget (checked against actual token counts)."""

from __future__ import annotations

import asyncio
import json
from types import SimpleNamespace

import pytest
import torch

from sglang_dsv41.sglang.requests import admission, body_limits, error_handlers
from sglang_dsv41.sglang.requests.validation import (
    MAX_N,
    Limits,
    admitted_error,
    chat_request_error,
    completion_request_error,
    detokenize_request_error,
    generate_body_error,
    ids_error,
    multimodal_error,
    logit_bias_error,
    routed_experts_error,
    text_bytes_error,
    tokenized_error,
    tokenizer_facts,
    validation_message,
    vertex_error,
    vertex_request_body,
)

V = 1024
LIMITS = Limits(vocab_size=V, context_len=4096, max_token_bytes=29, empty_text_has_tokens=False)


@pytest.mark.parametrize("ids, fragment", [
    ([5, V], f"x[1]: {V} is not a token id"),
    ([-1], "x[0]: -1"),
    ([5, True], "x[1]: True"),
    ([5, 2.0], "x[1]: 2.0"),
    ([], "the prompt is empty"),
    ("5 6", "expected a list of token ids"),
])
def test_ids_error_names_the_position(ids, fragment):
    assert fragment in ids_error(ids, V, "x")


def test_ids_at_the_edges_pass():
    assert ids_error([0, V - 1], V, "x") is None


@pytest.mark.parametrize("bias, fragment", [
    ({"abc": 1}, "key 'abc' is not a token id"),
    ({str(V): 1}, f"key '{V}' is not a token id"),
    ({"5": "x"}, "must be a number in [-100, 100]"),
    ({"5": 1e308}, "must be a number in [-100, 100]"),
    ([1], "expected an object"),
])
def test_logit_bias(bias, fragment):
    assert fragment in logit_bias_error(bias, V)
    assert logit_bias_error({"0": -100, str(V - 1): 5.5}, V) is None


@pytest.mark.parametrize("body, fragment", [
    ({"input_ids": [5, V]}, "input_ids[1]"),
    ({"input_ids": [[5], [5, -3]]}, "input_ids[1][1]"),
    ({"text": ""}, "text: the prompt is empty"),
    ({"text": ["a", ""]}, "text[1]: the prompt is empty"),
    ({"text": [], "stream": True}, "text: the batch is empty"),
    ({"text": "hi", "return_logprob": True, "logprob_start_len": [20]}, "logprob_start_len: a single request takes one"),
    ({"text": ["a", "b"], "logprob_start_len": [0]}, "logprob_start_len: the batch has 2 prompts but 1 values"),
    ({"text": ["a", "b"], "return_logprob": [True, "yes"]}, "return_logprob[1]: expected a boolean"),
    ({"text": "hi", "logprob_start_len": -2}, "logprob_start_len: must be an integer of at least -1"),
    ({"text": "hi", "sampling_params": [{"max_new_tokens": 1}]}, "sampling_params: a single request takes one object"),
    ({"text": ["a", "b"], "sampling_params": [{}]}, "the batch has 2 prompts but 1 parameter objects"),
    ({"input_ids": [[1], [2]], "token_ids_logprob": [[1]]}, "token_ids_logprob: one flat list"),
    ({"text": "hi", "sampling_params": {"max_new_tokens": 0}}, "sampling_params.max_new_tokens"),
    ({"text": "hi", "sampling_params": {"n": 0}}, "sampling_params.n"),
    ({"text": "hi", "sampling_params": {"n": MAX_N + 1}}, "sampling_params.n"),
    ({"text": ["a"], "sampling_params": [{"max_new_tokens": -1}]}, "sampling_params[0].max_new_tokens"),
    ({"text": "hi", "sampling_params": {"stop_token_ids": [V]}}, "sampling_params.stop_token_ids[0]"),
    ({"text": "hi", "sampling_params": {"logit_bias": {"-1": 2}}}, "sampling_params.logit_bias"),
    ({"text": "hi", "top_logprobs_num": V + 1}, "top_logprobs_num"),
    ({"text": "hi", "sampling_params": {"top_k": 2**63}}, "sampling_params.top_k: must be an integer of at least 1 and at most 2147483647"),
    ({"text": "hi", "image_data": "x"}, "image_data"),
    ({"input_embeds": [[0.0]]}, "input_embeds"),
    ({"text": "ab " * 50_000}, "text: the prompt is 150000 bytes"),
    ({"text": "hi", "sampling_params": {"stop_regex": "("}}, "sampling_params.stop_regex: not a valid regular expression"),
    ({"text": "hi", "sampling_params": {"stop_regex": ["x", "(a|aa)*b"]}},
     "sampling_params.stop_regex[1]: an alternation inside a repeat"),
    ({"text": "hi", "sampling_params": {"stop": ["x", ""]}}, "sampling_params.stop[1]: an empty stop string"),
    # both prompt forms: SGLang ran the ids and dropped the text; batches of different shapes were a 500
    ({"text": "What is 1+1?", "input_ids": [5]}, "text, input_ids: send the prompt once"),
    ({"text": ["a", "b"], "input_ids": [5, 6], "stream": True}, "text, input_ids: send the prompt once"),
])
def test_generate_body(body, fragment):
    assert fragment in generate_body_error(body, LIMITS)


def test_generate_body_accepts_the_edges():
    body = {"input_ids": [[0], [V - 1]], "sampling_params": {"max_new_tokens": 1, "n": MAX_N,
            "stop_token_ids": [V - 1]}, "top_logprobs_num": V}
    assert generate_body_error(body, LIMITS) is None
    assert generate_body_error({"text": ""}, Limits(V, 4096)) is None  # a tokenizer that adds BOS: "" is one token


def _completion(**kw):
    from sglang.srt.entrypoints.openai.protocol import CompletionRequest

    return CompletionRequest(**{"model": "m", "prompt": "hi", "max_tokens": 1, **kw})


def _chat(**kw):
    from sglang.srt.entrypoints.openai.protocol import ChatCompletionRequest

    return ChatCompletionRequest(**{"model": "m", "messages": [{"role": "user", "content": "hi"}], **kw})


@pytest.mark.parametrize("kw, fragment", [
    ({"prompt": [5, V]}, "prompt[1]"),
    ({"prompt": [[5], [V + 3]]}, "prompt[1][0]"),
    ({"prompt": ["a", ""]}, "prompt[1]: the prompt is empty"),
    ({"n": 0}, "n: must be an integer of at least 1"),
    ({"n": 1000}, f"at most {MAX_N}"),
    ({"logprobs": V + 1}, "logprobs"),
    ({"stop_token_ids": [-1]}, "stop_token_ids"),
    ({"top_k": 2**31}, "top_k"),
    ({"rid": ["a"]}, "rid: a single prompt takes one string"),
    ({"prompt": [5, 6], "rid": []}, "rid: a single prompt takes one string"),
    ({"stop_regex": "a*a*x"}, "stop_regex: at most one variable-length repeat"),
    # SGLang ignores best_of (n samples, no ranking) and, without a completion template, suffix
    ({"best_of": 3}, "best_of: this server does not rank candidates"),
    ({"best_of": 1, "n": 2}, "set it to n (2), got 1"),
    ({"suffix": "}"}, "suffix: this server has no fill-in-the-middle template"),
])
def test_completion_request(kw, fragment):
    assert fragment in completion_request_error(_completion(**kw), LIMITS)
    assert completion_request_error(_completion(best_of=1), LIMITS) is None  # what many clients send
    assert completion_request_error(_completion(best_of=2, n=2, suffix=""), LIMITS) is None
    assert completion_request_error(_completion(suffix="}"), LIMITS, fill_in_middle=True) is None
    assert completion_request_error(_completion(prompt=[0, V - 1], n=2, logprobs=V, top_k=-1), LIMITS) is None
    assert completion_request_error(_completion(top_k=10**6), LIMITS) is None  # past V: the whole vocabulary
    # rid lists SGLang serves: one id per prompt of a batch, or one id with parallel samples
    assert completion_request_error(_completion(prompt=["a", "b"], rid=["x", "y"]), LIMITS) is None
    assert completion_request_error(_completion(rid=["x"], n=2, stop_regex=r"\n\n+"), LIMITS) is None


@pytest.mark.parametrize("kw, fragment", [
    ({"max_tokens": 0}, "max_tokens"),
    ({"max_completion_tokens": 0}, "max_completion_tokens"),
    ({"n": 0}, "n:"),
    ({"logprobs": True, "top_logprobs": V + 1}, "top_logprobs"),
    ({"logit_bias": {str(V): 1.0}}, "logit_bias"),
    ({"messages": [{"role": "user", "content": [{"type": "text", "text": "a"},
                                                {"type": "image_url", "image_url": {"url": "x"}}]}]},
     "messages[0].content[1]: 'image_url' parts are not served"),
    ({"rid": []}, "rid: a single prompt takes one string"),
    ({"stop_regex": ["("]}, "stop_regex[0]: not a valid regular expression"),
    ({"stop": ""}, "stop: an empty stop string matches before any text"),
])
def test_chat_request(kw, fragment):
    assert fragment in chat_request_error(_chat(**kw), LIMITS)


def test_images_are_taken_when_the_vision_tower_is_served():
    import dataclasses

    images = dataclasses.replace(LIMITS, images=True)
    parts = [{"type": "text", "text": "a"}, {"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}}]
    assert chat_request_error(_chat(messages=[{"role": "user", "content": parts}]), images) is None
    video = [{"type": "video_url", "video_url": {"url": "x"}}]
    assert "'video_url' parts are not served" in chat_request_error(_chat(messages=[{"role": "user", "content": video}]), images)
    assert multimodal_error({"image_data": ["x"]}, images=True) is None
    assert "without a vision tower" in multimodal_error({"image_data": ["x"]})
    assert "takes text and images only" in multimodal_error({"audio_data": ["x"]}, images=True)
    assert chat_request_error(_chat(max_tokens=1, n=2), LIMITS) is None
    assert chat_request_error(_chat(rid="x", stop_regex="</?answer>"), LIMITS) is None


@pytest.mark.parametrize("pattern, fragment", [
    ("(", "not a valid regular expression"),
    ("[z-a]", "not a valid regular expression"),
    ("(a|aa)*b", "an alternation inside a repeat"),
    ("(a|aa){30}", "an alternation inside a repeat"),
    ("(a+){30}b", "a variable-length repeat inside a repeat"),
    ("(?:a+)+", "at most one variable-length repeat"),
    ("a*a*a*x", "at most one variable-length repeat"),
    ("\\d+\\.\\d+", "at most one variable-length repeat"),
    ("(a+)\\1", "backreferences"),
    ("", "matches the empty string"), ("a*", "matches the empty string"), ("x?|y", "matches the empty string"),
    ("foo", None), ("foo|bar", None), ("\\n\\n+", None), ("</?answer>", None), ("[0-9]+\\.", None),
    ("(ab)+", None), ("a{3}b", None), ("x{1,5}", None), ("^\\s*$", "matches the empty string"), ("(?=x)y", None),
])
def test_stop_regex_patterns(pattern, fragment):
    """Parse errors and patterns Python's backtracking matcher could spend super-linear time on are refused."""
    from sglang_dsv41.sglang.requests.stop_regex import pattern_error

    err = pattern_error(pattern, "stop_regex")
    assert (err is None) if fragment is None else (err.startswith("stop_regex: ") and fragment in err), err


def test_tokenized_request_from_sglang_objects():
    from sglang.srt.managers.io_struct import GenerateReqInput

    obj = GenerateReqInput(text="", sampling_params={"max_new_tokens": 1})
    assert "no tokens after tokenization" in tokenized_error(obj, [], V)
    obj = GenerateReqInput(input_ids=[1, V], top_logprobs_num=2)
    assert "input_ids[1]" in tokenized_error(obj, [1, V], V)
    obj = GenerateReqInput(input_ids=[1, 2], return_logprob=True, top_logprobs_num=V + 1)
    assert "top_logprobs_num" in tokenized_error(obj, [1, 2], V)
    obj = GenerateReqInput(input_ids=[1, 2], return_logprob=True, logprob_start_len=[1])
    assert "logprob_start_len" in tokenized_error(obj, [1, 2], V)
    assert tokenized_error(GenerateReqInput(input_ids=[0, V - 1]), [0, V - 1], V) is None


def test_scheduler_admission_check():
    """admission.check_admitted on a Req-like object: SGLang's own error wins, ours follows, clean passes."""
    req = SimpleNamespace(origin_input_ids=[3, V], vocab_size=V, top_logprobs_num=0)
    assert admission.check_admitted("too long", req) == "too long"
    assert "input_ids[1]" in admission.check_admitted(None, req)
    assert "the prompt is empty" in admission.check_admitted(None, SimpleNamespace(origin_input_ids=[], vocab_size=V))
    assert admission.check_admitted(None, SimpleNamespace(origin_input_ids=[3], vocab_size=V, top_logprobs_num=V)) is None
    from sglang.srt.sampling.sampling_params import SamplingParams

    for kw, fragment in [({"top_k": 2**40}, "top_k"), ({"logit_bias": {"3": 1e308}}, "logit_bias"),
                         ({"stop_token_ids": [V]}, "stop_token_ids")]:
        sp = SamplingParams(**kw)
        sp.normalize(None)
        req = SimpleNamespace(origin_input_ids=[3], vocab_size=V, top_logprobs_num=0, sampling_params=sp)
        assert fragment in admission.check_admitted(None, req)
    sp = SamplingParams()
    sp.normalize(None)
    sp.stop_regex_strs = ["x", "(a|aa)*b"]  # normalize needs a tokenizer for a stop regex; set its result
    req = SimpleNamespace(origin_input_ids=[3], vocab_size=V, top_logprobs_num=0, sampling_params=sp)
    assert "sampling_params.stop_regex[1]: an alternation inside a repeat" in admission.check_admitted(None, req)
    sp = SamplingParams(top_k=-1, stop_token_ids=[V - 1], logit_bias={"0": -100})
    sp.normalize(None)  # top_k -1 becomes SGLang's TOP_K_ALL
    assert admission.check_admitted(None, SimpleNamespace(origin_input_ids=[3], vocab_size=V, top_logprobs_num=0,
                                                      sampling_params=sp)) is None
    assert admitted_error([3], None, 0) is None  # a Req without a vocabulary size: nothing to check against


def test_model_forward_refuses_ids_outside_the_vocabulary():
    """The last line (DeepseekV41ForCausalLM._check_ids), on a stand-in for the model and batch."""
    from sglang_dsv41.sglang.model.deepseek_v41 import DeepseekV41ForCausalLM

    model = SimpleNamespace(cfg=SimpleNamespace(vocab_size=V))
    fb = SimpleNamespace(rids=["a", "b"])
    DeepseekV41ForCausalLM._check_ids(model, torch.tensor([0, V - 1]), fb)
    with pytest.raises(ValueError, match=r"token ids \[1024\] outside \[0, 1024\).*\['a', 'b'\]"):
        DeepseekV41ForCausalLM._check_ids(model, torch.tensor([3, V]), fb)


def test_byte_budget_is_a_lower_bound_on_tokens(tiny_dir):
    """The tiny tokenizer's byte bound never over-counts: for odd texts, bytes / bound <= tokens."""
    from transformers import AutoTokenizer

    tiny_tokenizer = AutoTokenizer.from_pretrained(str(tiny_dir))
    bound, empty_has_tokens = tokenizer_facts(tiny_tokenizer)
    assert bound is not None and not empty_has_tokens
    for text in ["a" * 500, "<｜begin▁of▁sentence｜>" * 20, "日本語😀" * 40, " " * 300, "x\u0000" * 50]:
        tokens = len(tiny_tokenizer(text)["input_ids"])
        assert -(-len(text.encode()) // bound) <= tokens, text[:20]
    limits = Limits(V, context_len=100, max_token_bytes=bound)
    # SGLang refuses a prompt of context_len tokens or more: 100 * bound bytes is at least 100 tokens.
    assert "at least 100 tokens" in text_bytes_error("a" * (100 * bound - 1), limits, "t")
    assert text_bytes_error("a" * (99 * bound), limits, "t") is None
    assert text_bytes_error("a" * 10**6, Limits(V, 100, max_token_bytes=bound, allow_auto_truncate=True), "t") is None


def test_validation_message_hides_input_and_location():
    errors = [{"type": "json_invalid", "loc": ("body", 10), "msg": "JSON decode error", "input": {},
               "ctx": {"error": "unexpected end of data"}},
              {"type": "int_parsing", "loc": ("body", "max_tokens"), "msg": "Input should be a valid integer",
               "input": "x" * 10_000}]
    assert validation_message(errors) == ("body: invalid JSON at character 10 (unexpected end of data); "
                                          "max_tokens: Input should be a valid integer")


def test_raised_reading_body():
    def request_body_to_args():  # the name FastAPI's body validation runs under
        raise AttributeError("'list' object has no attribute 'get'")

    try:
        request_body_to_args()
    except AttributeError as e:
        assert not error_handlers.raised_reading_body(e)  # same name, but not FastAPI's file
    try:
        raise KeyError("x")
    except KeyError as e:
        assert not error_handlers.raised_reading_body(e)


def test_vertex_request_body_and_error_names():
    """`/vertex_generate` builds a /generate request of its instances' inputs and its parameters; its
    refusals are named by where the field sits in the vertex body."""
    ok = {"instances": [{"text": "hi"}, {"text": "yo"}], "parameters": {"sampling_params": {"max_new_tokens": 3}}}
    assert vertex_request_body(ok) == {"text": ["hi", "yo"], "sampling_params": {"max_new_tokens": 3}}
    assert generate_body_error(vertex_request_body(ok), LIMITS) is None
    bad = vertex_request_body({"instances": [{"text": "hi"}], "parameters": {"sampling_params": {"max_new_tokens": 0}}})
    assert vertex_error(generate_body_error(bad, LIMITS)).startswith("parameters.sampling_params.max_new_tokens")
    ids = vertex_request_body({"instances": [{"input_ids": [1, 2]}, {"input_ids": [V]}], "parameters": None})
    assert ids == {"input_ids": [[1, 2], [V]]}
    assert vertex_error(generate_body_error(ids, LIMITS)).startswith("instances[*].input_ids[1]")
    assert vertex_error('invalid type: string "hot", expected f64').startswith("parameters / instances")
    for odd in ({"instances": "x"}, {"instances": []}, {"instances": [1]}, {"instances": [{"text": "a"}], "parameters": 3}):
        assert vertex_request_body(odd) is None  # left to SGLang's own checks


def test_raised_building_vertex_request():
    def vertex_generate():  # the route's name, but not SGLang's file: never taken for a request-building error
        raise TypeError("GenerateReqInput.__init__() got an unexpected keyword argument 'bogus'")

    try:
        vertex_generate()
    except TypeError as e:
        assert not error_handlers.raised_building_vertex_request(e)
    try:
        raise TypeError("x")
    except TypeError as e:
        assert not error_handlers.raised_building_vertex_request(e)  # not raised inside the route at all


def test_large_texts_tokenize_off_the_event_loop():
    """admission.tokenize_texts runs SGLang's coroutine in a worker thread for large inputs only."""
    import threading

    seen = []

    async def original(tm, texts, *args, **kwargs):
        seen.append(threading.current_thread() is threading.main_thread())
        return texts

    tm = SimpleNamespace(tokenizer=None, model_config=SimpleNamespace(vocab_size=V), context_len=10**9,
                         async_dynamic_batch_tokenizer=None)
    assert asyncio.run(admission.tokenize_texts(original, tm, "small")) == "small"
    big = ["x" * admission.OFF_LOOP_TOKENIZE_CHARS]
    assert asyncio.run(admission.tokenize_texts(original, tm, big)) == big
    assert seen == [True, False]


def test_large_tokenize_requests_run_off_the_event_loop():
    """other_endpoints.tokenize_context runs SGLang's `/v1/tokenize` handler in a worker thread for a large
    prompt or conversation (SGLang encoded on the event loop: a 4 MB prompt held every client for 8 s)."""
    import threading

    from sglang.srt.entrypoints.openai.protocol import TokenizeRequest

    from sglang_dsv41.sglang.requests import other_endpoints

    seen = []

    async def original(serving, adapted_request, *args, **kwargs):
        seen.append(threading.current_thread() is threading.main_thread())
        return SimpleNamespace(max_model_len=1)

    serving = SimpleNamespace(tokenizer_manager=SimpleNamespace(model_config=SimpleNamespace(context_len=4096)))
    big = "x" * admission.OFF_LOOP_TOKENIZE_CHARS
    requests = [TokenizeRequest(prompt="small"), TokenizeRequest(prompt=["a", big]),
                TokenizeRequest(messages=[{"role": "user", "content": [{"type": "text", "text": big}]}])]
    for request in requests:
        result = asyncio.run(other_endpoints.tokenize_context(original, serving, request, request, None))
        assert result.max_model_len == 4096
    assert seen == [True, False, False]


def test_routed_experts_need_the_server_flag():
    assert "started without --enable-return-routed-experts" in routed_experts_error(True, served=False)
    assert routed_experts_error(True, served=True) is None and routed_experts_error(False, served=False) is None


def test_detokenize_ids():
    assert "tokens[1]" in detokenize_request_error([5, 99999], V)
    assert "tokens[1][0]" in detokenize_request_error([[5], [-1]], V)
    assert detokenize_request_error([], V) is None and detokenize_request_error([[0, V - 1]], V) is None


@pytest.mark.parametrize("value, fragment", [
    (5, "stop_regex: expected a string, got int"), ([1], "stop_regex[0]: expected a string, got int"),
    ([None], "stop_regex[0]: expected a string, got NoneType"), ({"a": 1}, "stop_regex: expected a string, got dict"),
    ("a" * 5000, "stop_regex: at most 4096 characters"), (["x"] * 65, "stop_regex: at most 64 patterns"),
    ("(" * 5000 + "a" + ")" * 5000, "stop_regex: at most 4096 characters"), ([], None), (["\\n\\n+"] * 64, None),
])
def test_stop_regex_types_and_sizes(value, fragment):
    from sglang_dsv41.sglang.requests.validation import stop_regex_error

    err = stop_regex_error(value)
    assert (err is None) if fragment is None else (err is not None and err.startswith(fragment)), err


@pytest.mark.parametrize("value, fragment", [
    (5, "stop: expected a string, got int"), (["ok", 3.5], "stop[1]: expected a string, got float"),
    (["x"] * 65, "stop: at most 64 stop strings"), ("y" * 4097, "stop: at most 4096 characters"),
    (["a", ""], "stop[1]: an empty stop string"), (["</answer>", "\n\n"], None),
])
def test_stop_strings_types_and_sizes(value, fragment):
    from sglang_dsv41.sglang.requests.validation import stop_strings_error

    err = stop_strings_error(value)
    assert (err is None) if fragment is None else (err is not None and err.startswith(fragment)), err


# ---------------------------------------------------------------------------- other endpoints (other_endpoints.py)
def test_embedding_overrides_are_refused_at_every_point():
    """Embedding overrides made SGLang's forward call the model's missing get_input_embeddings(): the scheduler
    died. Refused at the `/generate` entry, after tokenizing, and at the scheduler's admission check."""
    from sglang.srt.managers.io_struct import GenerateReqInput

    body = {"text": "hi", "positional_embed_overrides": {"positions": [0], "embeds": [[1.0]]}}
    assert "positional_embed_overrides: input-embedding overrides" in generate_body_error(body, LIMITS)
    assert "embed_overrides: input-embedding overrides" in generate_body_error(
        {"input_ids": [5, 6], "embed_overrides": [[[1.0]]], "embed_override_token_id": 5}, LIMITS)
    obj = GenerateReqInput(input_ids=[5, 6], positional_embed_overrides={"positions": [0], "embeds": [[1.0]]})
    assert "positional_embed_overrides: input-embedding overrides" in tokenized_error(obj, [5, 6], V)
    req = SimpleNamespace(origin_input_ids=[3], vocab_size=V, top_logprobs_num=0, positional_embed_overrides=object())
    assert "positional_embed_overrides" in admission.check_admitted(None, req)


def test_score_request():
    from sglang.srt.entrypoints.openai.protocol import ScoringRequest

    from sglang_dsv41.sglang.requests.other_endpoints import score_request_error

    ok = dict(query="Is it", items=["yes", "no"], label_token_ids=[5, 6])
    assert score_request_error(ScoringRequest(**ok)) is None
    assert score_request_error(ScoringRequest(**{**ok, "query": [5], "items": [[6], [7]]})) is None
    assert "items: token-id items need a token-id query" in score_request_error(
        ScoringRequest(**{**ok, "items": [[99]]}))
    assert "query_embed_overrides: input-embedding overrides" in score_request_error(ScoringRequest(
        **{**ok, "query": [5, 6], "query_embed_overrides": [[1.0]], "embed_override_token_id": 5}))


@pytest.mark.parametrize("fields, fragment", [
    ({"options": {"num_predict": -1}}, "options.num_predict: must be an integer of at least 1"),
    ({"options": {"num_predict": 0}}, "options.num_predict"),
    ({"options": {"num_predict": "x"}}, "options.num_predict"),
    ({"options": {"temperature": "x"}}, "options.temperature: expected a number"),
    ({"options": {"top_p": True}}, "options.top_p: expected a number"),
    ({"options": {"top_k": 2**40}}, "options.top_k"),
    ({"options": {"seed": 1.5}}, "options.seed: expected an integer"),
    ({"options": {"stop": 5}}, "options.stop: expected a string or a list"),
    ({"options": {"stop": ["a", ""]}}, "options.stop[1]: an empty stop string"),
    ({"format": "json"}, "format: output formats are not implemented"),
    ({"context": [1, 2]}, "context:"),
    ({"suffix": "x"}, "suffix: fill-in-the-middle"),
    ({"template": "{{ .Prompt }}"}, "template:"),
    ({"images": ["AAAA"]}, "images: the Ollama API's images are not served"),
])
def test_ollama_generate_request(fields, fragment):
    from sglang.srt.entrypoints.ollama.protocol import OllamaGenerateRequest

    from sglang_dsv41.sglang.requests.other_endpoints import ollama_request_error

    base = {"model": "m", "prompt": "hi", "options": {"num_predict": 2}}
    assert ollama_request_error(OllamaGenerateRequest(**base)) is None
    assert fragment in ollama_request_error(OllamaGenerateRequest(**{**base, **fields}))


def test_ollama_chat_request():
    from sglang.srt.entrypoints.ollama.protocol import OllamaChatRequest

    from sglang_dsv41.sglang.requests.other_endpoints import ollama_request_error

    ok = OllamaChatRequest(model="m", messages=[{"role": "user", "content": "hi"}],
                           options={"num_predict": 3, "temperature": 0, "top_k": -1, "stop": "x", "seed": 1})
    assert ollama_request_error(ok) is None
    bad = OllamaChatRequest(model="m", messages=[{"role": "user", "content": "hi"},
                                                 {"role": "user", "content": "x", "images": ["AAAA"]}])
    assert "messages[1].images" in ollama_request_error(bad)


def test_ollama_stream_errors_surface_before_the_header():
    """other_endpoints._start_stream: a ValueError raised while the stream submits its request reaches the hook
    (which answers 400); a good stream keeps every chunk, in order."""
    from fastapi.responses import StreamingResponse

    from sglang_dsv41.sglang.requests.other_endpoints import _start_stream

    async def failing():
        raise ValueError("top_p must be in (0, 1]")
        yield b""  # an async generator

    async def good():
        for chunk in (b"a", b"b", b"c"):
            yield chunk

    async def run():
        with pytest.raises(ValueError, match="top_p"):
            await _start_stream(StreamingResponse(failing()))
        response = StreamingResponse(good())
        await _start_stream(response)
        return [chunk async for chunk in response.body_iterator]

    assert asyncio.run(run()) == [b"a", b"b", b"c"]


def _chat_errors(content, role="user"):
    from pydantic import ValidationError
    from sglang.srt.entrypoints.openai.protocol import ChatCompletionRequest

    try:
        ChatCompletionRequest(model="m", messages=[{"role": role, "content": content}])
    except ValidationError as e:
        return [{**err, "loc": ("body", *err["loc"])} for err in e.errors()]  # as FastAPI reports them
    raise AssertionError("accepted")


@pytest.mark.parametrize("content, role, expected", [
    ([{"type": "bogus"}], "user", "messages[0].content[0].type: expected 'text', 'thinking' or 'reasoning', "
                                  "'image_url'"),
    ([{"type": "text"}], "user", "messages[0].content[0].text: Field required"),
    ([{"type": "text", "text": "a"}, {"type": "image_url"}], "assistant", "messages[0].content[1].image_url: Field"),
    ([5], "user", "messages[0].content[0]: Input should be an object"),
    ("hi", "bogus", "messages[0].role: 'role' must be one of"),
])
def test_validation_message_names_the_content_part(content, role, expected):
    """SGLang's chat message is a union (generic or user message) of unions (six content-part kinds): the message
    names the part the client sent, not a branch it never meant (it said "'role' must be one of" for a bad part)."""
    message = validation_message(_chat_errors(content, role))
    assert message.startswith(expected), message
    if role != "bogus":
        assert "role" not in message, message
    assert "function-after" not in message and "ChatCompletion" not in message, message


def test_validation_message_of_thousands_of_bad_parts():
    """4096 bad content parts raise about 100,000 pydantic errors; the message reads only the first positions
    and still names the parts in order."""
    message = validation_message(_chat_errors([{"type": "bogus"}] * 4096))
    fields = [part.split(":")[0] for part in message.split("; ")]
    assert fields == [f"messages[0].content[{i}].type" for i in range(5)], message


@pytest.mark.parametrize("body, n", [
    ({"messages": [{"role": "user", "content": [1, 2, 3]}], "stop": ["a"]}, 5),
    ({"prompt": [[1, 2], [3]], "input_ids": [7] * 100, "text": ["a", "b"], "input_embeds": [[0.5] * 8]}, 0),
    ({"prompt": [{}, {}]}, 2),          # not a token batch: counted
    ({"prompt": [["a"]]}, 2),
    ({"tools": [{"function": {"parameters": {"enum": [1, 2]}}}]}, 3),
    ([1, 2], 2),
    ("text", 0),
])
def test_array_elements(body, n):
    assert body_limits.array_elements(body) == n


def test_shape_error_bounds_arrays_outside_token_batches():
    ids = json.dumps({"model": "m", "prompt": [5] * 40_000}).encode()
    assert body_limits.shape_error(ids) is None
    content = json.dumps({"model": "m", "messages": [{"role": "user", "content": [5] * 40_000}]}).encode()
    assert "more than 8192 array elements" in body_limits.shape_error(content)
    at_bound = {"model": "m", "messages": [{"role": "user", "content": [5] * 8191}]}
    assert body_limits.shape_error(json.dumps(at_bound).encode()) is None
    assert body_limits.shape_error(b'{"model": ') is None  # not JSON: FastAPI's validation answers it


def test_contract_errors_name_the_field():
    """SGLang's `/generate` contract says "invalid type: floating point ..., expected i64" without the field; a
    JSON integer past 64 bits arrives as a float."""
    from sglang.srt.entrypoints.api_contract import generate_contract_error as contract

    from sglang_dsv41.sglang.requests.validation import contract_error_field, named_contract_error

    body = {"text": "hi", "sampling_params": {"max_new_tokens": 1, "sampling_seed": float(2**64)}}
    assert contract(body).endswith("expected i64")
    assert named_contract_error(contract(body), body, contract) == (
        "sampling_params.sampling_seed: must be an integer in [-2**63, 2**63 - 1], got 1.8446744073709552e+19")
    batch = {"text": ["a", "b"], "sampling_params": [{"top_k": 1}, {"stop_token_ids": [1, "x"]}]}
    assert contract_error_field(batch, contract) == "sampling_params[1].stop_token_ids"
    assert named_contract_error(contract(batch), batch, contract).startswith("sampling_params[1].stop_token_ids: ")
    assert named_contract_error(contract({"rid": 5}), {"rid": 5}, contract).startswith("rid: invalid type")
    assert contract_error_field({"text": "hi"}, contract) is None


def test_prompt_length_error():
    from sglang_dsv41.sglang.requests.validation import prompt_length_error

    limits = Limits(V, context_len=128, max_input_tokens=122)
    assert prompt_length_error(121, limits, "text") is None
    assert prompt_length_error(122, limits, "input_ids") == (
        "input_ids: the prompt has 122 tokens; this server accepts prompts of at most 121 tokens (context length 128)")
    assert prompt_length_error(10**6, Limits(V, 128, allow_auto_truncate=True, max_input_tokens=122), "t") is None
    assert prompt_length_error(10**6, Limits(V, 128), "t") is None  # limit unknown: SGLang's own checks answer

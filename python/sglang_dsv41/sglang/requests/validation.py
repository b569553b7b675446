"""Request validation: every rule a request must pass before anything reaches the scheduler.

SGLang's scheduler cannot isolate a failure inside a forward (an exception in `run_batch` ends the
scheduler process, and the launcher then takes the whole server down), so a request the model cannot
serve must be refused before it is batched. These are plain functions over request values (no SGLang
import); admission.py calls them at four points, and each refusal becomes a 4xx whose message names the field:

  entry      `/generate` JSON body, OpenAI completions / chat request objects: rules that depend on the
             endpoint (`max_tokens` >= 1, `n`, field names as the client wrote them)
  tokenizer  before tokenizing a text prompt (byte budget) and after tokenizing any prompt (every
             generate request from every entry point: ids in range, non-empty, top logprobs)
  scheduler  SGLang's per-request admission check (a request that bypassed the tokenizer manager is
             aborted alone instead of reaching a batch)
  model      `DeepseekV41ForCausalLM.forward` checks its ids (the last line; unreachable when the rest hold)

docs/sglang.md ("Request validation") lists the rules.
"""

from __future__ import annotations

import functools
import heapq
import json
from dataclasses import dataclass
from typing import Any, Iterable

from sglang_dsv41.sglang.requests.stop_regex import pattern_error

MAX_N = 128
"""Most samples one request may ask for (`n`), on every endpoint (OpenAI's own cap)."""

OFF_LOOP_TOKENIZE_CHARS = 64 * 1024
"""Text prompts at least this large (characters, whole request) are tokenized in a worker thread, so the
HTTP event loop keeps serving other clients (tokenizing takes about 1 s per MB on a 2-core machine)."""

MULTIMODAL_FIELDS = ("image_data", "video_data", "audio_data")
EMBED_OVERRIDE_FIELDS = ("positional_embed_overrides", "embed_overrides", "query_embed_overrides",
                         "item_embed_overrides")
"""Request fields that replace input embeddings at token positions. SGLang's forward then asks the model for
`get_input_embeddings()`, which DeepSeek-V4.1 here does not have (its embedding is inside the core model), and
the scheduler died with every request in flight."""


class RequestError(ValueError):
    """A request the model cannot serve (SGLang's handlers turn a ValueError into a 400)."""


@dataclass(frozen=True)
class Limits:
    """What the served model and server accept (built from the tokenizer manager by admission.py)."""

    vocab_size: int
    context_len: int
    reserved_tokens: int = 0
    max_token_bytes: int | None = None
    """Upper bound on the UTF-8 bytes one token covers; None when the tokenizer gives no such bound."""
    empty_text_has_tokens: bool = True
    """False when the tokenizer adds no special tokens, so an empty text prompt has zero tokens."""
    allow_auto_truncate: bool = False
    max_input_tokens: int | None = None
    """SGLang's scheduler refuses a prompt of this many tokens or more (its `max_req_input_len`: min(context,
    KV pool) - 6); None when unknown."""
    images: bool = False
    """The server takes images (it loaded the vision tower and SGLang's image processor for it)."""


# ---------------------------------------------------------------------------- tokenizer facts
@functools.cache
def tokenizer_facts(tokenizer) -> tuple[int | None, bool]:
    """-> (max UTF-8 bytes of one token or None, whether "" tokenizes to at least one token).

    The byte bound holds for a byte-level BPE without a normalizer: every input byte lands in exactly
    one token, and a token's vocabulary string has at least as many UTF-8 bytes as the input bytes it
    covers (one byte-alphabet character per byte; added tokens are matched verbatim and strip nothing).
    So a text of B bytes has at least ceil(B / bound) tokens. Any other tokenizer gets no bound (no gate)."""
    empty_has_tokens = bool(tokenizer("")["input_ids"])
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is None:
        return None, empty_has_tokens
    spec = json.loads(backend.to_str())
    normalizer = spec.get("normalizer")
    no_op_normalizer = normalizer is None or (normalizer.get("type") == "Sequence" and not normalizer.get("normalizers"))
    byte_level = "ByteLevel" in json.dumps(spec.get("pre_tokenizer"))
    # An added token that strips whitespace around it covers more bytes than its own text.
    stripping = any(t.get("lstrip") or t.get("rstrip") for t in spec.get("added_tokens") or ())
    if stripping or not (no_op_normalizer and byte_level and (spec.get("model") or {}).get("type") == "BPE"):
        return None, empty_has_tokens
    return max(len(tok.encode("utf-8", "surrogatepass")) for tok in tokenizer.get_vocab()), empty_has_tokens


# ---------------------------------------------------------------------------- single values
def _is_int(x: Any) -> bool:
    return isinstance(x, int) and not isinstance(x, bool)


def ids_error(ids: Any, vocab_size: int, field: str) -> str | None:
    """A flat, non-empty list of token ids in [0, vocab_size)."""
    if not isinstance(ids, (list, tuple)):
        return f"{field}: expected a list of token ids, got {type(ids).__name__}"
    if not ids:
        return f"{field}: the prompt is empty; send at least one token id"
    if all(type(t) is int for t in ids) and 0 <= min(ids) and max(ids) < vocab_size:
        return None
    for i, t in enumerate(ids):
        if not _is_int(t) or not 0 <= t < vocab_size:
            return (f"{field}[{i}]: {t!r} is not a token id of this model "
                    f"(token ids are integers in [0, {vocab_size}))")
    return None


def token_list_error(ids: Any, vocab_size: int, field: str) -> str | None:
    """An optional list of token ids (stop tokens): may be empty, each id in range."""
    if ids is None or (isinstance(ids, (list, tuple)) and not ids):
        return None
    return ids_error(ids, vocab_size, field)


def logit_bias_error(bias: Any, vocab_size: int, field: str = "logit_bias") -> str | None:
    if bias is None:
        return None
    if not isinstance(bias, dict):
        return f"{field}: expected an object mapping token ids to biases, got {type(bias).__name__}"
    for key, value in bias.items():
        try:
            token = int(key)
        except (TypeError, ValueError):
            return f"{field}: key {key!r} is not a token id (token ids are integers in [0, {vocab_size}))"
        if not 0 <= token < vocab_size:
            return f"{field}: key {key!r} is not a token id of this model (token ids are integers in [0, {vocab_size}))"
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not -100 <= value <= 100:
            # OpenAI's range; the sampler adds the bias in fp32, where 1e308 is inf and made NaN probabilities.
            return f"{field}[{key!r}]: the bias must be a number in [-100, 100], got {value!r}"
    return None


def count_error(value: Any, field: str, low: int, high: int | None = None, what: str = "") -> str | None:
    """An integer in [low, high] (high None: no upper bound); None means unset."""
    if value is None:
        return None
    upper = f" and at most {high}" if high is not None else ""
    if not _is_int(value) or value < low or (high is not None and value > high):
        return f"{field}: must be an integer of at least {low}{upper}{what}, got {value!r}"
    return None


def n_error(n: Any, field: str = "n") -> str | None:
    return count_error(n, field, 1, MAX_N, f" (samples per request; this server's cap is {MAX_N})")


def top_logprobs_error(k: Any, vocab_size: int, field: str) -> str | None:
    return count_error(k, field, 0, vocab_size, f" (the vocabulary has {vocab_size} tokens)")


def text_bytes_error(text: str, limits: Limits, field: str) -> str | None:
    """A text prompt whose byte size alone proves it cannot fit the context (no tokenizing needed).
    Never refuses a prompt SGLang's own token-count check would accept."""
    if limits.max_token_bytes is None or limits.allow_auto_truncate:
        return None
    if 4 * len(text) <= (limits.context_len - limits.reserved_tokens - 1) * limits.max_token_bytes:
        return None  # at most 4 UTF-8 bytes a character: too short to prove anything, skip the encode
    n_bytes = len(text.encode("utf-8", "surrogatepass"))
    at_least = -(-n_bytes // limits.max_token_bytes)
    if at_least + limits.reserved_tokens >= limits.context_len:
        return (f"{field}: the prompt is {n_bytes} bytes, so at least {at_least} tokens (one token covers at "
                f"most {limits.max_token_bytes} bytes); this server's context is {limits.context_len} tokens")
    return None


def empty_text_error(text: Any, limits: Limits, field: str) -> str | None:
    if text == "" and not limits.empty_text_has_tokens:
        return f"{field}: the prompt is empty (this model's tokenizer adds no BOS token, so it has no tokens to run)"
    return None


def _first(*errors: str | None) -> str | None:
    return next((e for e in errors if e), None)


def _indexed(values: Any, field: str) -> Iterable[tuple[Any, str]]:
    """(value, field name) for a single value or each element of a batch list."""
    if isinstance(values, list):
        return ((v, f"{field}[{i}]") for i, v in enumerate(values))
    return ((values, field),)


INT32_MAX = 2**31 - 1


def top_k_error(top_k: Any, field: str) -> str | None:
    """-1 (the whole vocabulary) or at least 1 (SGLang); the sampler holds top_k as int32, and a larger
    value killed the scheduler. Any value from the vocabulary size up keeps the whole vocabulary."""
    if top_k is None or (_is_int(top_k) and top_k == -1):
        return None
    return count_error(top_k, field, 1, INT32_MAX, " (or -1 for the whole vocabulary)")


def sampling_error(params: Any, vocab_size: int, field: str = "sampling_params") -> str | None:
    """Model-dependent sampling rules shared by every endpoint (SGLang checks the rest)."""
    if not isinstance(params, dict):
        return None
    return _first(
        top_k_error(params.get("top_k"), f"{field}.top_k"),
        token_list_error(params.get("stop_token_ids"), vocab_size, f"{field}.stop_token_ids"),
        logit_bias_error(params.get("logit_bias"), vocab_size, f"{field}.logit_bias"),
        stop_regex_error(params.get("stop_regex"), f"{field}.stop_regex"),
        stop_strings_error(params.get("stop"), f"{field}.stop"),
    )


DSPARK_UNSUPPORTED = (
    ("frequency_penalty", 0.0), ("presence_penalty", 0.0), ("repetition_penalty", 1.0), ("min_new_tokens", 0),
    ("logit_bias", None), ("json_schema", None), ("regex", None), ("ebnf", None), ("structural_tag", None),
    ("custom_params", None),
)
"""Sampling parameters (with their no-op value) the DSPARK draft and verify do not apply."""


def dspark_sampling_error(params: Any, custom_logit_processor: Any = None, field: str = "sampling_params") -> str | None:
    """Under --speculative-algorithm DSPARK: a request asking for what the speculative step does not
    apply (penalties, min_new_tokens, logit bias, grammars, custom logit processors) is refused rather
    than answered as if it were not there."""
    why = "is not supported with --speculative-algorithm DSPARK (the draft and verify steps do not apply it)"
    if custom_logit_processor:
        return f"custom_logit_processor {why}"
    if not isinstance(params, dict):
        return None
    for name, neutral in DSPARK_UNSUPPORTED:
        value = params.get(name)
        if value is not None and value != neutral and value != {} and value != []:
            return f"{field}.{name} {why}; leave it unset"
    return None


MAX_STOPS = 64
"""Most `stop` strings or `stop_regex` patterns one request may give (SGLang searches each on every step)."""
MAX_STOP_CHARS = 4096
"""Longest `stop` string or `stop_regex` pattern (a 2 MB pattern took 8 s to parse on the event loop)."""


def _stop_list_error(values: Any, field: str, what: str) -> str | None:
    """One string or a list of at most MAX_STOPS strings, each at most MAX_STOP_CHARS long."""
    if isinstance(values, list) and len(values) > MAX_STOPS:
        return f"{field}: at most {MAX_STOPS} {what}s (got {len(values)})"
    for value, name in _indexed(values, field):
        if not isinstance(value, str):
            return f"{name}: expected a string, got {type(value).__name__}"
        if len(value) > MAX_STOP_CHARS:
            return f"{name}: at most {MAX_STOP_CHARS} characters (got {len(value)})"
    return None


def stop_strings_error(stop: Any, field: str = "stop") -> str | None:
    """`stop` (one string or a list): an empty string matches before any text (SGLang tests `"" in tail`),
    so the answer would always be empty."""
    if stop is None:
        return None
    err = _stop_list_error(stop, field, "stop string")
    if err:
        return err
    for value, name in _indexed(stop, field):
        if value == "":
            return f"{name}: an empty stop string matches before any text, so every answer would be empty"
    return None


def stop_regex_error(patterns: Any, field: str = "stop_regex") -> str | None:
    """`stop_regex` (one pattern or a list): each must parse and be safe for SGLang's matcher (stop_regex.py)."""
    if patterns is None:
        return None
    err = _stop_list_error(patterns, field, "pattern")
    for pattern, name in () if err else _indexed(patterns, field):
        err = pattern_error(pattern, name)
        if err:
            break
    return err


def multimodal_error(values: dict, images: bool = False) -> str | None:
    """`images`: the server serves the vision tower (a checkpoint with one, without --language-model-only)."""
    for name in MULTIMODAL_FIELDS:
        if values.get(name) in (None, [], [None]):
            continue
        if name != "image_data":
            return f"{name}: DeepSeek-V4.1 takes text and images only"
        if not images:
            return (f"{name}: this server serves DeepSeek-V4.1 without a vision tower (the checkpoint has none, "
                    "or --language-model-only is set); send text or token ids")
    if values.get("input_embeds") is not None:
        return "input_embeds: not supported by DeepSeek-V4.1 here; send text or token ids"
    for name in EMBED_OVERRIDE_FIELDS:
        if values.get(name) is not None:
            return f"{name}: input-embedding overrides are not supported by DeepSeek-V4.1 here; send text or token ids"
    return None


# ---------------------------------------------------------------------------- entry: /generate
PER_REQUEST_FIELDS = {
    "return_logprob": bool, "logprob_start_len": int, "top_logprobs_num": int, "return_text_in_logprobs": bool,
    "return_hidden_states": bool, "return_routed_experts": bool, "routed_experts_start_len": int,
    "return_sampling_mask": bool, "rid": str,
}
"""`/generate` fields that take one value per request: a scalar, or in a batch a list with one per prompt
(SGLang's scheduler compares a single request's list-valued `logprob_start_len` with an int and dies)."""


def _value_error(value: Any, kind: type, field: str) -> str | None:
    ok = isinstance(value, kind) and not (kind is int and isinstance(value, bool))
    if value is None or ok:
        return None
    return f"{field}: expected {'an integer' if kind is int else 'a boolean' if kind is bool else 'a string'}, got {value!r}"[:200]


def per_request_error(body: dict, batch: int | None) -> str | None:
    """Per-request fields (and `sampling_params`) against the batch size (None: a single request)."""
    for name, kind in PER_REQUEST_FIELDS.items():
        value = body.get(name)
        if isinstance(value, list):
            if batch is None:
                return f"{name}: a single request takes one value, not a list"
            if len(value) != batch:
                return f"{name}: the batch has {batch} prompts but {len(value)} values"
            err = _first(*(_value_error(v, kind, f"{name}[{i}]") for i, v in enumerate(value)))
        else:
            err = _value_error(value, kind, name)
        if err:
            return err
    lsl = body.get("logprob_start_len")
    for value, field in _indexed(lsl, "logprob_start_len"):
        err = count_error(value, field, -1, what=" (-1: no input logprobs)")
        if err:
            return err
    params = body.get("sampling_params")
    if isinstance(params, list):
        if batch is None:
            return "sampling_params: a single request takes one object, not a list"
        if len(params) != batch:
            return f"sampling_params: the batch has {batch} prompts but {len(params)} parameter objects"
    tids = body.get("token_ids_logprob")
    if isinstance(tids, list) and tids and isinstance(tids[0], list):
        if batch is None or len(tids) != batch:
            return "token_ids_logprob: one flat list of token ids, or one list per prompt of the batch"
    return None


def _batch_size(body: dict) -> int | None:
    text, ids = body.get("text"), body.get("input_ids")
    if isinstance(text, list):
        return len(text)
    if text is None and isinstance(ids, list) and ids and isinstance(ids[0], list):
        return len(ids)
    return None


def vertex_request_body(body: dict) -> dict | None:
    """`/vertex_generate`'s body {"instances": [{"text" | "input_ids": ...}, ...], "parameters": {...}} -> the
    `/generate` body SGLang builds from it (the first instance's input kind from every instance, plus the
    parameters), or None when the body is not of that shape (SGLang's own checks answer those). SGLang checks
    the `/generate` contract on the vertex body itself, so neither its contract nor our rules saw these fields
    (`max_new_tokens: 0` answered an empty 200, `sampling_params: "x"` was a 500); admission.py checks this body."""
    instances, params = body.get("instances"), body.get("parameters") or {}
    if not (isinstance(instances, list) and instances and all(isinstance(i, dict) for i in instances)
            and isinstance(params, dict)):
        return None
    key = next((k for k in ("text", "input_ids") if instances[0].get(k)), None)
    return dict(params, **({key: [i.get(key) for i in instances]} if key else {}))


def vertex_error(err: str) -> str:
    """A `/generate` refusal of `vertex_request_body`, named by where the field sits in the vertex body."""
    if err.startswith(("text", "input_ids")):
        return f"instances[*].{err}"
    head = err.split(": ", 1)[0]
    if ": " in err and head and " " not in head:
        return f"parameters.{err}"
    return f"parameters / instances (the /generate request built from them): {err}"


def generate_body_error(body: Any, limits: Limits) -> str | None:
    """The native `/generate` JSON body (single or batched). `max_new_tokens` must be >= 1 here, as
    `max_tokens` is on the OpenAI endpoints (SGLang's internal prefill-only requests are unaffected)."""
    if not isinstance(body, dict):
        return None  # SGLang's own contract check answers
    vocab = limits.vocab_size
    err = multimodal_error(body, limits.images)
    if err:
        return err
    if body.get("text") is not None and body.get("input_ids") is not None:
        # SGLang takes the batch size from `text` and the prompt from `input_ids`: the text was dropped
        # silently, and a batch whose two forms differ in shape was a 500.
        return "text, input_ids: send the prompt once, as text or as token ids, not both"
    ids = body.get("input_ids")
    if isinstance(ids, list) and ids and isinstance(ids[0], list):
        err = _first(*(ids_error(row, vocab, f"input_ids[{i}]") for i, row in enumerate(ids)))
    elif ids is not None:
        err = ids_error(ids, vocab, "input_ids")
    if err:
        return err
    if body.get("text") == []:
        return "text: the batch is empty; send at least one prompt"
    if body.get("text") is not None:
        for text, field in _indexed(body["text"], "text"):
            if isinstance(text, str):
                err = _first(empty_text_error(text, limits, field), text_bytes_error(text, limits, field))
                if err:
                    return err
    for params, field in _indexed(body.get("sampling_params"), "sampling_params"):
        if not isinstance(params, dict):
            continue
        err = _first(
            count_error(params.get("max_new_tokens"), f"{field}.max_new_tokens", 1,
                        what=" (the same rule as max_tokens on the OpenAI endpoints)"),
            n_error(params.get("n"), f"{field}.n"),
            sampling_error(params, vocab, field),
        )
        if err:
            return err
    err = per_request_error(body, _batch_size(body))
    if err:
        return err
    for k, field in _indexed(body.get("top_logprobs_num"), "top_logprobs_num"):
        err = top_logprobs_error(k, vocab, field)
        if err:
            return err
    return None


# ---------------------------------------------------------------------------- entry: OpenAI
def completion_request_error(request: Any, limits: Limits, fill_in_middle: bool = False) -> str | None:
    """OpenAI `/v1/completions` (a CompletionRequest). SGLang already requires max_tokens >= 1.
    `fill_in_middle`: the server has a completion template, the only way SGLang uses `suffix`."""
    vocab = limits.vocab_size
    prompt = request.prompt
    err = None
    if isinstance(prompt, list) and prompt and isinstance(prompt[0], list):
        err = _first(*(ids_error(row, vocab, f"prompt[{i}]") for i, row in enumerate(prompt)))
    elif isinstance(prompt, list) and prompt and not isinstance(prompt[0], str):
        err = ids_error(prompt, vocab, "prompt")
    elif isinstance(prompt, list) and not prompt:
        err = "prompt: the prompt is empty"
    else:
        for text, field in _indexed(prompt, "prompt"):
            if not isinstance(text, str):
                return f"{field}: expected a string, got {type(text).__name__}"
            err = _first(err, empty_text_error(text, limits, field), text_bytes_error(text, limits, field))
    single = isinstance(prompt, str) or (isinstance(prompt, list) and bool(prompt) and _is_int(prompt[0]))
    return _first(
        err,
        openai_rid_error(getattr(request, "rid", None), single, request.n),
        n_error(request.n),
        count_error(getattr(request, "best_of", None), "best_of", 1, MAX_N),
        best_of_error(getattr(request, "best_of", None), request.n),
        None if fill_in_middle else suffix_error(getattr(request, "suffix", None)),
        top_logprobs_error(request.logprobs, vocab, "logprobs"),
        _openai_sampling_error(request, vocab),
    )


def best_of_error(best_of: Any, n: Any) -> str | None:
    """SGLang ignores `best_of`: it returns `n` independent samples and ranks nothing, so a larger `best_of`
    answered as if it were `n` (a silent wrong answer). Equal to `n` (clients send `best_of: 1`) is served."""
    if best_of is None or best_of == n or not _is_int(best_of):
        return None
    return (f"best_of: this server does not rank candidates (it returns n independent samples); leave best_of "
            f"out or set it to n ({n}), got {best_of!r}")


def suffix_error(suffix: Any) -> str | None:
    """SGLang inserts `suffix` only through a completion (fill-in-the-middle) template; without one it dropped
    the suffix and completed the prompt alone (a silent wrong answer)."""
    if not suffix:
        return None
    return ("suffix: this server has no fill-in-the-middle template (--completion-template), so it cannot "
            "complete between a prompt and a suffix; send the prompt alone")


def _openai_sampling_error(request: Any, vocab: int) -> str | None:
    """The sampling extensions of SGLang's OpenAI requests, named as the client wrote them."""
    return _first(
        top_k_error(getattr(request, "top_k", None), "top_k"),
        token_list_error(request.stop_token_ids, vocab, "stop_token_ids"),
        logit_bias_error(request.logit_bias, vocab, "logit_bias"),
        stop_regex_error(getattr(request, "stop_regex", None)),
        stop_strings_error(getattr(request, "stop", None)),
    )


def openai_rid_error(rid: Any, single_prompt: bool, n: Any) -> str | None:
    """`rid` of an OpenAI request: one prompt sampled once takes one string (SGLang's tokenizer manager
    used a list as a dict key and answered 500). Other shapes are SGLang's to check (it answers 400)."""
    if isinstance(rid, list) and single_prompt and n in (None, 1):
        return "rid: a single prompt takes one string, not a list (a list holds one id per prompt of a batch)"
    return None


def chat_request_error(request: Any, limits: Limits) -> str | None:
    """OpenAI `/v1/chat/completions` (a ChatCompletionRequest): the same max_tokens rule as completions."""
    vocab = limits.vocab_size
    for i, message in enumerate(request.messages or []):
        content = getattr(message, "content", None)
        if isinstance(content, list):
            for j, part in enumerate(content):
                kind = getattr(part, "type", None) or (part.get("type") if isinstance(part, dict) else None)
                if kind == "image_url" and not limits.images:
                    return (f"messages[{i}].content[{j}]: 'image_url' parts are not served; this server serves "
                            "DeepSeek-V4.1 without a vision tower (the checkpoint has none, or --language-model-only "
                            "is set)")
                if kind not in (None, "text", "image_url"):
                    return f"messages[{i}].content[{j}]: {kind!r} parts are not served; DeepSeek-V4.1 takes text and images"
    return _first(
        openai_rid_error(getattr(request, "rid", None), True, request.n),
        count_error(request.max_tokens, "max_tokens", 1),
        count_error(request.max_completion_tokens, "max_completion_tokens", 1),
        n_error(request.n),
        top_logprobs_error(request.top_logprobs, vocab, "top_logprobs"),
        _openai_sampling_error(request, vocab),
    )


def detokenize_request_error(tokens: Any, tokenizer_size: int) -> str | None:
    """`/detokenize` (`tokens`: ids or lists of ids): ids the tokenizer has (HF's decode raised a 500)."""
    if isinstance(tokens, list) and tokens and isinstance(tokens[0], list):
        return _first(*(token_list_error(row, tokenizer_size, f"tokens[{i}]") for i, row in enumerate(tokens)))
    return token_list_error(tokens, tokenizer_size, "tokens")


# ---------------------------------------------------------------------------- after tokenization
def tokenized_error(obj: Any, input_ids: Any, vocab_size: int, images: bool = False) -> str | None:
    """One generate request (a GenerateReqInput element) with its prompt ids, from any entry point
    (`images`: as in multimodal_error)."""
    values = {name: getattr(obj, name, None) for name in (*MULTIMODAL_FIELDS, "input_embeds", *EMBED_OVERRIDE_FIELDS)}
    field = "input_ids" if getattr(obj, "input_ids", None) is not None else "text"
    if field == "text" and input_ids is not None and not len(input_ids):
        return "text: the prompt has no tokens after tokenization; send at least one token"
    return _first(
        multimodal_error(values, images),
        ids_error(list(input_ids) if input_ids is not None else None, vocab_size, field),
        top_logprobs_error(getattr(obj, "top_logprobs_num", None), vocab_size, "top_logprobs_num"),
        count_error(getattr(obj, "logprob_start_len", None), "logprob_start_len", -1, what=" (-1: no input logprobs)"),
        _value_error(getattr(obj, "return_logprob", None), bool, "return_logprob"),
        sampling_error(getattr(obj, "sampling_params", None), vocab_size),
    )


def routed_experts_error(requested: Any, served: bool) -> str | None:
    """`return_routed_experts` on a server started without `--enable-return-routed-experts`: SGLang records
    nothing and answered without `routed_experts`, silently (it refuses hidden states the same way)."""
    if requested is True and not served:
        return ("return_routed_experts: this server was started without --enable-return-routed-experts, so it "
                "records no routed experts")
    return None


def admitted_error(input_ids: Any, vocab_size: int | None, top_logprobs_num: Any,
                   sampling: dict | None = None, embed_overrides: Any = None) -> str | None:
    """The scheduler's view of one request (Req.origin_input_ids, Req.vocab_size, Req.top_logprobs_num,
    its SamplingParams as a dict, Req.positional_embed_overrides): the rules whose breach ends the scheduler."""
    if vocab_size is None:
        return None
    return _first(multimodal_error({"positional_embed_overrides": embed_overrides}),
                  ids_error(list(input_ids), vocab_size, "input_ids"),
                  top_logprobs_error(top_logprobs_num, vocab_size, "top_logprobs_num"),
                  sampling_error(sampling, vocab_size))


def request_texts(texts: Any) -> list[str]:
    """The strings of a `_tokenize_texts` argument (a string, a batch of strings, or cross-encoder pairs)."""
    if isinstance(texts, str):
        return [texts]
    out: list[str] = []
    for t in texts or ():
        out.extend(request_texts(t) if isinstance(t, (list, tuple)) else [t] if isinstance(t, str) else [])
    return out


_TYPE_TAGS = frozenset({"str", "int", "float", "bool", "bytes", "list", "dict", "tuple", "set", "none", "null"})
_DISCRIMINATORS = ("type", "role")
"""Fields whose mismatch tells that a union branch is not the one the client meant (a content part's `type`,
a message's `role`)."""


@functools.lru_cache(maxsize=4096)
def _is_tag_name(segment: str) -> bool:
    return "[" in segment or segment in _TYPE_TAGS or (segment[:1].isupper() and segment.isidentifier()
                                                       and "_" not in segment)


def _is_tag(segment: Any) -> bool:
    """A segment pydantic adds to an error's `loc` for a union branch or validator (`str`, `list[...]`,
    `function-after[...]`, `ChatCompletionMessageUserParam`), not a field name or index the client wrote."""
    return isinstance(segment, str) and _is_tag_name(segment)


def _rejects(loc: tuple, depth: int) -> bool:
    """Whether an error of a union branch (its tag at `depth` of `loc`) refuses the value as a whole: not even
    of the branch's type, or a different `type` / `role`."""
    rest = [x for x in loc[depth + 1:] if not _is_tag(x)]
    return not rest or (len(rest) == 1 and rest[0] in _DISCRIMINATORS)


def _meant_branches(errors: list, start: int = 0) -> list:
    """Pydantic reports every branch of a union (a chat message is a generic or a user message; a content part
    one of six kinds), and the first error was often a branch the client never meant ("'role' must be one of"
    for a bad content part of a user message). Keep, at each union, the branches that accepted the value's kind;
    when none did, only the errors that say why (the kind or `type` / `role` each branch wanted), recursively."""
    out, unions = [], {}
    for loc, err in errors:
        i = next((k for k in range(start, len(loc)) if _is_tag(loc[k])), None)
        if i is None:
            out.append((loc, err))
        else:
            unions.setdefault(loc[:i], {}).setdefault(loc[i], []).append((loc, err))
    for prefix, branches in unions.items():
        depth = len(prefix)
        kept = [b for b in branches.values() if not any(_rejects(loc, depth) for loc, _ in b)]
        if not kept:
            kept = [[(loc, err) for loc, err in b if _rejects(loc, depth)] for b in branches.values()]
        for branch in kept:
            out.extend(_meant_branches(branch, depth + 1))
    return out


def field_path(loc: Iterable[Any]) -> str:
    """('messages', 0, 'content', 1, 'text') -> 'messages[0].content[1].text' (pydantic's tags dropped)."""
    out = ""
    for x in loc:
        if isinstance(x, int):
            out += f"[{x}]"
        elif not _is_tag(x):
            out += f".{x}" if out else str(x)
    return out


def _reason(errs: list[dict]) -> str:
    literal = [e for e in errs if e.get("type") == "literal_error"]
    if literal and len(literal) == len(errs):
        expected = ", ".join(dict.fromkeys(str((e.get("ctx") or {}).get("expected", "?")) for e in literal))
        got = literal[0].get("input")
        shown = f", got {got!r}"[:80] if isinstance(got, (str, int, float)) else ""
        return f"expected {expected}{shown}"
    if all(e.get("type") in ("model_type", "dict_type", "model_attributes_type") for e in errs):
        return "Input should be an object"
    msgs = dict.fromkeys(str(e.get("msg", "invalid value")).removeprefix("Value error, ") for e in errs)
    return " or ".join(list(msgs)[:3])


MESSAGE_POSITIONS = 16
"""`validation_message` reads the errors at this many list positions (index paths such as `messages[0]`,
`messages[0].content[3]`, smallest first) and drops the rest: the message names five fields, and a body with
thousands of bad elements raises pydantic errors by the hundred thousand."""


def _first_positions(errors: list[dict]) -> list[dict]:
    """The errors at the MESSAGE_POSITIONS smallest index paths. An index path sorts before its extensions, so
    the errors of a union at `messages[0]` are kept with those of the branches below it."""
    paths = [tuple(x for x in e.get("loc", ()) if isinstance(x, int)) for e in errors]
    kept = set(heapq.nsmallest(MESSAGE_POSITIONS, set(paths)))
    return [e for e, p in zip(errors, paths) if p in kept]


def validation_message(errors: Iterable[dict]) -> str:
    """FastAPI's request-validation errors as one line naming each field (never the input, which may be
    large, nor the endpoint's source file and line, which FastAPI attaches to the exception). Union branches
    the client did not mean are dropped, and a field's errors are merged: a chat content part of an unknown
    type is `messages[0].content[0].type: expected 'text', ..., got 'bogus'`, not a complaint about the role."""
    errors = _first_positions([e for e in errors if isinstance(e, dict)])
    parts = []
    for err in errors:
        if err.get("type") == "json_invalid":
            loc = [str(x) for x in err.get("loc", ()) if x != "body"]
            reason = (err.get("ctx") or {}).get("error")
            where = f" at character {loc[0]}" if loc else ""
            parts.append(f"body: invalid JSON{where}" + (f" ({reason})" if reason else ""))
    located = [(tuple(x for x in err.get("loc", ()) if x != "body"), err) for err in errors
               if err.get("type") != "json_invalid"]
    by_field: dict[str, list[dict]] = {}
    for loc, err in _meant_branches(located):
        by_field.setdefault(field_path(loc) or "body", []).append(err)
    parts += [f"{field}: {_reason(errs)}" for field, errs in by_field.items()]
    return "; ".join(parts[:5]) or "invalid request"


# ---------------------------------------------------------------------------- `/generate` contract errors
I64 = (-(2**63), 2**63 - 1)


def contract_error_field(body: Any, contract) -> str | None:
    """The field of a `/generate` body that SGLang's contract (`contract(body) -> message | None`, its
    `generate_contract_error`) refuses, found by asking it about each field alone: `sampling_params[1].top_k`.
    Its messages name no field ("invalid type: floating point `1.5`, expected i64")."""
    if not isinstance(body, dict):
        return None
    for key, value in body.items():
        if contract({key: value}) is None:
            continue
        if key != "sampling_params":
            return key
        for params, field in _indexed(value, "sampling_params"):
            if not isinstance(params, dict):
                return field
            for name, v in params.items():
                if contract({key: {name: v}}) is not None:
                    return f"{field}.{name}"
        return key
    return None


def _field_value(body: dict, field: str) -> Any:
    value: Any = body
    for part in field.replace("[", ".[").split("."):
        if part.startswith("["):
            value = value[int(part[1:-1])]
        elif part:
            value = value[part]
    return value


def named_contract_error(message: str, body: Any, contract) -> str:
    """SGLang's contract message prefixed with the field it is about. A number where the contract wants an i64
    names the range: JSON integers past 64 bits reach SGLang as floats (`sampling_seed: 2**64` read "invalid type:
    floating point `1.8446744073709552e+19`, expected i64")."""
    field = contract_error_field(body, contract)
    if field is None:
        return message
    value = _field_value(body, field)
    if message.endswith("expected i64") and isinstance(value, (int, float)) and not isinstance(value, bool):
        return f"{field}: must be an integer in [-2**63, 2**63 - 1], got {value!r}"
    return f"{field}: {message}"


# ---------------------------------------------------------------------------- prompt length
def prompt_length_error(n_tokens: int, limits: Limits, field: str) -> str | None:
    """A prompt SGLang's scheduler would refuse for its length (`limits.max_input_tokens` or more tokens; it
    answered "Input length (M tokens) exceeds the maximum allowed length (M tokens)" for a prompt of exactly M).
    Refused here, after tokenizing, with the number a client may send."""
    limit = limits.max_input_tokens
    if limit is None or limits.allow_auto_truncate or n_tokens < limit:
        return None
    return (f"{field}: the prompt has {n_tokens} tokens; this server accepts prompts of at most {limit - 1} tokens "
            f"(context length {limits.context_len})")

"""Tiny tokenizer (determinism, special tokens, round trip) and Engram's compressed token map."""

from __future__ import annotations

import json
import os

import pytest
import torch
from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers

from sglang_dsv41.tokenizer import (
    ALL_SPECIAL_TOKENS,
    CHAT_SPECIAL_TOKENS,
    build_compressed_token_map,
    build_tiny_tokenizer,
    save_tiny_tokenizer,
    token_map_tensor,
)


@pytest.fixture(scope="module")
def tiny():
    return build_tiny_tokenizer()


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory):
    return save_tiny_tokenizer(tmp_path_factory.mktemp("tiny_tok"))


# ------------------------------------------------------------------ tiny tokenizer
def test_deterministic_bytes(tiny, tmp_path):
    assert build_tiny_tokenizer().to_str(pretty=True) == tiny.to_str(pretty=True)
    a = save_tiny_tokenizer(tmp_path / "a")
    b = save_tiny_tokenizer(tmp_path / "b")
    for name in ("tokenizer.json", "tokenizer_config.json"):
        with open(os.path.join(a, name), "rb") as fa, open(os.path.join(b, name), "rb") as fb:
            assert fa.read() == fb.read()


def test_size_and_special_ids(tiny):
    assert tiny.get_vocab_size(with_added_tokens=True) == 1024
    assert tiny.token_to_id("<｜begin▁of▁sentence｜>") == 0
    assert tiny.token_to_id("<｜end▁of▁sentence｜>") == 1
    assert tiny.token_to_id("<｜▁pad▁｜>") == 2
    ids = [tiny.token_to_id(t) for t in ALL_SPECIAL_TOKENS]
    assert None not in ids and len(set(ids)) == len(ids)
    assert ids[3:] == list(range(1024 - len(CHAT_SPECIAL_TOKENS), 1024))
    small = build_tiny_tokenizer(512)
    assert small.get_vocab_size(with_added_tokens=True) == 512
    assert small.token_to_id("<｜▁pad▁｜>") == 2


def test_round_trip_utf8(tiny):
    texts = [
        "Hello, 世界! 日本語とカタカナ, 한국어, café naïve Ωμέγα — 🤖🚀👍🏽 e\u0301 \x00\x7f",
        "  leading and trailing spaces \t\n\r\n  ",
        "数字 1234567890 and code: def f(x):\n    return x ** 2\n",
        "",
    ]
    for text in texts:
        ids = tiny.encode(text).ids
        assert tiny.decode(ids, skip_special_tokens=False) == text


def test_chat_special_tokens_are_single(tiny):
    for tok in ALL_SPECIAL_TOKENS:
        enc = tiny.encode(f"a{tok}b")
        assert tok in enc.tokens
        assert tiny.token_to_id(tok) in enc.ids
        assert len(tiny.encode(tok).ids) == 1
    prompt = "<｜begin▁of▁sentence｜><｜User｜>Hi<｜Assistant｜><think>ok</think>Yes<｜end▁of▁sentence｜>"
    ids = tiny.encode(prompt).ids
    assert ids[0] == 0 and ids[-1] == 1
    assert tiny.decode(ids, skip_special_tokens=False) == prompt
    assert tiny.decode(ids, skip_special_tokens=True) == "HiokYes"


def test_saved_dir_loads(tiny_dir):
    raw = Tokenizer.from_file(os.path.join(tiny_dir, "tokenizer.json"))
    assert raw.get_vocab_size(with_added_tokens=True) == 1024
    with open(os.path.join(tiny_dir, "tokenizer_config.json"), encoding="utf-8") as f:
        cfg = json.load(f)
    assert cfg["tokenizer_class"] == "PreTrainedTokenizerFast"
    assert cfg["pad_token"] == "<｜▁pad▁｜>" and "model_max_length" in cfg

    transformers = pytest.importorskip("transformers")
    hf = transformers.AutoTokenizer.from_pretrained(tiny_dir)
    assert len(hf) == 1024
    assert (hf.bos_token_id, hf.eos_token_id, hf.pad_token_id) == (0, 1, 2)
    text = "<｜User｜>héllo 你好 🤖"
    assert hf.decode(hf.encode(text, add_special_tokens=False)) == text


def test_deepseek_recipe_v41_encoding(tiny_dir):
    dr = pytest.importorskip("deepseek_recipe")
    tools = [dr.ToolDefinition("get_weather", "Get weather", {"type": "object", "properties": {"city": {"type": "string"}}})]
    conv = dr.Conversation(
        [
            dr.SystemMessage("Be brief."),
            dr.UserMessage("Look <｜image｜> please", [dr.DataUrlImageSource("data:image/png;base64,AAAA")]),
            dr.AssistantMessage("", reasoning_content="hmm", tool_calls=[dr.ToolCall("c1", "get_weather", '{"city": "Paris"}')]),
            dr.ToolMessage("Sunny", tool_call_id="c1"),
            dr.AssistantMessage("It is sunny.", reasoning_content="done"),
            dr.LatestReminderMessage("Short answers."),
            dr.UserMessage("Thanks"),
        ],
        tools=tools,
    )
    rendered = dr.DeepseekV41Encoding().render_conversation(conv)
    specials = {rendered.prompt[a:b] for a, b in rendered.special_ranges}
    assert specials <= set(ALL_SPECIAL_TOKENS)
    enc = dr.DeepseekV41Encoding().with_tokenizer(dr.Tokenizer.from_file(os.path.join(tiny_dir, "tokenizer.json")))
    ids = enc.encode(conv)
    raw = Tokenizer.from_file(os.path.join(tiny_dir, "tokenizer.json"))
    assert ids[0] == 0
    assert raw.decode(ids, skip_special_tokens=False) == rendered.prompt
    assert raw.encode(rendered.prompt).ids == ids


# ------------------------------------------------------------------ token map
def test_token_map_tiny_properties(tiny, tiny_dir):
    mapping, n_classes = build_compressed_token_map(tiny)
    assert len(mapping) == 1024
    assert max(mapping) + 1 == n_classes < 1024
    # first-appearance numbering
    seen = -1
    for c in mapping:
        assert c <= seen + 1
        seen = max(seen, c)
    the = {mapping[tiny.token_to_id(t)] for t in ("ĠThe", "Ġthe", "ĠTHE")}
    assert len(the) == 1
    # same result from a directory path, a HF tokenizer, and as a tensor
    assert build_compressed_token_map(tiny_dir) == (mapping, n_classes)
    transformers = pytest.importorskip("transformers")
    assert build_compressed_token_map(transformers.AutoTokenizer.from_pretrained(tiny_dir)) == (mapping, n_classes)
    t = token_map_tensor(tiny)
    assert t.dtype == torch.long and t.tolist() == mapping


def _toy_tokenizer(vocab_tokens: list[str]) -> Tokenizer:
    """Byte-level BPE whose vocab is exactly the given byte-level strings (no merges needed)."""
    vocab = {t: i for i, t in enumerate(vocab_tokens)}
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    return tok


def test_token_map_rules_on_toy_vocab():
    # byte-level spellings: Ġ = space, Ċ = \n, ĉ = \t, Ã = byte 0xC3 (partial UTF-8), Ã© = "é"
    vocab = ["<pad>", "ĠThe", "the", "THE", "Ġ", "ĠĠ", "Ċ", "Ã", "Â", "x", "Ã©", "e", "ĉĊ", "Ġx", "ÌĢ"]
    tok = _toy_tokenizer(vocab)
    tok.add_special_tokens([AddedToken("<pad>", special=True, normalized=False)])
    mapping, n = build_compressed_token_map(tok)
    ids = {t: i for i, t in enumerate(vocab)}
    m = {t: mapping[i] for t, i in ids.items()}
    # first appearance numbering
    assert mapping[:4] == [0, 1, 1, 1]
    # case/space variants share a class
    assert m["ĠThe"] == m["the"] == m["THE"]
    # whitespace-only tokens collapse to the single-space class, distinct from anything else
    assert m["Ġ"] == m["ĠĠ"] == m["Ċ"] == m["ĉĊ"]
    assert len({m["Ġ"], m["x"], m["<pad>"], m["e"]}) == 4
    # accents stripped: "é" joins "e"; " x" joins "x"
    assert m["Ã©"] == m["e"]
    assert m["Ġx"] == m["x"]
    # partial UTF-8 byte tokens key by their raw vocab string, so two different bytes differ
    assert "\ufffd" in tok.decode([ids["Ã"]])
    assert m["Ã"] != m["Â"]
    # a lone combining accent (U+0300, bytes CC 80) normalises to "" and keeps its raw text
    assert tok.decode([ids["ÌĢ"]]) == "\u0300"
    assert m["ÌĢ"] not in {m[t] for t in vocab if t != "ÌĢ"}
    assert n == len(set(mapping)) == max(mapping) + 1
    # expected full class list, by hand
    assert mapping == [0, 1, 1, 1, 2, 2, 2, 3, 4, 5, 6, 6, 2, 5, 7]


def test_lone_space_distinct_from_empty():
    # "Ġ" decodes to " " and keys as " "; "ÌģÌģ" decodes to two combining acute accents, which
    # normalise to "" and therefore key by the decoded text: the two classes stay distinct.
    tok = _toy_tokenizer(["Ġ", "ÌģÌģ", "a"])
    mapping, n = build_compressed_token_map(tok)
    assert mapping == [0, 1, 2] and n == 3

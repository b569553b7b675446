"""A small, deterministic byte-level BPE tokenizer carrying DeepSeek-V4.1's special tokens.

Used for tests and tiny random-weight checkpoints. The tokenizer is built from scratch on every
call (no training library involved): a plain-Python byte-level BPE learner runs over the corpus
embedded below, with a fully specified tie-break, so the saved ``tokenizer.json`` is byte-identical
across runs, machines and `tokenizers` versions that share the JSON format.

Vocabulary layout for ``vocab_size = V`` (``len(tokenizer) == V`` unless the corpus runs out of
merges, which does not happen for V <= 2048):

* ids 0, 1, 2: ``<｜begin▁of▁sentence｜>`` (BOS), ``<｜end▁of▁sentence｜>`` (EOS), ``<｜▁pad▁｜>``
  (PAD; Engram's ``pad_token_id`` is 2), as in DeepSeek's tokenizers;
* ids 3..258: the 256 byte symbols (GPT-2 byte-to-unicode alphabet) in byte order;
* then the learned merges, in merge order;
* the last ``len(CHAT_SPECIAL_TOKENS)`` ids: the chat / multimodal special tokens that
  ``deepseek_recipe`` (0.2.0) knows about (``SpecialToken`` enum), in ``CHAT_SPECIAL_TOKENS`` order;
* with ``image_token=True`` (checkpoints with a vision tower) one more id, the last:
  ``IMAGE_TOKEN``, the checkpoint's image placeholder (SGLang renders an image as it and the model's
  ``image_token_id`` is its id).

All special tokens are added as *special* added tokens (never split by BPE, dropped by
``decode(..., skip_special_tokens=True)``). Encoding adds no BOS/EOS by itself (there is no
post-processor): a rendered chat prompt already starts with BOS.
"""

from __future__ import annotations

import json
import os

from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, pre_tokenizers

BOS_TOKEN = "<｜begin▁of▁sentence｜>"
EOS_TOKEN = "<｜end▁of▁sentence｜>"
PAD_TOKEN = "<｜▁pad▁｜>"
BOS_TOKEN_ID = 0
EOS_TOKEN_ID = 1
PAD_TOKEN_ID = 2

# Special tokens of deepseek_recipe 0.2.0 (`SpecialToken.*.default_str()`), other than BOS/EOS.
# The V4.1 chat rendering (`DeepseekV41Encoding.render_conversation`) emits the first eight as
# special ranges; the grounding tokens (ref/box/point/polygon) are parser-side spellings that
# may appear in model output.
CHAT_SPECIAL_TOKENS: tuple[str, ...] = (
    "<｜System｜>",
    "<｜User｜>",
    "<｜Assistant｜>",
    "<｜latest_reminder｜>",
    "<think>",
    "</think>",
    "｜DSML｜",
    "<｜image｜>",
    "<｜ref｜>",
    "<｜/ref｜>",
    "<｜box｜>",
    "<｜/box｜>",
    "<｜point｜>",
    "<｜/point｜>",
    "<｜polygon｜>",
    "<｜/polygon｜>",
)

IMAGE_TOKEN = "<｜deepseek_image｜>"
"""The image placeholder of a checkpoint with a vision tower (SGLang's deepseek-recipe renderer emits it)."""

#: Every special token, in id order of the head (0, 1, 2) followed by the tail tokens.
ALL_SPECIAL_TOKENS: tuple[str, ...] = (BOS_TOKEN, EOS_TOKEN, PAD_TOKEN) + CHAT_SPECIAL_TOKENS

MODEL_MAX_LENGTH = 1 << 20

# Digits are isolated in groups of at most three before the GPT-2 byte-level regex split
# (`single_digits=True`: every digit is its own piece, so no merge ever joins two digits).
_DIGIT_GROUPS = r"\p{N}{1,3}"
_SINGLE_DIGITS = r"\p{N}"

# Training corpus: varied English prose, code, numbers, JSON, chat markup, accented words,
# Greek/Cyrillic, CJK and a few emoji. Written for this module.
_CORPUS = r"""
The quick brown fox jumps over the lazy dog. THE QUICK BROWN FOX JUMPS OVER THE LAZY DOG.
The model reads the prompt, then the model writes the answer. The answer is short and the
reasoning is long. Then the user asks another question, and the assistant thinks again.
THE END. The beginning. the middle. The weather today is sunny with a light breeze from the west;
tomorrow there will be rain in the morning and clouds in the afternoon. What is the weather like
where you are? I think it is going to be a nice day, but I am not sure.
Once upon a time there was a small village at the edge of a great forest. The people of the
village were farmers and weavers, and every autumn they gathered in the square to share bread,
cheese and apples. Children ran between the stalls while their parents talked about the harvest,
the price of wool, and the stories their grandparents used to tell about the old mill by the river.
Please summarize the following document in three sentences. Translate this paragraph into French.
Write a function that returns the sum of all even numbers in a list. Explain why the sky is blue.
Can you help me debug this code? Sure, here is a corrected version with comments explaining each step.
The results show that the proposed method improves accuracy by 3.7 percent on average, while
reducing memory usage by 42 percent and latency by 18 milliseconds per request.
Numbers: 0 1 2 3 4 5 6 7 8 9 10 11 12 42 64 100 128 256 512 1024 2048 4096 65536 1000000
3.14159 2.71828 1.41421 -17 +25 1e-6 6.02e23 2024-05-17 12:34:56 $19.99 50% 7/8 0x1F 0b1010
Phone: +1 (555) 123-4567. Order #98765 shipped on 2023-11-02 at 09:15 UTC; total 1,234.50 EUR.

def fibonacci(n: int) -> int:
    '''Return the n-th Fibonacci number.'''
    a, b = 0, 1
    for _ in range(n):
        a, b = b, a + b
    return a

class Cache:
    def __init__(self, capacity=128):
        self.capacity = capacity
        self.items = {}

    def get(self, key, default=None):
        if key in self.items:
            return self.items[key]
        return default

import torch
x = torch.randn(4, 8, dtype=torch.bfloat16, device="cuda")
y = torch.matmul(x, x.transpose(0, 1)).float()
print(f"shape={tuple(y.shape)} mean={y.mean().item():.4f}")

#include <stdio.h>
int main(int argc, char **argv) {
    for (int i = 0; i < argc; ++i) {
        printf("%d: %s\n", i, argv[i]);
    }
    return 0;
}

fn main() {
    let v: Vec<u32> = (1..=10).map(|x| x * x).collect();
    println!("{:?}", v);
}

SELECT name, COUNT(*) AS total FROM users WHERE age >= 18 GROUP BY name ORDER BY total DESC;
{"model": "DeepSeek-V4.1-Flash", "messages": [{"role": "user", "content": "Hello!"}], "stream": true}
{"name": "get_weather", "arguments": {"city": "Paris", "unit": "celsius"}, "id": "call_0"}
<tool_result>Sunny, 21 degrees</tool_result>
<invoke name="search"> <parameter name="query" string="true">latest news</parameter> </invoke>
calls> invoke> parameter> string="false" string="true"
## Tools
### Available Tool Schemas
You MUST strictly follow the above defined tool name and parameter schemas to invoke tool calls.
Reasoning Effort: 75 (range 1-100, the higher the value, the more thorough the reasoning)
https://example.com/path/to/page?query=value&lang=en#section-2
user@example.org /usr/local/bin/python3 C:\Users\Admin\Documents\report.txt
git commit -m "Fix the off-by-one error in the tokenizer"   pip install -e .   ls -la | grep py

Le café est délicieux, n'est-ce pas ? Où est la bibliothèque ? Très bien, merci beaucoup.
L'élève a répondu à la question avec précision. Noël, été, hôtel, forêt, garçon, naïve, façade.
Der Müller wohnt in der Straße neben dem Bäcker. Grüße aus München! Schön, dass du da bist.
El niño comió una manzana en la mañana. ¿Dónde está la estación? ¡Qué día tan bonito! Señor.
São Paulo é uma cidade enorme. Ação, coração, informação. Crème brûlée, résumé, déjà vu, CAFÉ.
Ångström, Øresund, Ærø, Łódź, Kraków, Dvořák, Škoda, İstanbul, Ελληνικά, Αθήνα, Привет, мир!
Москва — столица России. Καλημέρα σας. Γεια σου κόσμε. Добрый день, как дела?

人工智能正在改变世界。今天天气很好，我们去公园散步吧。这是一个测试句子，用于训练分词器。
深度学习模型需要大量的数据和计算资源。你好，世界！谢谢你的帮助。我喜欢读书和写代码。
日本語の文章もあります。東京は日本の首都です。ありがとうございます。こんにちは、世界。
ひらがな、カタカナ、漢字を使います。今日はいい天気ですね。
한국어 문장도 포함되어 있습니다. 안녕하세요, 세계! 감사합니다. 서울은 대한민국의 수도입니다.
Emoji: 😀 😂 🚀 🌍 ❤️ 👍 🎉 🤖 ✨ 🔥 — and symbols: © ® ™ € £ ¥ ° ± × ÷ ≤ ≥ ≠ → ← ∞ √ ∑ π µ …
Mixed: The 模型 (model) said “hello” and ‘goodbye’ — then it wrote «bonjour» and „hallo“.
ﬁ ﬂ Ⅻ ① ＡＢＣ １２３ ｈｅｌｌｏ　ｗｏｒｌｄ ㎏ ㎞ ½ ¼ ² ³ Å K ǅ
Tabs	and	multiple   spaces,   and
blank lines

    indented lines, trailing spaces   
	a tab-indented line
The the THE tHe. The end. the end. THE END. Thé, thé, THÉ.
"""


def _byte_alphabet() -> list[str]:
    """The 256 byte-level symbols, indexed by byte value (GPT-2's reversible byte->char map).

    Printable Latin-1 bytes map to themselves; the remaining 68 bytes map, in increasing byte
    order, to U+0100, U+0101, ...
    """
    keep = set(range(ord("!"), ord("~") + 1)) | set(range(0xA1, 0xAC + 1)) | set(range(0xAE, 0xFF + 1))
    out, extra = [], 0
    for b in range(256):
        if b in keep:
            out.append(chr(b))
        else:
            out.append(chr(256 + extra))
            extra += 1
    return out


def _pre_tokenizer(single_digits: bool = False) -> pre_tokenizers.PreTokenizer:
    digits = _SINGLE_DIGITS if single_digits else _DIGIT_GROUPS
    return pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(digits), behavior="isolated", invert=False),
            pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=False, use_regex=True),
        ]
    )


def _learn_merges(words: dict[tuple[str, ...], int], num_merges: int) -> list[tuple[str, str]]:
    """Plain byte-level BPE learning with a total-order tie-break.

    words: symbol tuple -> corpus count. Each step merges the adjacent pair with the largest count
    (pair counts weighted by word counts); ties go to the lexicographically smallest (left, right)
    pair. Pair counts are maintained incrementally. Stops early when no pair is left.
    """
    seqs = [list(w) for w in sorted(words)]
    freq = [words[w] for w in sorted(words)]
    pair_count: dict[tuple[str, str], int] = {}
    pair_where: dict[tuple[str, str], set[int]] = {}

    def add_word(i: int, sign: int) -> None:
        s = seqs[i]
        for a, b in zip(s, s[1:]):
            p = (a, b)
            pair_count[p] = pair_count.get(p, 0) + sign * freq[i]
            if sign > 0:
                pair_where.setdefault(p, set()).add(i)

    for i in range(len(seqs)):
        add_word(i, +1)

    merges: list[tuple[str, str]] = []
    while len(merges) < num_merges:
        best, best_n = None, 0
        for p, n in pair_count.items():
            if n > best_n or (n == best_n and n > 0 and p < best):
                best, best_n = p, n
        if best is None:
            break
        merges.append(best)
        a, b = best
        joined = a + b
        for i in sorted(pair_where.pop(best, ())):
            s = seqs[i]
            if len(s) < 2:
                continue
            add_word(i, -1)
            out, k = [], 0
            while k < len(s):
                if k + 1 < len(s) and s[k] == a and s[k + 1] == b:
                    out.append(joined)
                    k += 2
                else:
                    out.append(s[k])
                    k += 1
            seqs[i] = out
            add_word(i, +1)
        pair_count.pop(best, None)
        for p in [p for p, n in pair_count.items() if n <= 0]:
            del pair_count[p]
            pair_where.pop(p, None)
    return merges


def build_tiny_tokenizer(vocab_size: int = 1024, single_digits: bool = False, image_token: bool = False) -> Tokenizer:
    """Build the deterministic tiny tokenizer (a raw `tokenizers.Tokenizer`).

    Args:
        vocab_size: target total size including all special tokens; must leave room for the
            3 head specials, the 256 byte symbols and the tail specials (>= 275).
        single_digits: split every digit into its own pre-token (one token per digit: what the
            arithmetic-trained default uses); False (the default, unchanged bytes) groups digits in
            threes, which BPE merges further.
        image_token: end with IMAGE_TOKEN (module docstring).
    Returns:
        A `tokenizers.Tokenizer`; `get_vocab_size(with_added_tokens=True) == vocab_size` (smaller
        only if the embedded corpus runs out of pairs to merge). Byte-level: every UTF-8 string
        round-trips through `encode(...).ids` / `decode(ids)` exactly.
    """
    tail = CHAT_SPECIAL_TOKENS + ((IMAGE_TOKEN,) if image_token else ())
    n_fixed = 3 + 256 + len(tail)
    if vocab_size < n_fixed:
        raise ValueError(f"vocab_size={vocab_size} is below the {n_fixed} fixed entries")

    pre = _pre_tokenizer(single_digits)
    words: dict[tuple[str, ...], int] = {}
    for piece, _ in pre.pre_tokenize_str(_CORPUS):
        key = tuple(piece)
        words[key] = words.get(key, 0) + 1
    merges = _learn_merges(words, vocab_size - n_fixed)

    vocab: dict[str, int] = {BOS_TOKEN: BOS_TOKEN_ID, EOS_TOKEN: EOS_TOKEN_ID, PAD_TOKEN: PAD_TOKEN_ID}
    for sym in _byte_alphabet():
        vocab[sym] = len(vocab)
    kept_merges = []
    for a, b in merges:
        kept_merges.append((a, b))
        if a + b not in vocab:
            vocab[a + b] = len(vocab)
        if len(vocab) >= vocab_size - len(tail):
            break
    for tok in tail:
        vocab[tok] = len(vocab)

    tok = Tokenizer(models.BPE(vocab=vocab, merges=kept_merges, fuse_unk=False, byte_fallback=False))
    tok.pre_tokenizer = pre
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens(
        [
            AddedToken(t, single_word=False, lstrip=False, rstrip=False, normalized=False, special=True)
            for t in ALL_SPECIAL_TOKENS + tail[len(CHAT_SPECIAL_TOKENS):]
        ]
    )
    return tok


def tokenizer_config_dict(image_token: bool = False) -> dict:
    """Contents of `tokenizer_config.json` for the tiny tokenizer (HF `PreTrainedTokenizerFast`)."""
    return {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": BOS_TOKEN,
        "eos_token": EOS_TOKEN,
        "pad_token": PAD_TOKEN,
        "unk_token": None,
        "add_bos_token": False,
        "add_eos_token": False,
        "clean_up_tokenization_spaces": False,
        "model_max_length": MODEL_MAX_LENGTH,
        "additional_special_tokens": list(CHAT_SPECIAL_TOKENS) + ([IMAGE_TOKEN] if image_token else []),
    }


def save_tiny_tokenizer(out_dir: str | os.PathLike, vocab_size: int = 1024, single_digits: bool = False,
                        image_token: bool = False) -> str:
    """Write `tokenizer.json` and `tokenizer_config.json` (plus `special_tokens_map.json`) to out_dir.

    The directory loads with `transformers.AutoTokenizer.from_pretrained(out_dir)`,
    `tokenizers.Tokenizer.from_file(out_dir/tokenizer.json)` and
    `deepseek_recipe.Tokenizer.from_file(out_dir/tokenizer.json)`. Returns out_dir as a str.
    """
    out_dir = os.fspath(out_dir)
    os.makedirs(out_dir, exist_ok=True)
    tok = build_tiny_tokenizer(vocab_size, single_digits, image_token)
    with open(os.path.join(out_dir, "tokenizer.json"), "w", encoding="utf-8") as f:
        f.write(tok.to_str(pretty=True))
    cfg = tokenizer_config_dict(image_token)
    with open(os.path.join(out_dir, "tokenizer_config.json"), "w", encoding="utf-8") as f:
        json.dump(cfg, f, ensure_ascii=False, indent=2, sort_keys=True)
        f.write("\n")
    special_map = {k: cfg[k] for k in ("bos_token", "eos_token", "pad_token", "additional_special_tokens")}
    with open(os.path.join(out_dir, "special_tokens_map.json"), "w", encoding="utf-8") as f:
        json.dump(special_map, f, ensure_ascii=False, indent=2, sort_keys=True)
        f.write("\n")
    return out_dir

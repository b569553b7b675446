"""A row's attention bits do not depend on how many -1 entries pad its key list.

The dense KV lists min(topk, T) compressed entries for every row, a paged prefill the batch's widest
row, a fixed-shape decode step `seq_capacity // ratio`: the same row's valid keys followed by a
different number of invalid ones. `attend_gathered` reduces every block over a full tile of 64 keys,
so these agree bit for bit. Before, a short last tile was reduced over its own length, and torch's
CPU sum associates a 20-term and a 24-term (4 zeros) reduction differently now and then: the
intermittent train/serve mismatch of the RL test (docs/rl.md), recorded from a server and replayed
here as `test_static_decode_equals_dense_on_the_recorded_request`.
"""

from __future__ import annotations

import pytest
import torch

from sglang_dsv41.reference.dense_kv import DenseKV
from sglang_dsv41.runtime import KVPools, Runtime
from sglang_dsv41.runtime.batch import Batch
from sglang_dsv41.shared_math import attend_gathered

# deepseek-v4.1-tiny (seed 0): a 13-token prompt and the 8 tokens the server then sampled. Its decode
# steps at positions 19 and 20 (20 and 21 visible ratio-1 positions, capacity 256) gave logits that
# differed from the trainer's dense forward at the first ratio-1 layer.
RECORDED = [531, 810, 944, 807, 521, 822, 765, 358, 683, 534, 93, 484, 722, 291, 725, 792, 723, 141, 870, 191, 160]
PROMPT = 13


@pytest.mark.parametrize("valid_keys", [20, 37, 100])
def test_attention_bits_do_not_depend_on_list_padding(valid_keys):
    g = torch.Generator().manual_seed(valid_keys)
    t, h, d = 256, 4, 128
    q = torch.randn(t, h, d, generator=g).bfloat16()
    keys = torch.randn(t, valid_keys, d, generator=g).bfloat16()
    sink = torch.randn(h, generator=g)
    ref = attend_gathered(q, keys, torch.ones(t, valid_keys, dtype=torch.bool), sink, d**-0.5)
    for width in (valid_keys + 3, valid_keys + 4, 148, 256):
        extra = width - valid_keys
        padded = torch.cat([keys, torch.randn(t, extra, d, generator=g).bfloat16()], 1)  # garbage behind -1
        valid = torch.arange(width) < valid_keys
        out = attend_gathered(q, padded, valid.expand(t, width), sink, d**-0.5)
        assert torch.equal(out, ref), f"{valid_keys} valid keys padded to {width}: {int((out != ref).sum())} values differ"


def test_static_decode_equals_dense_on_the_recorded_request(tiny_model):
    cfg = tiny_model.cfg
    n, capacity, req_slot, base = len(RECORDED), 256, 5, 64  # slots base + position (page-aligned)
    with torch.inference_mode():
        dense = tiny_model(torch.tensor(RECORDED), DenseKV(cfg, n, "cpu"), None).logits.float()
        rt = Runtime(tiny_model, KVPools(cfg, 1024, 8, "cpu"))
        table = (base + torch.arange(capacity)).unsqueeze(0)
        t = lambda x: torch.tensor(x, dtype=torch.int64)  # noqa: E731
        hw = cfg.engram.max_ngram_size - 1
        prefill = Batch(input_ids=t(RECORDED[:PROMPT]), positions=torch.arange(PROMPT), req_index=torch.zeros(PROMPT, dtype=torch.int64),
                        req_slots=t([req_slot]), prefix_lens=t([0]), extend_lens=t([PROMPT]), token_table=table,
                        history=torch.zeros(1, hw, dtype=torch.int64), logits_rows=t([PROMPT - 1]))
        got = {PROMPT - 1: rt.forward(prefill).logits.float()[0]}
        for p in range(PROMPT, n):
            step = Batch(input_ids=t([RECORDED[p]]), positions=t([p]), req_index=t([0]), req_slots=t([req_slot]),
                         prefix_lens=t([p]), extend_lens=t([1]), token_table=table, history=t([RECORDED[p - hw : p]]),
                         logits_rows=t([0]), seq_capacity=capacity, static=True)
            got[p] = rt.forward(step).logits.float()[0]
    differ = [p for p, row in got.items() if not torch.equal(row, dense[p])]
    assert not differ, f"static decode logits differ from the dense forward at positions {differ}"

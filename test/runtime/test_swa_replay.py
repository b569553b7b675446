"""SWA bounded replay (spec attention 7) in the paged runtime against the dense reference, bit for bit.

The reference writes both modes out plainly (reference/dense_kv.py): decoder tail replay as a
narrowing to each prefill chunk's last `window` rows with floored late-layer windows; encoder replay
as "run the prefix, then recompute its last min(P, window) tokens floored at P - window, then the
new tokens". The paged runtime must give exactly those numbers through its own machinery (tail
narrowing of a packed batch; window rings + workspace + replay rows that write no compressed KV),
with NaN-poisoned pools so a read of anything never written shows up.
"""

from __future__ import annotations

import dataclasses

import pytest
import torch

from dsv41_kernels.op_table import OpTable
from sglang_dsv41.checkpoint.loader import load_model
from sglang_dsv41.reference.model import ReferenceModel
from sglang_dsv41.runtime.batch import Batch
from sglang_dsv41.runtime.driver import Driver, Sequence, random_prompts
from sglang_dsv41.runtime.paged_kv import TAIL_MISSES_ROWS

T = 200  # > window (128): the tail drops rows; two pages of 64 plus a partial one


@pytest.fixture(scope="module")
def model():
    return load_model("deepseek-v4.1-tiny-random", progress=False)


@pytest.fixture(scope="module")
def ref(model):
    return ReferenceModel(model)


@pytest.fixture(scope="module")
def tokens(model):
    return random_prompts(model.cfg.vocab_size, 2, T, seed=11)


def driver(model, **kw) -> Driver:
    return Driver(model, 4 * T, 3, 64, poison=True, ops=OpTable.twins(), **kw)


def prefill(drv: Driver, seq: Sequence, chunk: int, tail_logits: bool = False) -> list[torch.Tensor]:
    """Chunked prefill of one sequence; per chunk the logits of its tail rows (or its last row)."""
    W, out = drv.model.cfg.attention.window_size, []
    while seq.cached < seq.prefill_len:
        c = min(chunk, seq.prefill_len - seq.cached)
        if not tail_logits:
            out.append(drv.step([seq], [c]).logits)
            continue
        ngram = drv.model.cfg.engram.max_ngram_size - 1
        table = drv._table([seq], seq.cached + c)
        b = Batch.build([seq.tokens[seq.cached: seq.cached + c]], [seq.cached], table, [seq.req_slot],
                        [seq.tokens[max(0, seq.cached - ngram): seq.cached]], history_width=ngram)
        b = dataclasses.replace(b, logits_rows=torch.arange(max(0, c - W), c))
        out.append(drv.runtime.forward(b).logits)
        seq.cached += c
    return out


def test_decoder_one_shot_equals_reference_tail(model, ref, tokens):
    drv = driver(model, decoder_replay=True)
    seq = Sequence(0, tokens[0], T)
    got = prefill(drv, seq, T, tail_logits=True)[0]
    want = ref.forward(torch.tensor(tokens[0]), decoder_tail_replay=True)
    assert got.shape[0] == 128 and torch.equal(got, want.logits)
    full = ref.forward(torch.tensor(tokens[0])).logits[-1]
    assert not torch.equal(got[-1], full)  # it is an approximation: the late layers saw fewer rows


@pytest.mark.parametrize("chunk", [64, 7])
def test_decoder_chunked_equals_reference_chunks(model, ref, tokens, chunk):
    """A short chunk's tail reads late-layer window KV that earlier chunks' tails wrote. Chunks of 7
    rows need MKL's reproducible mode (test/conftest.py sets MKL_CBWR=COMPATIBLE): with MKL_CBWR=AUTO
    a 7-row GEMM takes another code path than the reference's rows and some logits differ."""
    drv = driver(model, decoder_replay=True)
    got = prefill(drv, Sequence(0, tokens[0], T), chunk)[-1][-1]
    want = ref.forward(torch.tensor(tokens[0]), decoder_tail_replay=True, chunk=chunk).logits[-1]
    assert torch.equal(got, want)


def test_decoder_chunk_of_one_is_full_prefill(model, ref, tokens):
    """Chunks of one row keep every row with its whole window: exactly the full forward."""
    short = tokens[1][:140]
    drv = driver(model, decoder_replay=True)
    got = torch.cat(prefill(drv, Sequence(0, short, len(short)), 1))
    assert torch.equal(got, ref.forward(torch.tensor(short)).logits)


def test_decoder_prompt_logprob_request_runs_every_row(model, ref, tokens):
    """All-row logits (prompt logprobs) keep the request whole, next to a tail-only request."""
    drv = driver(model, decoder_replay=True)
    a, b = Sequence(0, tokens[0], T), Sequence(1, tokens[1], T)
    table = drv._table([a, b], T)
    batch = Batch.build([a.tokens, b.tokens], [0, 0], table, [0, 1], [[], []], history_width=2)
    rows = torch.cat([torch.arange(T), torch.tensor([2 * T - 1])])  # every row of a, the last of b
    out = drv.runtime.forward(dataclasses.replace(batch, logits_rows=rows))
    assert torch.equal(out.logits[:T], ref.forward(torch.tensor(tokens[0])).logits)
    tail_b = ref.forward(torch.tensor(tokens[1]), decoder_tail_replay=True).logits[-1]
    assert torch.equal(out.logits[T], tail_b)
    assert out.tail_rows.numel() == T + 128
    with pytest.raises(ValueError, match=TAIL_MISSES_ROWS):
        drv.runtime.forward(dataclasses.replace(batch, logits_rows=rows, full_rows=torch.tensor([False, False])))


@pytest.mark.parametrize("decoder", [False, True])
def test_encoder_hit_equals_reference(model, ref, tokens, decoder):
    """A prefix hit of P = 192 cached tokens (3 pages): the window is rebuilt by recomputing the last
    128 of them (floored at 64) in front of 40 new tokens; the hit forward equals the reference's
    prefix-hit forward bit for bit, and differs from a cold prefill."""
    P, new = 192, tokens[1][:40]
    drv = driver(model, encoder_replay=True, decoder_replay=decoder)
    src = Sequence(0, tokens[0][:P], P)
    drv.run([src], 1, chunk=64, release=False)  # the earlier request: its pages are the cached prefix
    hit = drv.fork(src, 1, new)
    assert hit.cached == P and not hit.window_ready
    got = drv.step([hit], [len(new)]).logits[-1]
    want = ref.forward(torch.tensor(tokens[0][:P] + new), prefix_hit=P, decoder_tail_replay=decoder).logits[-1]
    assert torch.equal(got, want)
    cold = ref.forward(torch.tensor(tokens[0][:P] + new), decoder_tail_replay=decoder).logits[-1]
    assert not torch.equal(got, cold)  # an approximation: rows near the hit saw a truncated window


def test_encoder_hit_within_one_window_is_exact(model, ref, tokens):
    """P <= 128: every cached token is recomputed from position 0, so the hit equals cold prefill."""
    P, new = 128, tokens[1][:24]
    drv = driver(model, encoder_replay=True)
    src = Sequence(0, tokens[0][:P], P)
    drv.run([src], 1, chunk=64, release=False)
    got = drv.step([drv.fork(src, 1, new)], [len(new)]).logits[-1]
    assert torch.equal(got, ref.forward(torch.tensor(tokens[0][:P] + new)).logits[-1])


def test_encoder_decode_after_hit_reads_the_ring(model, ref, tokens):
    """Decode steps after a hit read their window from the request's ring (poisoned before the hit):
    the greedy tokens are the reference's, which computes the same rows in one dense pass."""
    P, new = 128, tokens[1][:72]
    drv = driver(model, encoder_replay=True)
    src = Sequence(0, tokens[0][:P], P)
    drv.run([src], 1, chunk=64, release=False)
    out, _ = drv.run([drv.fork(src, 1, new)], 4)
    text = torch.tensor(tokens[0][:P] + new + out[0][:3])
    want = ref.forward(text, prefix_hit=P).logits[-4:].argmax(-1)
    assert out[0] == want.tolist()


def test_encoder_rings_hold_no_window_per_token(model):
    drv = driver(model, encoder_replay=True)
    cfg, pools = model.cfg, drv.pools
    # before any forward a window pool is the rings alone: R*C rows, no workspace row, none per token slot
    assert all(w.shape == (pools.workspace_base, cfg.window_kv_bytes_per_token) for w in pools.window)
    assert pools.workspace_base == 3 * cfg.attention.window_size  # 3 request slots x one window each
    assert all(w.size(0) < pools.num_slots for w in pools.window)
    hit = Sequence(0, list(range(3, 3 + 130)), 130)
    drv.run([hit], 2, chunk=130)
    assert all(w.size(0) - pools.workspace_base >= 130 for w in pools.window)  # workspace grew to the forward


def test_odd_cached_boundary_is_refused(model, tokens):
    from sglang_dsv41.reference.dense_kv import DenseKV

    cached = DenseKV(model.cfg, 65, "cpu")
    with pytest.raises(ValueError, match="even cached-prefix boundary"):
        DenseKV.resume(cached, torch.tensor(tokens[0][:80]), 65)

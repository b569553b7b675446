"""Kernel test cases shared by the GPU tests and the CPU interpreter check: inputs per op, seeded.

`build(op, params, seed, device)` makes fresh random inputs (odd sizes, -1 slots, NaN-poisoned
unreferenced pool rows, rows with nothing valid, special values); `run(op, fn, case)` calls one
implementation on its own copy of any mutated pool and returns the tensor to compare; KIND says
how (kernel_compare.TOLERANCES). Oracle of every comparison: the op's torch twin.
"""

from __future__ import annotations

import torch

from sglang_dsv41.quant import index_fp4_pack, index_fp4_stage1, kv_fp4_pack, window_kv_pack

KIND = {"window_kv_store": "bitwise", "compressed_kv_store": "bitwise", "index_key_store": "bitwise",
        "index_query_quant": "bitwise", "index_scores": "bitwise", "topk_select": "bitwise",
        "candidate_blocks": "bitwise", "sparse_attention_paged": "bf16", "engram_gather": "bitwise",
        "engram_gate": "bf16", "engram_hash": "bitwise", "fp8_linear": "fp8_gemm", "fp4_linear": "fp8_gemm",
        "rope_rotate": "bitwise"}

# (op, params): correctness grid + corner cases; GPU tests use all, the interpreter the small ones.
GRID = [
    ("window_kv_store", dict(n=1, d=512)), ("window_kv_store", dict(n=67, d=512)),
    ("window_kv_store", dict(n=300, d=512, special=True)), ("window_kv_store", dict(n=5, d=96)),
    ("compressed_kv_store", dict(n=1, d=512)), ("compressed_kv_store", dict(n=131, d=512, special=True)),
    ("compressed_kv_store", dict(n=9, d=80)),
    ("index_key_store", dict(n=1, d=128)), ("index_key_store", dict(n=257, d=128, special=True)),
    ("index_query_quant", dict(t=1, h=32, d=128)), ("index_query_quant", dict(t=37, h=3, d=128, special=True)),
    # multi-row store tiles: n = 0, and n not a multiple of the rows per program, with ties
    ("window_kv_store", dict(n=0, d=512)), ("window_kv_store", dict(n=77, d=512, special=True, ties=True)),
    ("compressed_kv_store", dict(n=0, d=512)), ("compressed_kv_store", dict(n=45, d=512, special=True, ties=True)),
    ("index_key_store", dict(n=0, d=128)), ("index_key_store", dict(n=99, d=128, special=True, ties=True)),
    ("index_query_quant", dict(t=0, h=32, d=128)), ("index_query_quant", dict(t=21, h=32, d=128, special=True, ties=True)),
    ("index_scores", dict(t=1, h=32, n=1)), ("index_scores", dict(t=5, h=32, n=300)),
    ("index_scores", dict(t=3, h=3, n=129)), ("index_scores", dict(t=2, h=32, n=2000, empty_row=True)),
    ("topk_select", dict(t=3, n=7, k=512)), ("topk_select", dict(t=4, n=1000, k=512, ties=True)),
    ("topk_select", dict(t=6, n=5000, k=64)), ("topk_select", dict(t=2, n=70000, k=512, ties=True)),
    ("topk_select", dict(t=3, n=3000, k=512, special=True)), ("topk_select", dict(t=5, n=40000, k=512, fp32=True)),
    ("candidate_blocks", dict(t=5, n=100, kb=3, bs=8)), ("candidate_blocks", dict(t=4, n=20000, kb=2048, bs=8)),
    ("candidate_blocks", dict(t=3, n=70001, kb=2048, bs=8, special=True)),
    ("sparse_attention_paged", dict(t=1, h=64, d=512, w=128, k=512)),
    ("sparse_attention_paged", dict(t=7, h=64, d=512, w=128, k=512, short=True)),
    ("sparse_attention_paged", dict(t=3, h=3, d=512, w=70, k=130)),
    ("sparse_attention_paged", dict(t=5, h=64, d=512, w=128, k=0)),
    ("sparse_attention_paged", dict(t=131, h=64, d=512, w=128, k=512, short=True)),
    ("sparse_attention_paged", dict(t=2, h=17, d=128, w=1, k=1)),
    ("engram_gather", dict(shape=(1, 1))), ("engram_gather", dict(shape=(37, 24))), ("engram_gather", dict(shape=(0, 24))),
    ("engram_gather", dict(shape=(300, 24), host=True)),
    ("engram_gate", dict(t=1, ns=4, hid=5120)), ("engram_gate", dict(t=9, ns=4, hid=300, mask=True)),
    ("engram_hash", dict(t=1, n=4, heads=8)), ("engram_hash", dict(t=333, n=4, heads=8)), ("engram_hash", dict(t=50, n=3, heads=3)),
    # RoPE of q (64 heads x 512, last 64 rotated) and of the attention output (inverse); 2-D rows; fp32 rows;
    # a row that is all rope (d = 2r)
    ("rope_rotate", dict(t=1, h=64, d=512, r=32)), ("rope_rotate", dict(t=37, h=64, d=512, r=32, inverse=True, special=True)),
    ("rope_rotate", dict(t=300, h=0, d=512, r=32, special=True)), ("rope_rotate", dict(t=9, h=3, d=96, r=16, fp32=True)),
    ("rope_rotate", dict(t=5, h=2, d=64, r=32)), ("rope_rotate", dict(t=0, h=64, d=512, r=32)),
]

# small cases for the CPU interpreter (TRITON_INTERPRET=1, ~15 s in all): one or two per op
INTERP_GRID = [
    ("window_kv_store", dict(n=8, d=512, special=True)), ("window_kv_store", dict(n=3, d=96)),
    ("compressed_kv_store", dict(n=8, d=512, special=True)), ("index_key_store", dict(n=8, d=128, special=True)),
    ("index_query_quant", dict(t=3, h=3, d=128, special=True)), ("index_scores", dict(t=2, h=3, n=129)),
    ("topk_select", dict(t=3, n=1000, k=64, ties=True)), ("topk_select", dict(t=2, n=500, k=64, fp32=True)), ("candidate_blocks", dict(t=3, n=100, kb=3, bs=8)),
    ("sparse_attention_paged", dict(t=3, h=3, d=128, w=70, k=65)), ("engram_gather", dict(shape=(3, 5))),
    ("engram_gate", dict(t=2, ns=4, hid=300, mask=True)), ("engram_hash", dict(t=20, n=4, heads=8)),
    ("fp8_linear", dict(m=9, n=100, k=128, special=True)), ("fp8_linear", dict(m=3, n=33, k=96, lead=True)),
    ("fp4_linear", dict(m=9, n=100, k=128, special=True, int8=True)), ("fp4_linear", dict(m=2, n=64, k=64)),
    # multi-row store tiles: ragged last program (13 rows), one row, none; exact ties
    ("window_kv_store", dict(n=13, d=512, special=True, ties=True)), ("window_kv_store", dict(n=1, d=512)),
    ("window_kv_store", dict(n=0, d=512)), ("compressed_kv_store", dict(n=13, d=512, special=True, ties=True)),
    ("compressed_kv_store", dict(n=7, d=80)), ("index_key_store", dict(n=13, d=128, special=True, ties=True)),
    ("index_key_store", dict(n=1, d=128)), ("index_key_store", dict(n=0, d=128)),
    ("index_query_quant", dict(t=5, h=3, d=128, special=True, ties=True)),
    ("rope_rotate", dict(t=3, h=5, d=512, r=32, special=True)), ("rope_rotate", dict(t=7, h=2, d=96, r=16, inverse=True)),
    ("rope_rotate", dict(t=8, h=0, d=64, r=32, special=True, fp32=True)), ("rope_rotate", dict(t=0, h=4, d=512, r=32)),
]


def _g(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def _rows(n: int, d: int, g: torch.Generator, special: bool, ties: bool = False) -> torch.Tensor:
    """bf16 [n, d]: per-row scales over 1e-3..1e2; with `special`, rows of zeros, tiny (e4m3 /
    e2m1 subnormal ranges), huge, one NaN and one inf element; with `ties` (n >= 8) a row spread over
    1e-5..1e3 (e4m3 subnormals next to the group maximum) and a row of multiples of 1/32 up to 3/8
    (E2M1 rounding ties at both FP4 stages and the compressed-KV scale)."""
    x = torch.randn(n, d, generator=g) * torch.pow(10.0, torch.rand(n, 1, generator=g) * 5 - 3)
    if special and n >= 6:
        x[0] = 0
        x[1] *= 1e-6
        x[2] *= 1e4
        x[3, 5] = float("nan")
        x[4, 7] = float("inf")
        x[5, ::2] = 0.0
    if ties and n >= 8:
        x[6] = torch.randn(d, generator=g) * torch.pow(10.0, torch.rand(d, generator=g) * 8 - 5)
        x[7] = torch.randint(-12, 13, (d,), generator=g) / 32.0
    return x.bfloat16()


def _rope(n: int, rd: int, g: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    pos = torch.randint(0, 1 << 20, (n,), generator=g).float()
    inv = 1.0 / (160000.0 ** (torch.arange(0, rd, 2).float() / rd))
    ang = pos[:, None] * inv
    return torch.cos(ang), torch.sin(ang)


def _slots(n: int, num_slots: int, g: torch.Generator) -> torch.Tensor:
    s = torch.randperm(num_slots, generator=g)[:n]
    s[torch.rand(n, generator=g) < 0.1] = -1
    return s


def _poisoned_pool(rows: int, nbytes: int, g: torch.Generator) -> torch.Tensor:
    p = torch.randint(0, 256, (rows, nbytes), generator=g, dtype=torch.uint8)
    p[::3] = 0xFF  # NaN scales / NaN e4m3 everywhere a kernel must not look
    return p


def build(op: str, p: dict, seed: int, device: str) -> dict:
    if op in ("fp8_linear", "fp4_linear"):
        return build_gemm(op, p, seed, device)
    g = _g(seed)
    if op in ("window_kv_store", "compressed_kv_store", "index_key_store"):
        n, d = p["n"], p["d"]
        x = _rows(n, d, g, p.get("special", False), p.get("ties", False))
        cos, sin = _rope(n, min(64, d // 2), g)
        nbytes = {"window_kv_store": d + d // 32, "compressed_kv_store": d // 2 + d // 16, "index_key_store": d // 2 + d // 32}[op]
        pool = _poisoned_pool(2 * n + 3, nbytes, g)
        slots = _slots(n, pool.size(0), g)
        args = [x, cos, sin, slots, pool]
        if op == "window_kv_store":
            args = [x, (torch.rand(d, generator=g) + 0.5).bfloat16(), 1e-6, cos, sin, slots, pool]
        return {"args": [a.to(device) if isinstance(a, torch.Tensor) else a for a in args], "pool": len(args) - 1}
    if op == "rope_rotate":  # h = 0: 2-D rows [t, d]
        t, h, d = p["t"], p["h"], p["d"]
        x = _rows(t * max(h, 1), d, g, p.get("special", False)).view(*((t, h) if h else (t,)), d)
        x = x.float() if p.get("fp32") else x
        cos, sin = _rope(t, 2 * p["r"], g)
        return {"args": [x.to(device), cos.to(device), sin.to(device), p.get("inverse", False)]}
    if op == "index_query_quant":
        q = _rows(p["t"] * p["h"], p["d"], g, p.get("special", False), p.get("ties", False)).view(p["t"], p["h"], p["d"])
        cos, sin = _rope(p["t"], 64, g)
        return {"args": [q.to(device), cos.to(device), sin.to(device)]}
    if op == "index_scores":
        t, h, n = p["t"], p["h"], p["n"]
        keys = _rows(2 * n + 5, 128, g, False)
        pool = index_fp4_pack(index_fp4_stage1(keys))
        table = torch.randperm(pool.size(0), generator=g)[: n].repeat(t, 1)
        table[torch.rand(t, n, generator=g) < 0.15] = -1
        table[:, n // 2 :] = torch.where(torch.arange(n // 2, n) < n - t, table[:, n // 2 :], -1)
        if p.get("empty_row"):
            table[0] = -1
        used = torch.zeros(pool.size(0), dtype=torch.bool)
        used[table[table >= 0]] = True
        pool[~used] = 0xFF
        q = torch.stack([index_fp4_stage1(_rows(h, 128, g, False)) for _ in range(t)])
        w = torch.randn(t, h, generator=g).bfloat16()
        return {"args": [q.to(device), w.to(device), pool.to(device), table.to(device)]}
    if op in ("topk_select", "candidate_blocks"):
        t, n = p["t"], p["n"]
        s = torch.randn(t, n, generator=g)
        if p.get("ties"):
            s = (s * 4).round() / 4  # heavy ties
        if not p.get("fp32"):
            s = s.bfloat16().float()  # the indexer's scores are bf16 values
        vis = torch.randint(0, n + 1, (t,), generator=g)
        vis[0] = n
        if p.get("special"):
            s[0, ::7] = float("nan")
            s[1] = float("-inf")
            s[-1, :50] = float("inf")
            s[-1, 60:70] = -0.0
        if p.get("corner"):  # full-length rows: all NaN, all -inf, fewer than k rankable, one value
            # everywhere, a far outlier (k-th largest ~127 binades below the maximum), all negative
            vis[:6] = n
            s[0] = float("nan")
            s[1] = float("-inf")
            s[2, p["k"] // 3 :] = float("nan")
            s[3] = 1.1 if p.get("fp32") else 1.5  # 1.1: not a bf16 value
            s[4, 1] = 3e38
            s[5] = -s[5].abs()
        if op == "topk_select":
            s = torch.where(torch.arange(n) < vis[:, None], s, float("-inf"))
            return {"args": [s.to(device), p["k"]]}
        s = torch.where(torch.arange(n) < vis[:, None], s, float("-inf"))
        return {"args": [s.to(device), vis.to(device), p["kb"], p["bs"]]}
    if op == "sparse_attention_paged":
        t, h, d, w, k = p["t"], p["h"], p["d"], p["w"], p["k"]
        q = torch.randn(t, h, d, generator=g).bfloat16()
        n_w, n_c = 3 * w + 5, 2 * k + 5
        # keys as the model writes them (RMS-normed latents, O(1)): the bf16 tolerance is meant for
        # such data; with 1e3-sized keys the twin itself is off the fp64 result by more (cancellation)
        wpool = window_kv_pack((torch.randn(n_w, d, generator=g) * (0.5 + 1.5 * torch.rand(n_w, 1, generator=g))).bfloat16())
        cpool = kv_fp4_pack((torch.randn(n_c, d, generator=g) * (0.5 + 1.5 * torch.rand(n_c, 1, generator=g))).bfloat16())
        ws = torch.randint(0, n_w, (t, w), generator=g)
        ws[torch.rand(t, w, generator=g) < 0.1] = -1
        if p.get("short"):  # sequences shorter than the window: valid first, then -1
            for i in range(t):
                ln = int(torch.randint(0, w + 1, (1,), generator=g))
                ws[i, ln:] = -1
        cs = torch.randint(0, max(1, n_c), (t, k), generator=g)
        cs[torch.rand(t, k, generator=g) < 0.2] = -1
        if t > 2:
            ws[1] = -1
            cs[1] = -1  # a row with nothing valid
        for pool, sl in ((wpool, ws), (cpool, cs)):
            used = torch.zeros(pool.size(0), dtype=torch.bool)
            used[sl[sl >= 0]] = True
            pool[~used] = 0xFF
        sink = torch.randn(h, generator=g)
        args = [q, wpool, ws, cpool if k else None, cs if k else None, sink, d ** -0.5]
        return {"args": [a.to(device) if isinstance(a, torch.Tensor) else a for a in args]}
    if op == "engram_gather":
        rows = 5000
        w = (torch.randn(rows, 256, generator=g) * 3).to(torch.float8_e4m3fn)
        sc = torch.randint(100, 150, (rows, 8), generator=g, dtype=torch.uint8)
        sc[0, 0] = 0
        sc[1, 1] = 255
        ids = torch.randint(0, rows, p["shape"], generator=g)
        if ids.numel():
            ids.view(-1)[0] = 1
        if p.get("host") and device != "cpu":
            return {"args": [w.pin_memory(), sc.view(torch.float8_e8m0fnu).pin_memory(), ids.to(device)]}
        return {"args": [w.to(device), sc.view(torch.float8_e8m0fnu).to(device), ids.to(device)]}
    if op == "engram_gate":
        t, ns, hid = p["t"], p["ns"], p["hid"]
        st = torch.randn(t, ns, hid, generator=g).bfloat16()
        kv = torch.randn(t, (ns + 1) * hid, generator=g).bfloat16()
        qw = (torch.rand(ns, hid, generator=g) + 0.5).bfloat16()
        kw = (torch.rand(ns, hid, generator=g) + 0.5).bfloat16()
        mask = (torch.rand(t, generator=g) < 0.7) if p.get("mask") else None
        args = [st, kv, qw, kw, 1e-6, mask]
        return {"args": [a.to(device) if isinstance(a, torch.Tensor) else a for a in args]}
    if op == "engram_hash":
        from sglang_dsv41.config import EngramConfig
        from sglang_dsv41.engram_hash import EngramHasher
        from sglang_dsv41.engram_layout import EngramLayout

        n, heads, vocab, cvs = p["n"], p["heads"], (16_000_000 if p["heads"] == 8 else 501), (99092 if p["heads"] == 8 else 77)
        layout = EngramLayout.build(2, n, heads, vocab)
        cfg = EngramConfig(layer_ids=(1, 14), num_embeddings=layout.num_embeddings, max_ngram_size=n, vocab_size=vocab,
                           n_heads=heads, head_dim=256, pad_token_id=2, compressed_vocab_size=cvs)
        hs = EngramHasher(cfg, torch.randint(0, cvs, (cvs + 50,), generator=g))
        win = torch.randint(0, cvs, (p["t"], n), generator=g)
        win[torch.rand(p["t"], n, generator=g) < 0.1] = -1  # dead tokens
        pos = torch.randint(0, 8, (p["t"],), generator=g)
        tabs = hs._tables(torch.device(device))
        return {"args": [win.to(device), pos.to(device), *tabs[1:], hs.pad_class], "hasher": hs}
    raise KeyError(op)


def gemm_rows(m: int, k: int, g: torch.Generator, special: bool, inf: bool = False) -> torch.Tensor:
    """bf16 [m, k] activations: per-row scales 1e-3..1e2; with `special` (needs m >= 5) an all-zero row,
    a large-dynamic-range row (elements spread over 1e-5..1e3: e4m3 subnormals next to 448 in one
    group), a 1e4 row, a row with one NaN; with `inf` a row with one inf (GPU only: the interpreter
    decodes the e4m3 NaN byte as 480, so inf * 0 rows come out inf there instead of NaN)."""
    x = torch.randn(m, k, generator=g) * torch.pow(10.0, torch.rand(m, 1, generator=g) * 5 - 3)
    if special and m >= 5:
        x[0] = 0
        x[1] = torch.randn(k, generator=g) * torch.pow(10.0, torch.rand(k, generator=g) * 8 - 5)
        x[2] *= 1e4
        x[3, k // 3] = float("nan")
    if inf and m >= 6:
        x[5, 1] = float("inf")
    return x.bfloat16()


def gemm_slack(x: torch.Tensor, w_dq: torch.Tensor) -> torch.Tensor:
    """fp64 [..., N] absolute slack of the fp8 GEMM comparison: 2^-8 x sum_k |x_dq[k] w_dq[n, k]|
    (x_dq = MXFP8 round trip of x). Why: the twin adds each 32-wide block partial's products in K order; the
    tensor core keeps about 13-14 bits of the aligned 32-term sum (DeepSeek-V3 report: "around 14
    bits" for Hopper FP8 MMA), so each partial may be off by up to 32 x 2^-13 of its largest term,
    <= 2^-8 of the block's sum of |products| (in practice ~2^-14 of it). The scale products and the
    fp32 adds in K order are the twin's own (their rounding differences are ~2^-24 per add). The
    caller adds 2^-7 |want| for the final bf16 rounding of both sides (half an ulp each). Rows with
    NaN/inf give NaN slack; those positions are compared as non-finite."""
    from sglang_dsv41.quant import mxfp8_qdq

    xd = mxfp8_qdq(x.reshape(-1, x.size(-1))).double().abs()
    mag = xd @ w_dq.double().abs().T
    return (mag * 2.0**-8 + 2.0**-126).reshape(*x.shape[:-1], w_dq.size(0))


def build_gemm(op: str, p: dict, seed: int, device: str) -> dict:
    """fp8_linear / fp4_linear inputs: x [m, k] (or [1, m, k] with `lead`), weights quantized from
    rows with magnitudes 1e-3..1e-1 (fp8: 32x32-tile UE8M0 scales, N may be ragged; fp4: per-row
    32-group scales, `int8` stores the packed weight as int8 like MXFP4Linear); "bound" = gemm_slack."""
    from sglang_dsv41.quant import dequant_fp8_weight, dequant_mxfp4, quant_fp8_weight, quant_mxfp4

    g = _g(seed)
    m, n, k = p["m"], p["n"], p["k"]
    x = gemm_rows(m, k, g, p.get("special", False), p.get("inf", False))
    wf = torch.randn(n, k, generator=g) * torch.pow(10.0, torch.rand(n, 1, generator=g) * 2 - 3)
    if op == "fp8_linear":
        w, ws = quant_fp8_weight(wf)
        wd = dequant_fp8_weight(w, ws)
    else:
        w, ws = quant_mxfp4(wf)
        wd = dequant_mxfp4(w, ws)
        if p.get("int8"):
            w = w.view(torch.int8)
    if p.get("lead"):
        x = x.unsqueeze(0)
    bound = gemm_slack(x.to(device), wd.to(device)).cpu()
    return {"args": [x.to(device), w.to(device), ws.to(device)], "bound": bound}


def exact_attention(case: dict) -> torch.Tensor:
    """fp64 softmax-with-sink over each row's valid keys (unpacked pools): the common oracle of the
    attention kernel and its twin, whose bf16 probabilities make both differ from it."""
    from sglang_dsv41.quant import kv_fp4_unpack, window_kv_unpack

    q, wp, ws, cp, cs, sink, sc = [a.cpu() if isinstance(a, torch.Tensor) else a for a in case["args"]]
    keys = [window_kv_unpack(wp).double()]
    idx = [ws]
    if cs is not None:
        keys.append(kv_fp4_unpack(cp).double())
        idx.append(torch.where(cs >= 0, cs + wp.size(0), -1))
    kv, idx = torch.cat(keys), torch.cat(idx, 1)
    out = torch.zeros(q.shape, dtype=torch.float64)
    for i in range(q.size(0)):
        v = idx[i][idx[i] >= 0]
        if v.numel():
            k = kv[v]
            s = (q[i].double() @ k.T) * sc
            m = torch.maximum(s.max(-1).values, sink.double())
            p = torch.exp(s - m[:, None])
            out[i] = (p @ k) / (p.sum(-1) + torch.exp(sink.double() - m))[:, None]
    return out


def run(op: str, fn, case: dict) -> torch.Tensor:
    args = list(case["args"])
    if "pool" in case:
        args[case["pool"]] = args[case["pool"]].clone()
        fn(*args)
        return args[case["pool"]]
    return fn(*args)


def case_id(op: str, params: dict, seed: int) -> str:
    return f"{op}-" + "-".join(f"{k}{v}" for k, v in params.items()) + f"-seed{seed}"


# ---------------------------------------------------------------------------------- index_scores, paged
# Appended cases for the fp8 index_scores kernel: keys in the runtime's paged layout (each row's
# positions in its own pages of 64 consecutive pool slots, pages shuffled), odd per-row visible lengths
# (-1 after them), NaN-poisoned pool padding (every row no visible position uses is 0xFF: NaN
# exponent bytes, page tails included), stage-2 queries (index_query_quant's output), int32 tables;
# `nan`: a NaN query element (that row scores NaN: the kernel's bf16 fallback) and a visible key with
# a NaN group scale (NaN in every row that sees it); `unaligned`: a pool whose rows are not 4-byte
# aligned (runs the previous bf16 kernel); `raw`: code bytes cycling through all 256 values in every
# byte position (checks the nibble -> e4m3 bit trick exhaustively, -0 codes included). Oracle: the
# twin, bitwise.
INDEX_PAGED = [dict(t=1, h=32, n=777), dict(t=7, h=32, n=2049, int32=True), dict(t=3, h=3, n=300, nan=True),
               dict(t=2, h=32, n=129, unaligned=True), dict(t=1, h=32, n=1), dict(t=64, h=32, n=4100),
               dict(t=2, h=32, n=300, raw=True)]
GRID += [("index_scores", dict(p, paged=True)) for p in INDEX_PAGED]
INTERP_GRID += [("index_scores", dict(t=1, h=32, n=777, paged=True)), ("index_scores", dict(t=3, h=3, n=300, nan=True, paged=True)),
                ("index_scores", dict(t=2, h=32, n=129, unaligned=True, paged=True)), ("index_scores", dict(t=2, h=32, n=300, raw=True, paged=True))]

_build_base = build


def build(op: str, p: dict, seed: int, device: str) -> dict:  # noqa: F811 - adds the paged index_scores cases
    if op != "index_scores" or not p.get("paged"):
        return _build_base(op, p, seed, device)
    from sglang_dsv41.quant import index_fp4_qdq

    g = _g(seed)
    t, h, n, page = p["t"], p["h"], p["n"], 64
    n_pages = -(-n // page)
    rows = (t * n_pages + 3) * page
    pool = index_fp4_pack(index_fp4_stage1(_rows(rows, 128, g, False)))
    pages = torch.randperm(rows // page, generator=g)[: t * n_pages].view(t, n_pages)
    table = (pages[:, :, None] * page + torch.arange(page)).view(t, -1)[:, :n]
    visible = torch.randint(0, n + 1, (t,), generator=g)
    visible[0] = n
    table = torch.where(torch.arange(n) < visible[:, None], table, -1)
    if p.get("raw"):  # every code byte 0..255 in each byte position (the packer never writes -0 codes)
        pool[:, :64] = ((torch.arange(pool.size(0))[:, None] + 97 * torch.arange(64)) % 256).to(torch.uint8)
    q = index_fp4_qdq((torch.randn(t, h, 128, generator=g) * torch.pow(10.0, torch.rand(t, h, 1, generator=g) * 3 - 1)).bfloat16())
    if p.get("nan"):
        q[-1, 0, 5] = float("nan")
        pool[table[0, 0], 64 + 1] = 255  # group 1's exponent byte of a key row 0 sees
    used = torch.zeros(pool.size(0), dtype=torch.bool)
    used[table[table >= 0]] = True
    pool[~used] = 0xFF
    pool = pool.to(device)
    if p.get("unaligned"):  # row stride 69 at byte offset 1, built on the device (.to() would compact it)
        buf = torch.full((pool.size(0), 69), 0xFF, dtype=torch.uint8, device=device)
        buf[:, 1:] = pool
        pool = buf[:, 1:]
    if p.get("int32"):
        table = table.int()
    w = torch.randn(t, h, generator=g).bfloat16()
    return {"args": [q.to(device), w.to(device), pool, table.to(device)]}


# top-k (split kernel): decode / prefill shapes, corner rows (all NaN, all -inf, fewer than k rankable,
# one value everywhere, a far outlier, all negative), fp32 rows, rows of no multiple of the chunk
GRID += [("topk_select", p) for p in (
    dict(t=1, n=65536, k=512), dict(t=64, n=65536, k=512, ties=True), dict(t=7, n=70001, k=512, corner=True),
    dict(t=6, n=65536, k=2048, corner=True, fp32=True), dict(t=1024, n=4096, k=512, ties=True),
    dict(t=9, n=300001, k=512, corner=True))]
INTERP_GRID += [("topk_select", p) for p in (
    dict(t=6, n=3001, k=256, corner=True), dict(t=6, n=2000, k=100, corner=True, fp32=True),
    dict(t=3, n=5000, k=300, ties=True))]


# ---------------------------------------------------------------------------------- index_scores oracle
def exact_index_scores(case: dict) -> torch.Tensor:
    """fp64 [T, n]: the head sum of each score computed exactly (NaN / -inf where the twin has them).

    Terms are what both sides round identically: bf16(bf16(relu(q_h . k)) * w_h) (the FP4-grid dot
    is exact in fp32). Only the fp32 order of the 32-term head sum is left to the implementation
    (torch's reduction on CPU and on CUDA, the kernel's register tree), so the oracle of a
    mismatch is this exact sum: see kernel_compare.assert_index_scores."""
    from sglang_dsv41.quant import index_fp4_unpack

    q, w, pool, table = [a.cpu() for a in case["args"][:4]]
    keys = index_fp4_unpack(pool[table.clamp_min(0)]).double()  # [T, n, di]
    logits = torch.einsum("thd,tnd->thn", q.double(), keys).float().bfloat16()
    terms = (torch.relu(logits) * w.unsqueeze(-1)).double()
    return terms.sum(1).masked_fill(table < 0, float("-inf"))

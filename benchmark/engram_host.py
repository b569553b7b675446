"""Engram host table vs tables in device memory, side by side in one process (issue 12).

    python benchmark/engram_host.py --preset release --engram-vocab 1000000 --long 8x1024 --short 64x64 \
        --decode 3 --greedy-preset small --greedy 64x64 [--layouts shared,per_rank] [--budget-s 150] \
        [--results-dir benchmark/results]

The model is the preset with its Engram tables scaled: `--engram-vocab V` gives each table
(N-1) * heads prime-sized segments just above V (the released rule, spec model 5.2.3), so about
24 V rows of 264 B per Engram layer. Weights are random (`tiny.random_tensors`, fast generator);
table rows are random normal rows quantized like the checkpoint's, generated on the device tile by
tile. "off" keeps the tables as model parameters on the device; "shared" / "per_rank" copy the same
bytes into an `EngramHostTables` (engram_host/), swap the modules and attach the prefetch.

Checks and timings, in order (each part is skipped once --budget-s has passed; the report is
rewritten after every part):
  1. gather alone, 8192 tokens x 24 rows per Engram layer (row ids from the model's hasher on
     random tokens): every kernel variant's rows == the torch twin's, bit for bit; time (CUDA
     events, median, L2 flushed between calls) and GB/s of row bytes (264 B per row). Variants:
     the HBM table; the pinned host table with byte-wide loads (the kernel before 16-byte loads),
     with 16-byte loads (default and a sweep of rows per program x warps), SGLang 0.5.23's own
     gather with sorted ids (its module file, if .whl/sglang_0_5_23_engram_gather.py exists); the
     copy engine moving the same number of contiguous bytes host -> device (PCIe ceiling)
  2. CUDA graph: hash + every Engram layer (prefetch on a side stream into the staging buffers)
     captured for a decode batch, replayed on new tokens == eager, bit for bit
  3. KV capacity: device memory free with the tables on the device vs after freeing them (back to
     back), in KV tokens (runtime.KVPools bytes per token slot), vs table bytes / bytes per token;
     the device tables are then restored from a host table
  4. greedy tokens on a second model (--greedy-preset, its own Engram tables, every placement):
     --greedy PxN = P prompts of N tokens, N new tokens each, tokens == "off"; where the driver
     has CUDA-graph decode (`Driver(graphs=True)`), every placement again with graphs, tokens ==
     eager "off"
  5. end to end on the standalone driver, per placement ("off" and the first layout together; later
     layouts only within --budget-s): prefill of the --long prompts (tok/s), decode steps (eager, or
     CUDA graphs with --graph-decode) at batch len(long) and at batch len(short) (s/step), greedy
     tokens vs "off"
Prints one markdown report and writes it to <results-dir>/<date>-<device>-engram-host-run.md.
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import gc
import shlex
import sys
import tempfile
import time
import traceback
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT / "python"), str(ROOT / "sgl-kernel")]

from dsv41_kernels import ops  # noqa: E402
from sglang_dsv41.config import ModelConfig  # noqa: E402
from sglang_dsv41.engram_host import EngramHostTables, EngramPrefetch, place_host_tables, table_tensor_names  # noqa: E402
from sglang_dsv41.layers.transformer import DeepseekV41  # noqa: E402
from sglang_dsv41.runtime.driver import Driver, random_prompts  # noqa: E402
from sglang_dsv41.numerics import NumericsPolicy, apply_numerics  # noqa: E402
from sglang_dsv41.runtime.kernels import kernel_table  # noqa: E402
from sglang_dsv41.runtime.pools import KVPools  # noqa: E402
from sglang_dsv41.tiny import PRESETS, hf_config, quant_fp8_weight_rows, random_tensors  # noqa: E402
from sglang_dsv41.tokenizer.tiny_tokenizer import save_tiny_tokenizer  # noqa: E402
from sglang_dsv41.tokenizer.token_map import build_compressed_token_map, token_map_tensor  # noqa: E402

TILE_ROWS = 1 << 20


def _sync(dev):
    if dev.type == "cuda":
        torch.cuda.synchronize()


def timed(fn, dev, reps: int = 10) -> float:
    """Median seconds of fn() over reps (after one warm call)."""
    fn()
    _sync(dev)
    ts = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        _sync(dev)
        ts.append(time.perf_counter() - t0)
    return sorted(ts)[len(ts) // 2]


def build(preset: str, engram_vocab: int, workdir: Path, dev: torch.device) -> DeepseekV41:
    """The preset's model with Engram tables for `engram_vocab`, every tensor on `dev`."""
    p = PRESETS[preset]
    save_tiny_tokenizer(workdir, vocab_size=p.tokenizer_vocab)
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(workdir / "tokenizer.json"))
    _, n_classes = build_compressed_token_map(tok)
    vocab = -(-tok.get_vocab_size(with_added_tokens=True) // 64) * 64
    small = ModelConfig.from_hf(hf_config(p, vocab, n_classes))
    cfg = ModelConfig.from_hf(hf_config(dataclasses.replace(p, engram_vocab=engram_vocab), vocab, n_classes))
    tensors = random_tensors(small, 0, str(dev), fast=True)  # same shapes except the Engram tables
    e = cfg.engram
    for name, (k, part) in table_tensor_names(cfg).items():
        width = e.head_dim if part == "weight" else e.head_dim // 32
        tensors[name] = torch.empty(e.num_embeddings[k], width, dtype=tensors[name].dtype, device=dev)
    for k, lid in enumerate(e.layer_ids):
        w, s = tensors[f"layers.{lid}.engram.embed.weight"], tensors[f"layers.{lid}.engram.embed.scale"]
        for a in range(0, w.size(0), TILE_ROWS):
            b = min(a + TILE_ROWS, w.size(0))
            g = torch.Generator(device=dev).manual_seed(1_000_003 * k + a)
            q, sc = quant_fp8_weight_rows(torch.randn(b - a, e.head_dim, generator=g, device=dev))
            w[a:b].copy_(q)
            s[a:b].copy_(sc)
    with torch.device("meta"):
        model = DeepseekV41(cfg)
    model.load_state_dict(tensors, strict=True, assign=True)
    del tensors
    for prm in model.parameters():
        prm.requires_grad_(False)
    model.set_token_map(token_map_tensor(str(workdir), device=dev))
    return model.eval()


def host_tables(model: DeepseekV41, layout: str, dev: torch.device) -> EngramHostTables:
    tables = EngramHostTables(model.cfg, layout, device=dev)
    for k, lid in enumerate(model.cfg.engram.layer_ids):
        emb = model.layers[lid].engram.embed
        for a in range(0, emb.weight.size(0), TILE_ROWS):
            tables.write_rows(k, "weight", emb.weight[a : a + TILE_ROWS], a)
            tables.write_rows(k, "scale", emb.scale[a : a + TILE_ROWS], a)
    tables.finish_load()
    return tables


class Placement:
    """Switches one model between its device tables ("off") and host tables (+ prefetch)."""

    def __init__(self, model: DeepseekV41, table, staging_tokens: int, dev: torch.device):
        self.model, self.table, self.dev, self.staging = model, table, dev, staging_tokens
        self.device_tables = {lid: model.layers[lid].engram.embed for lid in model.cfg.engram.layer_ids}
        self.prefetch: EngramPrefetch | None = None
        apply_numerics(model, NumericsPolicy.kernels(table))  # once: the device tables' slots; host tables get theirs when placed

    def off(self) -> None:
        if self.prefetch is not None:
            self.prefetch.detach(self.model)
            self.prefetch = None
        for lid, mod in self.device_tables.items():
            self.model.layers[lid].engram.embed = mod

    def on(self, tables: EngramHostTables) -> None:
        self.off()
        hosts = place_host_tables(self.model, tables, self.table)
        self.prefetch = EngramPrefetch(hosts, self.staging, self.dev).attach(self.model)


def bench_s(fn, dev) -> float:
    """Median seconds of fn(): CUDA events with the L2 flushed before each call (triton do_bench) on CUDA."""
    if dev.type != "cuda":
        return timed(fn, dev)
    from triton.testing import do_bench

    return do_bench(fn, warmup=20, rep=100, return_mode="median") / 1e3


def load_sglang_gather():
    """SGLang 0.5.23's own gather module file (read, not imported from an SGLang install), if present."""
    from kernels import load_sglang_gather as load  # benchmark/kernels.py (this script's folder is on sys.path)

    return load()


def gather_check(model, tables_by_layout, dev, lines, configs, n_tokens=8192):
    from dsv41_kernels.engram_triton import HOST_GATHER_CONFIG, gather_sorted

    e = model.cfg.engram
    ids_tok = torch.randint(3, model.cfg.vocab_size - 1, (n_tokens,), generator=torch.Generator().manual_seed(5)).to(dev)
    rows = model.hasher.hash_sequence(ids_tok)  # [T, L, cols]
    sg = load_sglang_gather() if dev.type == "cuda" else None
    lines += ["| table | layer | kernel | rows per program, warps | bitwise == torch twin | ms | GB/s of row bytes |",
              "|---|---|---|---|---|---|---|"]
    best: dict[str, float] = {}
    for k, lid in enumerate(e.layer_ids):
        emb = model.layers[lid].engram.embed
        r = rows[:, k].contiguous()
        flat, n, hd = r.view(-1), r.numel(), e.head_dim
        nbytes = n * (hd + hd // 32)
        want = ops.engram_gather.torch(emb.weight, emb.scale, r).view(n, hd)

        def row(table, kernel, cfg, same, t):
            lines.append(f"| {table} | {lid} | {kernel} | {cfg} | {same} | {t * 1e3:.3f} | {nbytes / t / 1e9:.1f} |")

        def eq(got):
            return torch.equal(got.reshape(n, hd).view(torch.int16), want.view(torch.int16))

        got = ops.engram_gather(emb.weight, emb.scale, r)
        row("device (HBM)", "ours", "default", eq(got), bench_s(lambda: ops.engram_gather(emb.weight, emb.scale, r), dev))
        for layout, tables in tables_by_layout.items():
            w, s = tables.weight(k), tables.scale(k)
            if dev.type != "cuda":
                row(f"host {layout}", "torch twin (CPU)", "-", eq(ops.engram_gather(w, s, r)),
                    bench_s(lambda: ops.engram_gather(w, s, r), dev))
                continue
            w8, s8 = w.view(torch.uint8), s.view(torch.uint8)
            got = ops.engram_gather(w, s, r)  # the model's call: the op table's kernel, default config
            t = bench_s(lambda: ops.engram_gather(w, s, r), dev)
            row(f"host {layout}", "ours, 16-byte loads (default)", str(HOST_GATHER_CONFIG), eq(got), t)
            best[layout] = max(best.get(layout, 0.0), nbytes / t / 1e9)
            variants = [("before: byte-wide loads", (2, 2), False)]
            if k == 0:
                variants += [("ours, 16-byte loads", c, None) for c in configs if c != HOST_GATHER_CONFIG]
            for label, (br, nw), wide in variants:
                out = torch.full((n, hd), float("nan"), dtype=torch.bfloat16, device=dev)
                gather_sorted(w8, s8, flat, out, br, nw, wide)
                same = eq(out)
                t = bench_s(lambda: gather_sorted(w8, s8, flat, out, br, nw, wide), dev)
                row(f"host {layout}", label, str((br, nw)), same, t)
            if sg is not None:
                out = torch.full((n, hd), float("nan"), dtype=torch.bfloat16, device=dev)
                sg.engram_gather(w.data_ptr(), s.data_ptr(), flat, out, hd, 32, sort_ids=True)
                same = eq(out)
                t = bench_s(lambda: sg.engram_gather(w.data_ptr(), s.data_ptr(), flat, out, hd, 32, sort_ids=True), dev)
                row(f"host {layout}", "SGLang 0.5.23, sorted ids", "(1, 4)", same, t)
            if k == 0:  # PCIe ceiling: the copy engine moving the same bytes, contiguous, host -> device
                src = tables.region.tensor[:nbytes]
                dst = torch.empty(nbytes, dtype=torch.uint8, device=dev)
                t = bench_s(lambda: dst.copy_(src, non_blocking=True), dev)
                row(f"host {layout}", "copy engine, contiguous bytes (ceiling)", "-", "-", t)
                out = torch.empty(n, hd, dtype=torch.bfloat16, device=dev)
                seq = torch.arange(n, device=dev)
                t = bench_s(lambda: gather_sorted(w8, s8, seq, out), dev)
                row(f"host {layout}", "ours, rows 0..n-1 (consecutive rows)", str(HOST_GATHER_CONFIG), "-", t)
    return best


def graph_check(model, dev, lines, batch=64):
    """hash + every Engram layer for one decode batch, captured once, replayed on new tokens == eager."""
    e, hasher = model.cfg.engram, model.hasher
    width = e.max_ngram_size - 1
    hc, hidden = model.cfg.hc.hc_mult, model.cfg.hidden_size
    g = torch.Generator().manual_seed(9)
    ids = torch.randint(3, 1000, (batch,), generator=g).to(dev)
    hist = torch.randint(3, 1000, (batch, width), generator=g).to(dev)
    start = torch.full((batch,), 500, dtype=torch.long, device=dev)
    lens = torch.ones(batch, dtype=torch.long, device=dev)
    streams = torch.randn(batch, hc, hidden, generator=g).to(torch.bfloat16).to(dev)

    def step():
        rows = hasher.hash_packed(ids, lens, start, hist)
        out = streams
        for k, lid in enumerate(e.layer_ids):
            out = model.layers[lid].engram(out, rows[:, k])
        return out

    for _ in range(2):
        step()  # JIT + allocator warm-up
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        static_out = step()
    results = []
    for seed in (1, 2, 3):
        gg = torch.Generator().manual_seed(seed)
        ids.copy_(torch.randint(3, 1000, (batch,), generator=gg))
        hist.copy_(torch.randint(3, 1000, (batch, width), generator=gg))
        graph.replay()
        torch.cuda.synchronize()
        results.append(torch.equal(static_out.view(torch.int16), step().view(torch.int16)))
    lines.append(f"- CUDA graph (hash + {len(e.layer_ids)} Engram layers with prefetch, batch {batch}): replay == eager "
                 f"bit for bit on 3 new token sets: {results}")


def kv_capacity(model, place, tables, table_bytes, dev, body):
    """Device memory free with the tables on the device, then with them freed (two readings back to
    back: they differ by the tables only), in KV token slots; then the device tables are restored
    from a host table (every layout holds all rows at TP 1) for the parts after this one."""
    e = model.cfg.engram
    gc.collect()
    torch.cuda.empty_cache()
    free_off = torch.cuda.mem_get_info(dev)[0]
    kept = {}
    for lid in e.layer_ids:  # free the device tables: what the host table gives to the KV cache
        mod = place.device_tables[lid]
        kept[lid] = (mod.weight.shape, mod.weight.dtype, mod.scale.shape, mod.scale.dtype)
        mod.weight = None
        mod.scale = None
    gc.collect()
    torch.cuda.empty_cache()
    free_on = torch.cuda.mem_get_info(dev)[0]
    src = next(iter(tables.values()))
    for k, lid in enumerate(e.layer_ids):
        ws, wd, ss, sd = kept[lid]
        w, sc = torch.empty(ws, dtype=wd, device=dev), torch.empty(ss, dtype=sd, device=dev)
        w.view(torch.uint8).copy_(src.weight(k).view(torch.uint8))
        sc.view(torch.uint8).copy_(src.scale(k).view(torch.uint8))
        place.device_tables[lid].weight = torch.nn.Parameter(w, requires_grad=False)
        place.device_tables[lid].scale = torch.nn.Parameter(sc, requires_grad=False)
    bpt = KVPools.bytes_per_token(model.cfg)["total"]
    gain, want = (free_on - free_off) // bpt, table_bytes // bpt
    body += [f"| tables | free device bytes | KV tokens at {bpt:g} B/token |", "|---|---|---|",
             f"| on the device | {free_off} | {int(free_off // bpt)} |", f"| in host memory | {free_on} | {int(free_on // bpt)} |",
             "", f"Gain {int(gain)} tokens (+{100 * (free_on - free_off) / max(free_off, 1):.1f}% free memory); "
             f"table bytes / bytes per token = {int(want)}; gain / expected = {gain / want:.4f}."]


def driver_has_graphs() -> bool:
    import inspect

    return "graphs" in inspect.signature(Driver.__init__).parameters


def e2e(drv_args, model, long_p, short_p, decode, chunk, graphs=False):
    drv = Driver(model, *drv_args, **({"graphs": True} if graphs else {}))
    new_l, st_l = drv.generate(long_p, decode, chunk)
    new_s, st_s = drv.generate(short_p, decode, chunk)
    del drv
    return {"prefill_tok_s": st_l["prefill_tok_s"], "prefill_s": st_l["prefill_s"],
            "decode_long_s": st_l["decode_s"] / max(decode - 1, 1), "decode_short_s": st_s["decode_s"] / max(decode - 1, 1),
            "tokens": new_l + new_s}


def placements(model, table, staging, dev, layouts, lines):
    """A Placement of `model` and its host tables per layout (filled from the device tables)."""
    place = Placement(model, table, staging, dev)
    place.off()
    tables = {}
    for layout in layouts:
        t1 = time.perf_counter()
        tables[layout] = host_tables(model, layout, dev)
        cov = tables[layout].coverage
        lines.append(f"- host table `{layout}`: {tables[layout].mapped_bytes} B mapped, filled + pinned in "
                     f"{time.perf_counter() - t1:.1f} s, huge pages {cov.huge_bytes} B ({100 * cov.fraction:.1f}%)")
    return place, tables


def greedy_check(a, dev, table, lines):
    """--greedy PxN on the --greedy-preset model: every placement's tokens == off (and, where the driver
    has CUDA-graph decode, graph-captured decode == eager for every placement)."""
    gp, gn = (int(x) for x in a.greedy.split("x"))
    model = build(a.greedy_preset, PRESETS[a.greedy_preset].engram_vocab, Path(tempfile.mkdtemp()), dev)
    e = model.cfg.engram
    tb = sum(r * (e.head_dim + e.head_dim // 32) for r in e.num_embeddings)
    lines.append(f"Model: preset `{a.greedy_preset}` ({model.cfg.num_layers} layers, hidden {model.cfg.hidden_size}), "
                 f"Engram rows {list(e.num_embeddings)} ({tb} B); {gp} prompts of {gn} random tokens, {gn} greedy tokens each.")
    place, tables = placements(model, table, max(a.chunk, gp), dev, a.layouts.split(","), lines)
    prompts = random_prompts(model.cfg.vocab_size - 1, gp, gn, 3)
    page = 64
    args = (gp * (2 * gn + page), gp, page, dev, False, table)
    graphs = [False, True] if (driver_has_graphs() and dev.type == "cuda") else [False]
    lines += ["", "| placement | decode | s/step | new tokens == off, same decode | == off, eager |", "|---|---|---|---|---|"]
    base: dict[bool, list] = {}

    def agree(new, ref):
        diff = sum(x != y for p, q in zip(new, ref) for x, y in zip(p, q))
        return f"{diff == 0}" + ("" if diff == 0 else f" ({diff} of {gp * gn} differ)")

    for label in ["off", *tables]:
        place.off() if label == "off" else place.on(tables[label])
        for g in graphs:
            drv = Driver(model, *args, **({"graphs": True} if g else {}))
            new, st = drv.generate(prompts, gn, a.chunk)
            del drv
            base.setdefault(g, new)
            lines.append(f"| {label} | {'CUDA graph' if g else 'eager'} | {st['decode_s'] / max(gn - 1, 1):.4f} | "
                         f"{agree(new, base[g])} | {agree(new, base[False])} |")
    place.off()
    if not driver_has_graphs():
        lines.append("\nGraph-captured decode: not measured (the driver has no CUDA-graph decode in this tree).")
    del model, place, tables


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--preset", default="release" if "release" in PRESETS else "bench")
    ap.add_argument("--engram-vocab", type=int, default=1_000_000)
    ap.add_argument("--long", default="8x1024", help="PxL: P prompts of L tokens: prefill tok/s, decode at batch P")
    ap.add_argument("--short", default="64x64", help="PxL: decode at batch P")
    ap.add_argument("--decode", type=int, default=3)
    ap.add_argument("--chunk", type=int, default=8192)
    ap.add_argument("--layouts", default="shared,per_rank")
    ap.add_argument("--greedy-preset", default="small")
    ap.add_argument("--greedy", default="64x64", help="PxN: P prompts of N tokens, N greedy tokens each")
    ap.add_argument("--gather-configs", default="4x2,8x4,16x8,32x8,64x8", help="host gather sweep: rows x warps")
    ap.add_argument("--graph-decode", action="store_true", help="end to end: CUDA-graph decode (Driver(graphs=True))")
    ap.add_argument("--skip", default="", help="comma list of parts to skip: gather,graph,kv,greedy,e2e")
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--results-dir", default=str(ROOT / "benchmark" / "results"))
    ap.add_argument("--budget-s", type=float, default=1e9, help="start no further part after this many seconds")
    a = ap.parse_args()
    dev = torch.device(a.device)
    name = torch.cuda.get_device_name(dev) if dev.type == "cuda" else "cpu"
    skip = set(filter(None, a.skip.split(",")))
    lines: list[str] = []
    t0 = time.perf_counter()
    over = lambda: time.perf_counter() - t0 > a.budget_s  # noqa: E731
    model = build(a.preset, a.engram_vocab, Path(tempfile.mkdtemp()), dev)
    e = model.cfg.engram
    table_bytes = sum(r * (e.head_dim + e.head_dim // 32) for r in e.num_embeddings)
    thp = {f: Path(f"/sys/kernel/mm/transparent_hugepage/{f}").read_text().strip()
           for f in ("enabled", "shmem_enabled") if Path(f"/sys/kernel/mm/transparent_hugepage/{f}").exists()}
    lines.append(f"Model: preset `{a.preset}` ({model.cfg.num_layers} layers, hidden {model.cfg.hidden_size}), Engram layers "
                 f"{list(e.layer_ids)}, engram_vocab_size {a.engram_vocab}: rows {list(e.num_embeddings)}, "
                 f"{table_bytes} B = {table_bytes / 2**30:.2f} GiB of rows + scales (the release: 188.83 GiB). "
                 f"Built in {time.perf_counter() - t0:.0f} s. Transparent huge pages: {thp or 'not available'}.")
    table = kernel_table(dev)
    (nl, ll), (ns, ls) = (tuple(int(x) for x in s.split("x")) for s in (a.long, a.short))
    place, tables = placements(model, table, max(a.chunk, ns, nl), dev, a.layouts.split(","), lines)
    sections = []
    day = datetime.date.today().isoformat()
    out = Path(a.results_dir) / f"{day}-{'h200' if 'H200' in name else dev.type}-engram-host-run.md"
    out.parent.mkdir(parents=True, exist_ok=True)
    cmd = "python " + " ".join(shlex.quote(x) for x in sys.argv)
    head = [f"# Engram host table vs device tables ({day})", "",
            f"Device: {name}, torch {torch.__version__}" + (f", triton {__import__('triton').__version__}" if dev.type == "cuda" else "")
            + f". Command: `{cmd}`", ""] + lines

    def flush() -> str:
        text = "\n".join(head + sum(([f"\n## {title}\n", *body] for title, body in sections), [])) + "\n"
        out.write_text(text)
        return text

    def part(key, title, fn):
        if key in skip:
            return None
        if over():
            sections.append((f"{title}: not run (past --budget-s {a.budget_s:.0f})", []))
            return None
        body: list[str] = []
        t1 = time.perf_counter()
        try:
            res = fn(body)
            sections.append((f"{title} ({time.perf_counter() - t1:.0f} s)", body))
        except Exception:
            res = None
            sections.append((f"{title}: FAILED", body + ["```", traceback.format_exc(), "```"]))
        print(flush(), flush=True)
        return res

    configs = [tuple(int(x) for x in c.split("x")) for c in a.gather_configs.split(",") if c]
    part("gather", "Gather alone: 8192 tokens x 24 rows per Engram layer (row ids from the hasher)",
         lambda body: gather_check(model, tables, dev, body, configs))
    if dev.type == "cuda":
        def graphs(body):
            for layout in tables:
                place.on(tables[layout])
                body.append(f"layout `{layout}`:")
                graph_check(model, dev, body)
            place.off()
        part("graph", "CUDA graph with the host table", graphs)

    if dev.type == "cuda":
        part("kv", "KV capacity (device memory free after weights, in KV token slots)",
             lambda body: kv_capacity(model, place, tables, table_bytes, dev, body))
    part("greedy", f"Greedy tokens on vs off, preset `{a.greedy_preset}`", lambda body: greedy_check(a, dev, table, body))

    def end_to_end(body):
        rows = {}
        long_p = random_prompts(model.cfg.vocab_size - 1, nl, ll, 0)
        short_p = random_prompts(model.cfg.vocab_size - 1, ns, ls, 1)
        page = 256
        drv_args = (max(nl * (ll + a.decode + page), ns * (ls + a.decode + page), 2 * (300 + 2 + page)), max(nl, ns, 2), page, dev,
                    False, table)
        warm = random_prompts(model.cfg.vocab_size - 1, 2, 300, 2)
        use_graphs = a.graph_decode and dev.type == "cuda" and driver_has_graphs()
        for n_run, label in enumerate(["off", *tables]):
            if n_run > 1 and over():  # "off" and the first layout always run together
                body.append(f"- `{label}`: not run (past --budget-s {a.budget_s:.0f})")
                continue
            place.off() if label == "off" else place.on(tables[label])
            Driver(model, *drv_args).generate(warm, 2, a.chunk)  # JIT of this placement's kernels
            if n_run == 0:  # untimed: the first use of the run's prefill / decode shapes compiles kernels
                e2e(drv_args, model, long_p[:1], short_p, 3, a.chunk, use_graphs)
            rows[label] = e2e(drv_args, model, long_p, short_p, a.decode, a.chunk, use_graphs)
            print(label, {k: v for k, v in rows[label].items() if k != "tokens"}, f"{time.perf_counter() - t0:.0f}s", flush=True)
        place.off()
        body += [f"Prompts: {nl} x {ll} (prefill, then decode at batch {nl}) and {ns} x {ls} (decode at batch {ns}); "
                 f"{a.decode} greedy tokens each ({a.decode - 1} decode steps timed); chunk {a.chunk}; "
                 f"{'CUDA-graph' if use_graphs else 'eager'} decode.", "",
                 f"| placement | prefill tok/s | vs off | decode s/step batch {nl} | vs off | decode s/step batch {ns} | vs off | "
                 "greedy tokens == off |", "|---|---|---|---|---|---|---|---|"]
        base = rows.get("off")
        for label, r in rows.items():
            rel = (lambda key, inv=False: f"{(base[key] / r[key]) if inv else (r[key] / base[key]):.3f}x") if base else (lambda *_: "-")
            body.append(f"| {label} | {r['prefill_tok_s']:.0f} | {rel('prefill_tok_s')} | {r['decode_long_s']:.3f} | "
                        f"{rel('decode_long_s', True)} | {r['decode_short_s']:.3f} | {rel('decode_short_s', True)} | "
                        f"{(r['tokens'] == base['tokens']) if base else '-'} |")
    part("e2e", f"End to end on the driver, preset `{a.preset}` (speed: off time / on time, >= 1 is faster)", end_to_end)
    del model, place, tables
    print(flush(), flush=True)


if __name__ == "__main__":
    main()

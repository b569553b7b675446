"""Engram host table vs tables in device memory, side by side in one process (issue 12).

    python benchmark/engram_host.py --preset release --engram-vocab 2500000 --long 8x8192 --short 64x128 \
        --decode 4 [--layouts shared,per_rank] [--results-dir benchmark/results]

The model is the preset with its Engram tables scaled: `--engram-vocab V` gives each table
(N-1) * heads prime-sized segments just above V (the released rule, spec model 5.2.3), so about
24 V rows of 264 B per Engram layer. Weights are random (`tiny.random_tensors`, fast generator);
table rows are random normal rows quantized like the checkpoint's, generated on the device tile by
tile. "off" keeps the tables as model parameters on the device; "shared" / "per_rank" copy the same
bytes into an `EngramHostTables` (engram_host/), swap the modules and attach the prefetch.

Checks and timings, in order:
  1. host gather == device gather, bit for bit, for 8192 tokens x 24 rows per Engram layer (row ids
     from the model's hasher on random tokens), and the host gather's time and GB/s of row bytes
     (264 B per row) for a few launch configurations; the device gather for comparison
  2. CUDA graph: hash + every Engram layer (prefetch on a side stream into the staging buffers)
     captured for a decode batch, replayed on new tokens == eager, bit for bit
  3. end to end on the standalone driver, per placement: prefill of --long prompts (tok/s), decode
     steps at batch len(long) and at batch len(short) (s/step), greedy tokens vs "off"
  4. KV capacity: device memory free with the tables on the device vs after freeing them, in KV
     tokens (runtime.KVPools bytes per token slot), vs table bytes / bytes per token
Prints one markdown report and writes it to <results-dir>/<date>-<device>-engram-host.md.
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
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
from sglang_dsv41.runtime.kernels import kernel_table, use_kernels  # noqa: E402
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
        use_kernels(model, table)  # once: the device tables' slots; host tables get theirs when placed

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


def gather_check(model, tables_by_layout, dev, lines, n_tokens=8192):
    e = model.cfg.engram
    ids_tok = torch.randint(3, model.cfg.vocab_size - 1, (n_tokens,), generator=torch.Generator().manual_seed(5)).to(dev)
    rows = model.hasher.hash_sequence(ids_tok)  # [T, L, cols]
    lines += ["| table | layer | rows | config (block_r, warps) | bitwise == device gather | ms | GB/s of row bytes |",
              "|---|---|---|---|---|---|---|"]
    for k, lid in enumerate(e.layer_ids):
        emb = model.layers[lid].engram.embed
        r = rows[:, k].contiguous()
        nbytes = r.numel() * (e.head_dim + e.head_dim // 32)
        want = ops.engram_gather(emb.weight, emb.scale, r)
        t = timed(lambda: ops.engram_gather(emb.weight, emb.scale, r), dev)
        lines.append(f"| device (HBM) | {lid} | {r.numel()} | default | reference | {t * 1e3:.3f} | {nbytes / t / 1e9:.1f} |")
        for layout, tables in tables_by_layout.items():
            w, s = tables.weight(k), tables.scale(k)
            if dev.type == "cuda":
                configs = [(0, 0), (1, 1), (2, 4), (4, 4), (8, 8)]
                impl = ops.engram_gather.triton
            else:
                configs, impl = [None], ops.engram_gather
            for cfg in configs:
                call = (lambda: impl(w, s, r)) if cfg is None else (lambda c=cfg: impl(w, s, r, block_r=c[0], num_warps=c[1]))
                got = call()
                same = torch.equal(got.view(torch.int16), want.view(torch.int16))
                t = timed(call, dev)
                label = "default" if cfg in (None, (0, 0)) else str(cfg)
                lines.append(f"| host {layout} | {lid} | {r.numel()} | {label} | {same} | {t * 1e3:.3f} | {nbytes / t / 1e9:.1f} |")
    return rows


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


def e2e(drv_args, model, long_p, short_p, decode, chunk):
    drv = Driver(model, *drv_args)
    new_l, st_l = drv.generate(long_p, decode, chunk)
    new_s, st_s = drv.generate(short_p, decode, chunk)
    del drv
    return {"prefill_tok_s": st_l["prefill_tok_s"], "prefill_s": st_l["prefill_s"],
            "decode_long_s": st_l["decode_s"] / max(decode - 1, 1), "decode_short_s": st_s["decode_s"] / max(decode - 1, 1),
            "tokens": new_l + new_s}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--preset", default="release" if "release" in PRESETS else "bench")
    ap.add_argument("--engram-vocab", type=int, default=2_500_000)
    ap.add_argument("--long", default="8x8192")
    ap.add_argument("--short", default="64x128")
    ap.add_argument("--decode", type=int, default=4)
    ap.add_argument("--chunk", type=int, default=8192)
    ap.add_argument("--layouts", default="shared,per_rank")
    ap.add_argument("--skip", default="", help="comma list of parts to skip: gather,graph,e2e")
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--results-dir", default=str(ROOT / "benchmark" / "results"))
    ap.add_argument("--budget-s", type=float, default=1e9, help="start no further end-to-end placement after this")
    a = ap.parse_args()
    dev = torch.device(a.device)
    name = torch.cuda.get_device_name(dev) if dev.type == "cuda" else "cpu"
    skip = set(filter(None, a.skip.split(",")))
    lines: list[str] = []
    t0 = time.perf_counter()
    model = build(a.preset, a.engram_vocab, Path(tempfile.mkdtemp()), dev)
    e = model.cfg.engram
    table_bytes = sum(r * (e.head_dim + e.head_dim // 32) for r in e.num_embeddings)
    lines.append(f"Model: preset `{a.preset}` ({model.cfg.num_layers} layers, hidden {model.cfg.hidden_size}), Engram layers "
                 f"{list(e.layer_ids)}, engram_vocab_size {a.engram_vocab}: rows {list(e.num_embeddings)}, "
                 f"{table_bytes} B = {table_bytes / 2**30:.2f} GiB of rows + scales (the release: 188.83 GiB). "
                 f"Built in {time.perf_counter() - t0:.0f} s.")
    table = kernel_table(dev)
    (nl, ll), (ns, ls) = (tuple(int(x) for x in s.split("x")) for s in (a.long, a.short))
    place = Placement(model, table, max(a.chunk, ns, nl), dev)
    place.off()
    if dev.type == "cuda":
        torch.cuda.empty_cache()
        free_off = torch.cuda.mem_get_info(dev)[0]
    tables = {}
    for layout in a.layouts.split(","):
        t1 = time.perf_counter()
        tables[layout] = host_tables(model, layout, dev)
        cov = tables[layout].coverage
        lines.append(f"- host table `{layout}`: {tables[layout].mapped_bytes} B mapped, filled + pinned in "
                     f"{time.perf_counter() - t1:.1f} s, huge pages {cov.huge_bytes} B ({100 * cov.fraction:.1f}%)")
    sections = []
    day = datetime.date.today().isoformat()
    out = Path(a.results_dir) / f"{day}-{'h200' if 'H200' in name else dev.type}-engram-host.md"
    out.parent.mkdir(parents=True, exist_ok=True)
    cmd = "python " + " ".join(shlex.quote(x) for x in sys.argv)
    head = [f"# Engram host table vs device tables ({day})", "",
            f"Device: {name}, torch {torch.__version__}" + (f", triton {__import__('triton').__version__}" if dev.type == "cuda" else "")
            + f". Command: `{cmd}`", ""] + lines

    def flush() -> str:
        text = "\n".join(head + sum(([f"\n## {title}\n", *body] for title, body in sections), [])) + "\n"
        out.write_text(text)
        return text

    if "gather" not in skip:
        try:
            gl: list[str] = []
            gather_check(model, tables, dev, gl)
            sections.append(("Gather alone: 8192 tokens x 24 rows per Engram layer (row ids from the hasher)", gl))
        except Exception:
            sections.append(("Gather alone: FAILED", ["```", traceback.format_exc(), "```"]))
        print(flush(), flush=True)
    if "graph" not in skip and dev.type == "cuda":
        gl = []
        for layout in tables:
            try:
                place.on(tables[layout])
                gl.append(f"layout `{layout}`:")
                graph_check(model, dev, gl)
            except Exception:
                gl += ["```", traceback.format_exc(), "```"]
        place.off()
        sections.append(("CUDA graph with the host table", gl))
        print(flush(), flush=True)
    rows = {}
    if "e2e" not in skip:
        long_p = random_prompts(model.cfg.vocab_size - 1, nl, ll, 0)
        short_p = random_prompts(model.cfg.vocab_size - 1, ns, ls, 1)
        page = 256
        drv_args = (max(nl * (ll + a.decode + page), ns * (ls + a.decode + page), 2 * (300 + 2 + page)), max(nl, ns, 2), page, dev,
                    False, table)
        warm = random_prompts(model.cfg.vocab_size - 1, 2, 300, 2)
        for label in ["off", *tables]:
            if time.perf_counter() - t0 > a.budget_s:
                sections.append((f"end to end `{label}`: not run (past --budget-s {a.budget_s:.0f})", []))
                continue
            try:
                place.off() if label == "off" else place.on(tables[label])
                Driver(model, *drv_args).generate(warm, 2, a.chunk)  # JIT of this placement's kernels
                rows[label] = e2e(drv_args, model, long_p, short_p, a.decode, a.chunk)
                print(label, {k: v for k, v in rows[label].items() if k != "tokens"}, f"{time.perf_counter() - t0:.0f}s", flush=True)
            except Exception:
                sections.append((f"end to end `{label}`: FAILED", ["```", traceback.format_exc(), "```"]))
        place.off()
        el = [f"Prompts: {nl} x {ll} (prefill, then decode at batch {nl}) and {ns} x {ls} (decode at batch {ns}); "
              f"{a.decode} greedy tokens each ({a.decode - 1} decode steps timed); chunk {a.chunk}.", "",
              f"| placement | prefill tok/s | vs off | decode s/step batch {nl} | vs off | decode s/step batch {ns} | vs off | "
              "greedy tokens == off |", "|---|---|---|---|---|---|---|---|"]
        base = rows.get("off")
        for label, r in rows.items():
            rel = (lambda key, inv=False: f"{(base[key] / r[key]) if inv else (r[key] / base[key]):.3f}x") if base else (lambda *_: "-")
            el.append(f"| {label} | {r['prefill_tok_s']:.0f} | {rel('prefill_tok_s')} | {r['decode_long_s']:.3f} | "
                      f"{rel('decode_long_s', True)} | {r['decode_short_s']:.3f} | {rel('decode_short_s', True)} | "
                      f"{(r['tokens'] == base['tokens']) if base else '-'} |")
        sections.append(("End to end on the driver (decode speed: off time / on time, >= 1 is faster)", el))
    if dev.type == "cuda":
        for lid in e.layer_ids:  # free the device tables: what the host table gives to the KV cache
            place.device_tables[lid].weight = None
            place.device_tables[lid].scale = None
        torch.cuda.empty_cache()
        free_on = torch.cuda.mem_get_info(dev)[0]
        bpt = KVPools.bytes_per_token(model.cfg)["total"]
        gain, want = (free_on - free_off) // bpt, table_bytes // bpt
        sections.append(("KV capacity (device memory free after weights, in KV token slots)", [
            f"| tables | free device bytes | KV tokens at {bpt:g} B/token |", "|---|---|---|",
            f"| on the device | {free_off} | {int(free_off // bpt)} |", f"| in host memory | {free_on} | {int(free_on // bpt)} |",
            "", f"Gain {int(gain)} tokens (+{100 * (free_on - free_off) / max(free_off, 1):.1f}% free memory); "
            f"table bytes / bytes per token = {int(want)}; gain / expected = {gain / want:.4f}."]))
    print(flush(), flush=True)


if __name__ == "__main__":
    main()

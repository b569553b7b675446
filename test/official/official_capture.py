"""DeepSeek's own forward as an oracle: run it in a subprocess and capture its logits and decisions.

The official V4.1 reference (`../shared/official` relative to the repo root; override with the
environment variable SGLANG_DSV41_OFFICIAL_DIR) is imported, never copied. It keeps module globals (world
size, default dtype, the shared attention state), so every official model lives in its own process:

    python official_capture.py forward CKPT IDS_JSON OUT_PT --threads N [--mkl-partials]
        one official prefill (start_pos 0, text only) over the ids -> torch.save({
          "logits": fp32 [T, vocab] (the official final norm + head on every row, one head GEMM),
          "routed_experts": {layer: int32 [T, top_k]}  (Gate indices, ordered by biased score),
          "topk": {layer: int32 [T, min(index_topk, T // ratio)]}  (Indexer output minus its window offset:
                                                          compressed positions ascending, -1 padded),
          "candidates": {layer: bool [T, T // ratio]}}) (the candidate source's block mask)
    python official_capture.py logits CKPT IDS_JSON OUT_PT --threads N [--mkl-partials]
        one batched official prefill over B prompts of T tokens (IDS_JSON: [B][T]) -> torch.save(
          fp32 [B, T, vocab]: the official final norm + head on every row, one head GEMM)
    python official_capture.py spec CKPT IDS_JSON OUT_PT --prefill P --threads N
        the official DSpark step at every position i = P .. T-1 (temperature 0) over ONE official
        prefill of all T ids (its logits and drafter input of every row): forward_spec(start_pos 0)
        seeds the drafter's windows with rows < i, forward_spec(argmax of row i, main_hidden[i], i)
        drafts. (DeepSeek's own decode step, model(ids[i], i) after a prefill, and prefills of other
        lengths give target rows that differ from this prefill's, by up to 1.09 on the tiny preset;
        the single prefill is the oracle our forward matches, test_official_forward.py.) Its fp32
        GEMMs run as 64-row tiles (`_row_tiled_fp32_gemms`, docs/numerics.md choice 4).
        -> torch.save({"ids": int64 [n, gamma + 1] (anchor, drafts),
          "logits": fp32 [n, gamma, vocab] (step logits), "confidence": fp32 [n, gamma],
          "target": fp32 [n, vocab] (the decode step's logits)})
    python official_capture.py vision CKPT SPEC_JSON OUT_PT --threads N
        one official prefill of a prompt with images (fp32 GEMMs in 64-row tiles, as `spec`). SPEC_JSON: {"ids": [...] (one image_token_id
        placeholder per image), "images": [image file paths]}; each placeholder is expanded as
        DeepSeek's prepare_vl_inputs does (its load_image, image_token_types) -> torch.save({
          "ids": int64 [T], "types": int64 [T], "patches": [bf16 [N_i, 3, p, p]], "grids": [[vit_h,
          vit_w, llm_h, llm_w]], "logits": fp32 [T, vocab], "routed_experts": {layer: int32 [T, k]}})
    python official_capture.py write-small DIR --max-seq-len N
        testing.build_small_model(small_model_args(max_seq_len=N), seed=7) written by
        check_run_official.write_checkpoint, with to_hf(args) as config.json and
        write_tokenizer(DIR/tokenizer.json, vocab) -> DIR (the released layout)

Two things the official forward leaves to the implementation are pinned to our documented rules
(`_pin_unspecified`; `--mkl-partials` leaves the second one as it is, to see the difference):
- top-k ties: `topk(sorted=False)` leaves their order open; the worker breaks them toward the lower
  index (docs/numerics.md choice 2) by running every `Tensor.topk` of the process as a stable
  descending sort;
- FP8 / FP4 GEMM block partials: each 32-wide K block is an fp32 `a_blk @ b_blk.T`, summed in
  whatever order MKL picks for the call's shape, the row's place in it and the thread split (so a
  row's bits depend on the prompt length and the batch); the worker makes that one matmul the exact
  sum rounded once to fp32 (docs/numerics.md choice 4b), the rest of the GEMM stays DeepSeek's.
Both processes must run the same thread count (docs/numerics.md "Thread count"),
ATEN_CPU_CAPABILITY=default and MKL_CBWR. In the test process: `OfficialForward(ckpt, ids, workdir,
threads).result()` and `OfficialLogits(ckpt, prompts, workdir, threads).result()` (started in the
background) and `write_official_small(dir, max_seq_len, threads)`.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
OFFICIAL_DIR = Path(os.environ.get("SGLANG_DSV41_OFFICIAL_DIR", REPO.parent / "shared" / "official"))
EXACT_ENV = {"ATEN_CPU_CAPABILITY": "default", "MKL_CBWR": "COMPATIBLE"}


def official_available() -> bool:
    return (OFFICIAL_DIR / "run_official.py").is_file() and (OFFICIAL_DIR / "check_run_official.py").is_file()


def skip_reason() -> str:
    return (f"DeepSeek's reference forward not found: {OFFICIAL_DIR} (../shared/official relative to the repo "
            f"root, or SGLANG_DSV41_OFFICIAL_DIR) is absent")


class Worker:
    """One worker subprocess (its own official model); `wait()` raises with its output if it failed.
    The environment is this process's with the exact-numerics settings defaulted (conftest sets them)."""

    def __init__(self, argv: list[str], threads: int):
        env = dict(os.environ)
        for k, v in EXACT_ENV.items():
            env.setdefault(k, v)
        cmd = [sys.executable, str(Path(__file__).resolve()), *argv, "--threads", str(threads)]
        self.what = argv[0]
        self.proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)

    def wait(self) -> None:
        out, _ = self.proc.communicate()
        if self.proc.returncode != 0:
            raise RuntimeError(f"official worker failed ({self.what}, exit {self.proc.returncode}):\n{out[-5000:]}")


class _Background:
    """A worker command writing `out` (torch.save), started at once; `result()` waits and loads it."""

    def __init__(self, cmd: str, ckpt: Path, ids, workdir: Path, name: str, threads: int, extra: list[str] = ()):
        self.ids_file, self.out = workdir / f"official_{name}_ids.json", workdir / f"official_{name}.pt"
        self.ids_file.write_text(json.dumps(ids))
        self.worker = Worker([cmd, str(ckpt), str(self.ids_file), str(self.out), *extra], threads)
        self._result = None

    def result(self):
        import torch

        if self._result is None:
            self.worker.wait()
            self._result = torch.load(self.out)
        return self._result


class OfficialForward(_Background):
    """The official forward on checkpoint `ckpt` (module docstring, `forward`); `result()`:
    {"logits", "routed_experts", "topk", "candidates"}."""

    def __init__(self, ckpt: Path, ids: list[int], workdir: Path, threads: int):
        super().__init__("forward", ckpt, [int(t) for t in ids], workdir, "forward", threads)


class OfficialLogits(_Background):
    """The official batched prefill of `prompts` ([B][T] ids) on checkpoint `ckpt` (`logits`);
    `result()`: fp32 logits [B, T, vocab]."""

    def __init__(self, ckpt: Path, prompts: list[list[int]], workdir: Path, threads: int, mkl_partials: bool = False):
        super().__init__("logits", ckpt, [[int(t) for t in row] for row in prompts], workdir, "logits", threads,
                         ["--mkl-partials"] if mkl_partials else [])


class OfficialVision(_Background):
    """The official prefill of `ids` with images (`vision`); `result()`: module docstring."""

    def __init__(self, ckpt: Path, ids: list[int], images: list[str], workdir: Path, threads: int):
        super().__init__("vision", ckpt, {"ids": [int(t) for t in ids], "images": [str(i) for i in images]},
                         workdir, "vision", threads)


class OfficialSpec(_Background):
    """The official DSpark steps on `ckpt` over `ids` at positions prefill .. T-1 (`spec`)."""

    def __init__(self, ckpt: Path, ids: list[int], prefill: int, workdir: Path, threads: int):
        super().__init__("spec", ckpt, [int(t) for t in ids], workdir, "spec", threads, ["--prefill", str(prefill)])


def write_official_small(out_dir: Path, max_seq_len: int, threads: int) -> Path:
    """The official small test model (seed 7) in the released layout, with config.json and tokenizer."""
    Worker(["write-small", str(out_dir), "--max-seq-len", str(max_seq_len)], threads).wait()
    return out_dir


# ------------------------------------------------------------------------------ the worker process
def _import_official():
    for p in (OFFICIAL_DIR / "dsv41_official", OFFICIAL_DIR):
        if str(p) not in sys.path:
            sys.path.insert(0, str(p))
    import run_official

    return run_official


def _stable_topk():
    """Every Tensor.topk of this process picks equal values in ascending index order (largest=True:
    a stable descending sort), returning them in sorted order (a valid `sorted=False` answer too)."""
    import torch

    def topk(self, k, dim=-1, largest=True, sorted=True):  # noqa: A002 (torch's parameter name)
        values, indices = torch.sort(self, dim=dim, descending=largest, stable=True)
        return torch.return_types.topk((values.narrow(dim, 0, k), indices.narrow(dim, 0, k)))

    torch.Tensor.topk = topk


def _exact_block_partials():
    """The official FP8 / FP4 GEMMs (kernel_cpu `fp8_gemm` / `fp4_gemm`, through `_block_scaled_gemm`)
    sum each K block's products with an fp32 `a_blk @ b_blk.T`: MKL's order, which depends on the
    call's row count, the row's place in it, the output width and the thread split (docs/numerics.md
    choice 4b). Pin it to the documented rule: inside `_block_scaled_gemm` every 2-D fp32 matmul
    returns the exact sum of its products (float64 holds every E4M3 x E4M3 / E2M1 x E4M3 block sum
    exactly) rounded once to fp32. Everything around it (quantizers, scales, the K-block accumulation,
    the bf16 cast) stays DeepSeek's code."""
    import torch

    from models.demos.deepseek_v3_d_p.reference.deepseek_v41 import kernel_cpu

    block_gemm, plain = kernel_cpu._block_scaled_gemm, torch.Tensor.__matmul__

    def exact(x, y):
        if x.dtype == y.dtype == torch.float32 and x.dim() == y.dim() == 2:
            return plain(x.double(), y.double()).float()
        return plain(x, y)

    def pinned(*args, **kwargs):
        torch.Tensor.__matmul__ = exact
        try:
            return block_gemm(*args, **kwargs)
        finally:
            torch.Tensor.__matmul__ = plain

    kernel_cpu._block_scaled_gemm = pinned


def _row_tiled_fp32_gemms():
    """Every fp32 x fp32 `F.linear` of the process (mHC mixes, router, head, the DSpark Markov and
    confidence heads) runs as GEMMs of exactly 64 rows, the last tile zero-padded: our documented
    batch-invariant order (docs/numerics.md choice 4). MKL picks the summation order by the call's
    shape; at the prompt lengths of a prefill it agrees with the 64-row tiles, at a draft step's
    gamma rows it does not (one fp32 ulp in the mHC mixes of the tiny preset's second stage)."""
    import torch
    import torch.nn.functional as F

    plain = F.linear

    def tiled(x, w, bias=None):
        if bias is not None or x.dtype != torch.float32 or w.dtype != torch.float32:
            return plain(x, w, bias)
        flat = x.reshape(-1, x.size(-1))
        n = flat.size(0)
        flat = F.pad(flat, (0, 0, 0, -n % 64))
        out = torch.cat([plain(t, w) for t in flat.split(64)])[:n]
        return out.reshape(*x.shape[:-1], w.size(0))

    F.linear = tiled


def _pin_unspecified(mkl_partials: bool = False):
    """The behaviours the official forward leaves to the implementation, pinned to our rules (module
    docstring); `mkl_partials` keeps MKL's block partials."""
    _stable_topk()
    if not mkl_partials:
        _exact_block_partials()


def _logits(ckpt: str, ids_file: str, out: str, mkl_partials: bool) -> None:
    import torch

    ro = _import_official()
    _pin_unspecified(mkl_partials)
    ids = torch.tensor(json.loads(Path(ids_file).read_text()), dtype=torch.long)  # [B, T]
    batch, seqlen = ids.shape
    model, _, _ = ro.build(Path(ckpt), max_seq_len=seqlen, quiet=True, skip_mtp=True,
                           overrides={"max_batch_size": batch})
    v41 = ro.v41
    caught = {}
    hook = model.head.register_forward_pre_hook(lambda _mod, args: caught.__setitem__("x", args[0]))
    try:
        with torch.inference_mode(), v41.set_dtype(torch.bfloat16):
            model(ids, 0)
            logits = model.head(caught["x"], full_logits=True)  # the final norm + head on every row
    finally:
        hook.remove()
    assert logits.shape[:2] == ids.shape, (tuple(logits.shape), tuple(ids.shape))
    torch.save(logits.float().contiguous(), out)


def _forward(ckpt: str, ids_file: str, out: str, mkl_partials: bool) -> None:
    import torch

    ro = _import_official()
    _pin_unspecified(mkl_partials)
    ids = json.loads(Path(ids_file).read_text())
    model, _, _ = ro.build(Path(ckpt), max_seq_len=len(ids), quiet=True, skip_mtp=True)
    v41 = ro.v41
    got: dict[str, dict[int, torch.Tensor]] = {"routed_experts": {}, "topk": {}, "candidates": {}}

    def on_gate(layer_id):
        def hook(_mod, _inp, output):
            got["routed_experts"][layer_id] = output[1].to(torch.int32).clone()
        return hook

    def on_indexer(layer_id):
        def hook(mod, inp, output):
            offset = inp[4]  # Indexer.forward(x, qr, latent, start_pos, offset)
            idx = output[0]  # batch 1: [T, k] window-offset positions, -1 padded
            got["topk"][layer_id] = torch.where(idx >= 0, idx - offset, -1).to(torch.int32).clone()
            if mod.is_candidate_source:
                got["candidates"][layer_id] = v41.shared_attn.candidates[0].clone()
        return hook

    hooks = []
    for i, layer in enumerate(model.layers):
        hooks.append(layer.ffn.gate.register_forward_hook(on_gate(i)))
        indexer = getattr(layer.attn, "indexer", None)
        if indexer is not None:
            hooks.append(indexer.register_forward_hook(on_indexer(i)))
    logits = ro.full_logits(model, torch.tensor(ids), rowwise_head=False)
    for h in hooks:
        h.remove()
    torch.save({"logits": logits.float(), **got}, out)


def _spec(ckpt: str, ids_file: str, out: str, prefill: int) -> None:
    import torch

    ro = _import_official()
    _pin_unspecified()
    _row_tiled_fp32_gemms()
    ids = torch.tensor(json.loads(Path(ids_file).read_text()), dtype=torch.long).view(1, -1)
    # block rows reach T - 1 + gamma: the caches and RoPE table are sized past T
    model, _, _ = ro.build(Path(ckpt), max_seq_len=ids.size(1) + 64, quiet=True, overrides={"temperature": 0.0})
    v41 = ro.v41
    caught = {}
    model.head.register_forward_pre_hook(lambda _mod, args: caught.__setitem__("x", args[0]))
    got: dict[str, list] = {"ids": [], "logits": [], "confidence": [], "target": []}
    with torch.inference_mode(), v41.set_dtype(torch.bfloat16):
        # the target's rows: ONE official prefill of every id (module docstring)
        _, _, main_hidden = model(ids, 0)
        target = model.head(caught["x"], full_logits=True)[0]  # the final norm + head on every row
        for i in range(prefill, ids.size(1)):
            anchor = target[i].argmax().view(1)
            model.forward_spec(anchor, main_hidden[:, :i], 0)  # seeds every stage's window with rows < i
            draft_ids, step_logits, confidence = model.forward_spec(anchor, main_hidden[:, i : i + 1], i)
            for k, v in zip(got, (draft_ids[0], step_logits[0], confidence[0], target[i])):
                got[k].append(v.clone())
    torch.save({k: torch.stack(v) for k, v in got.items()}, out)


def _vision(ckpt: str, spec_file: str, out: str) -> None:
    import torch

    ro = _import_official()
    _pin_unspecified()
    _row_tiled_fp32_gemms()  # the head over T rows: at T = 198 MKL's order differs from 64-row tiles
    from models.demos.deepseek_v3_d_p.reference.deepseek_v41 import image_processor as ip

    spec = json.loads(Path(spec_file).read_text())
    raw = json.loads((Path(ckpt) / "config.json").read_text())
    args, *_ = ro.model_args_from_hf(raw, max_seq_len=8192)
    ids, types, images, grids = [], [], [], []
    paths = iter(spec["images"])
    for tok in spec["ids"]:
        if tok != args.image_token_id:
            ids.append(tok)
            types.append(ip.TEXT)
            continue
        patches, vit_h, vit_w, llm_h, llm_w = ip.load_image({"url": next(paths)}, args)
        span = ip.image_token_types(llm_h, llm_w)
        images.append(ip.ImageInput(len(ids), patches, vit_h, vit_w, span))
        grids.append([vit_h, vit_w, llm_h, llm_w])
        ids += [args.image_token_id] * span.numel()
        types += span.tolist()
    # run_official builds text-only models (vision_n_layers -> 0); the override builds the tower
    layers = int(ro.flatten_hf(raw).get("vision_n_layers") or 0)
    model, _, _ = ro.build(Path(ckpt), max_seq_len=len(ids), quiet=True, skip_mtp=True,
                           overrides={"vision_n_layers": layers})
    v41 = ro.v41
    routed: dict[int, torch.Tensor] = {}
    hooks = [layer.ffn.gate.register_forward_hook(
        lambda _m, _i, o, lid=i: routed.__setitem__(lid, o[1].to(torch.int32).clone())) for i, layer in enumerate(model.layers)]
    caught = {}
    hooks.append(model.head.register_forward_pre_hook(lambda _mod, a: caught.__setitem__("x", a[0])))
    ids_t, types_t = torch.tensor([ids]), torch.tensor([types])
    with torch.inference_mode(), v41.set_dtype(torch.bfloat16):
        model(ids_t, 0, images=[images], token_types=types_t)
        logits = model.head(caught["x"], full_logits=True)[0]
    for h in hooks:
        h.remove()
    torch.save({"ids": ids_t[0], "types": types_t[0], "patches": [im.patches for im in images], "grids": grids,
                "logits": logits.float().contiguous(), "routed_experts": routed}, out)


def _write_small(out_dir: str, max_seq_len: int) -> None:
    ro = _import_official()
    import check_run_official as cro

    from models.demos.deepseek_v3_d_p.reference.deepseek_v41 import testing

    args = testing.small_model_args(max_seq_len=max_seq_len)
    model = testing.build_small_model(args, seed=7)
    out = Path(out_dir)
    cro.write_checkpoint(model, out)
    (out / "config.json").write_text(json.dumps(cro.to_hf(args), indent=2) + "\n")
    cro.write_tokenizer(out / "tokenizer.json", args.vocab_size)


def main(argv: list[str]) -> None:
    import argparse

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    f = sub.add_parser("forward")
    f.add_argument("ckpt")
    f.add_argument("ids_file")
    f.add_argument("out")
    lg = sub.add_parser("logits")
    lg.add_argument("ckpt")
    lg.add_argument("ids_file")
    lg.add_argument("out")
    sp = sub.add_parser("spec")
    sp.add_argument("ckpt")
    sp.add_argument("ids_file")
    sp.add_argument("out")
    sp.add_argument("--prefill", type=int, required=True)
    vi = sub.add_parser("vision")
    vi.add_argument("ckpt")
    vi.add_argument("ids_file")
    vi.add_argument("out")
    w = sub.add_parser("write-small")
    w.add_argument("out_dir")
    w.add_argument("--max-seq-len", type=int, required=True)
    for p in (f, lg):
        p.add_argument("--mkl-partials", action="store_true",
                       help="leave the FP8/FP4 block partials to MKL (not pinned; module docstring)")
    for p in (f, lg, sp, vi, w):
        p.add_argument("--threads", type=int, required=True)
    a = ap.parse_args(argv)
    import torch

    torch.set_num_threads(a.threads)
    if a.cmd == "forward":
        _forward(a.ckpt, a.ids_file, a.out, a.mkl_partials)
    elif a.cmd == "logits":
        _logits(a.ckpt, a.ids_file, a.out, a.mkl_partials)
    elif a.cmd == "spec":
        _spec(a.ckpt, a.ids_file, a.out, a.prefill)
    elif a.cmd == "vision":
        _vision(a.ckpt, a.ids_file, a.out)
    else:
        _write_small(a.out_dir, a.max_seq_len)


if __name__ == "__main__":
    main(sys.argv[1:])

"""Score tokens with the reference forward and write fp32 logits to a safetensors file.

    python -m sglang_dsv41.reference --model DIR --token-ids 1,2,3 --out FILE.safetensors [--tail-replay]

Output tensors: `logits` fp32 [rows, vocab], `positions` int64 [rows] (all positions, or the replay
tail), and `routed_experts.<layer>` int32 [rows, top_k] for external routing checks.
"""

from __future__ import annotations

import argparse
import time

import torch
from safetensors.torch import save_file

from sglang_dsv41.checkpoint.loader import load_model
from sglang_dsv41.reference.model import ReferenceModel


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description="DeepSeek-V4.1 reference forward: fp32 logits for every position.")
    ap.add_argument("--model", required=True, help="checkpoint directory, or an embedded model name (deepseek-v4.1-tiny)")
    ids = ap.add_mutually_exclusive_group(required=True)
    ids.add_argument("--token-ids", help="comma-separated token ids, e.g. 0,15,27")
    ids.add_argument("--text", help="text to tokenize with the checkpoint's tokenizer")
    ap.add_argument("--out", required=True, help="output .safetensors path")
    ap.add_argument("--tail-replay", action="store_true", help="decoder SWA bounded replay: late layers on the last window only")
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    a = ap.parse_args(argv)

    model = load_model(a.model, device=a.device)
    if a.token_ids is not None:
        token_ids = [int(t) for t in a.token_ids.split(",") if t.strip()]
    else:
        from tokenizers import Tokenizer

        from sglang_dsv41.embedded import resolve_model_path

        token_ids = Tokenizer.from_file(str(resolve_model_path(a.model) / "tokenizer.json")).encode(a.text).ids
    if not token_ids:
        ap.error("no token ids given")
    bad = [t for t in token_ids if not 0 <= t < model.cfg.vocab_size]
    if bad:
        ap.error(f"token id {bad[0]} is outside the vocabulary [0, {model.cfg.vocab_size})")
    t0 = time.perf_counter()
    out = ReferenceModel(model).forward(torch.tensor(token_ids), decoder_tail_replay=a.tail_replay)
    dt = time.perf_counter() - t0
    tensors = {"logits": out.logits.float().cpu().contiguous(), "positions": out.positions.cpu().contiguous()}
    for layer, experts in out.decisions.routed_experts.items():
        tensors[f"routed_experts.{layer}"] = experts.cpu().contiguous()
    save_file(tensors, a.out)
    print(f"{len(token_ids)} tokens -> logits {list(out.logits.shape)} in {dt:.2f}s, written to {a.out}")


if __name__ == "__main__":
    main()

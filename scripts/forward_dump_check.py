"""Compare a server's dumped logits (SGLANG_DSV41_DUMP_FORWARDS, sglang/model/forward_dump.py) with the
trainer's dense forward, request by request.

    python scripts/forward_dump_check.py --model DIR --dumps DUMP_DIR

For every request id in the dumps: its tokens (the ids every forward fed it, by position), one dense
forward (`DenseKV`) over them, and each dumped logits row compared bitwise with the dense row of the
same position. Prints one line per request ("ok", or the positions whose logits differ with the
dump file, SGLang's forward mode, batch size and max |d|). Run it with the server's environment
(SGLANG_DSV41_DETERMINISTIC, MKL_CBWR, ATEN_CPU_CAPABILITY=default, torch threads)."""

from __future__ import annotations

import argparse
import glob
import os
import sys
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT / "python"), str(ROOT / "sgl-kernel")]
os.environ.setdefault("ATEN_CPU_CAPABILITY", "default")

import torch  # noqa: E402


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--model", required=True)
    p.add_argument("--dumps", required=True)
    a = p.parse_args(argv)
    from sglang_dsv41.checkpoint.loader import load_model
    from sglang_dsv41.reference.dense_kv import DenseKV

    model = load_model(a.model, progress=False)
    tokens: dict = defaultdict(dict)  # rid -> position -> id
    rows: dict = defaultdict(dict)  # rid -> position -> (file, logits, mode, batch size)
    for f in sorted(glob.glob(os.path.join(a.dumps, "*.pt"))):
        r = torch.load(f, weights_only=False)
        rids = r["rids"]
        for q, pos, t in zip(r["req_index"].tolist(), r["positions"].tolist(), r["input_ids"].tolist()):
            tokens[rids[q]][pos] = t
        for j, row in enumerate(r["logits_rows"].tolist()):
            q, pos = int(r["req_index"][row]), int(r["positions"][row])
            rows[rids[q]][pos] = (os.path.basename(f), r["logits"][j], r["mode"], len(rids))
    differing = 0
    with torch.no_grad():
        for rid, by_pos in tokens.items():
            n = max(by_pos) + 1
            if n < 2 or len(by_pos) != n:
                continue
            seq = torch.tensor([by_pos[i] for i in range(n)])
            dense = model(seq, DenseKV(model.cfg, n, "cpu"), None).logits.float()
            bad = [(pos, f, mode, bs, float((dense[pos] - lg).abs().max()))
                   for pos, (f, lg, mode, bs) in sorted(rows[rid].items()) if pos < n and not torch.equal(dense[pos], lg)]
            differing += bool(bad)
            print(rid, "tokens", n, "logits rows", len(rows[rid]), "DIFFER" if bad else "ok", bad or "", flush=True)
    print(f"{len(tokens)} requests, {differing} with differing logits")
    return 1 if differing else 0


if __name__ == "__main__":
    sys.exit(main())

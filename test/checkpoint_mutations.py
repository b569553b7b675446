"""Seeded mutations of a safetensors file, shared by the reader's fuzz test (test/core) and the server's
weight-update fuzz (test/server): each names its corruption class."""

from __future__ import annotations

import json
import random
import struct

KINDS = ("header bit flip", "data bit flip", "truncate", "extend", "shuffle offsets", "duplicate name",
         "wrong dtype", "non-finite", "header length", "random")


def header(buf: bytes) -> tuple[dict, bytes]:
    """(the parsed JSON header, the data bytes) of a well-formed file."""
    n = int.from_bytes(buf[:8], "little")
    return json.loads(buf[8:8 + n]), buf[8 + n:]


def pack(header_text: str, data: bytes) -> bytes:
    h = header_text.encode()
    return struct.pack("<Q", len(h)) + h + data


def mutate(buf: bytes, rng: random.Random) -> tuple[str, bytes]:
    """(class, the mutated bytes) for one random corruption of the file `buf`."""
    head, data = header(buf)
    kind = rng.choice(KINDS)
    b = bytearray(buf)
    n = int.from_bytes(buf[:8], "little")
    if kind == "header bit flip":
        for _ in range(rng.randint(1, 3)):
            i = rng.randrange(8 + n)
            b[i] ^= 1 << rng.randrange(8)
    elif kind == "data bit flip":
        i = rng.randrange(8 + n, len(b))
        b[i] ^= 1 << rng.randrange(8)
    elif kind == "truncate":
        b = b[:rng.randrange(len(b))]
    elif kind == "extend":
        b += rng.randbytes(rng.randint(1, 64))
    elif kind == "shuffle offsets":
        names = [k for k in head if k != "__metadata__"]
        offs = [head[k]["data_offsets"] for k in names]
        rng.shuffle(offs)
        for k, o in zip(names, offs):
            head[k]["data_offsets"] = o
        b = bytearray(pack(json.dumps(head), data))
    elif kind == "duplicate name":
        text = json.dumps(head)
        names = [k for k in head if k != "__metadata__"]
        a, c = rng.sample(names, 2)
        b = bytearray(pack(text.replace(f'"{c}"', f'"{a}"'), data))
    elif kind == "wrong dtype":
        k = rng.choice([k for k in head if k != "__metadata__"])
        head[k]["dtype"] = rng.choice(["BF16", "F32", "F16", "I8", "U8", "F8_E4M3", "F8_E8M0", "I64"])
        b = bytearray(pack(json.dumps(head), data))
    elif kind == "non-finite":
        k = rng.choice([k for k in head if k != "__metadata__"])
        lo, hi = head[k]["data_offsets"]
        width = {"BF16": 2, "F32": 4}.get(head[k]["dtype"], 1)
        at = 8 + n + lo + rng.randrange((hi - lo) // width) * width
        b[at:at + width] = {2: b"\xc0\x7f", 4: b"\x00\x00\x80\x7f"}.get(width, b"\xff")
    elif kind == "header length":
        b[:8] = struct.pack("<Q", rng.choice([0, 1, n - 1, n + 1, len(b), 1 << 40, (1 << 64) - 1]))
    else:
        b = bytearray(rng.randbytes(rng.randint(0, 2 * len(b))))
    return kind, bytes(b)

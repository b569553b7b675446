"""The safetensors byte layout, parsed with every bound checked: for bytes from outside the server.

Layout: `u64 little-endian N` | `N bytes of JSON header` | data. The header is one JSON object,
`{"__metadata__": {str: str}, name: {"dtype": str, "shape": [int, ...], "data_offsets": [begin, end]}}`,
offsets relative to the first data byte. Beyond the format's own rules this reader requires:
- N <= `MAX_HEADER_BYTES` and 8 + N <= the file's size;
- unique names (a repeated JSON key is an error, not "the last one wins");
- every dtype known (`DTYPE_BYTES`), every shape a list of at most 8 non-negative integers,
  end - begin == numel * element size;
- the entries tile the data exactly: sorted by offset they start at 0, leave no gap, do not overlap
  and end at the last byte of the file (a header not covering the file is an error, so is a file
  shorter than its header says).
Any breach raises `SafetensorsError` naming the file (its name only, never a server path) and,
where there is one, the tensor. Nothing here runs code from the input: JSON and raw bytes only.
"""

from __future__ import annotations

import json
import os
import stat
from dataclasses import dataclass

import torch

MAX_HEADER_BYTES = 100_000_000
"""The safetensors library's own header limit."""
MAX_DIMS = 8

DTYPE_BYTES: dict[str, int] = {
    "BOOL": 1, "U8": 1, "I8": 1, "F8_E4M3": 1, "F8_E5M2": 1, "F8_E8M0": 1,
    "I16": 2, "U16": 2, "F16": 2, "BF16": 2,
    "I32": 4, "U32": 4, "F32": 4,
    "I64": 8, "U64": 8, "F64": 8,
}
TORCH_DTYPES: dict[str, torch.dtype] = {
    "BOOL": torch.bool, "U8": torch.uint8, "I8": torch.int8, "F8_E4M3": torch.float8_e4m3fn,
    "F8_E5M2": torch.float8_e5m2, "F8_E8M0": torch.float8_e8m0fnu, "I16": torch.int16, "U16": torch.uint16,
    "F16": torch.float16, "BF16": torch.bfloat16, "I32": torch.int32, "U32": torch.uint32, "F32": torch.float32,
    "I64": torch.int64, "U64": torch.uint64, "F64": torch.float64,
}


class SafetensorsError(ValueError):
    """The bytes are not a well-formed safetensors file; the message names the file and the problem."""


@dataclass(frozen=True)
class Entry:
    """One tensor of a parsed header; `begin`/`end` are absolute byte offsets into the file."""

    name: str
    dtype: str
    shape: tuple[int, ...]
    begin: int
    end: int


def _unique_object(pairs):
    out = {}
    for k, v in pairs:
        if k in out:
            raise SafetensorsError(f"the header names '{k}' twice")
        out[k] = v
    return out


def _no_constant(token: str):
    raise SafetensorsError(f"the header holds a non-JSON number {token}")


def _integer(v) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def parse_header(prefix: bytes, size: int, where: str) -> list[Entry]:
    """Entries of a safetensors file of `size` bytes whose first bytes are `prefix` (at least 8, and
    all of the header once its length is known: call `header_length` first). Sorted by offset."""
    n = header_length(prefix, size, where)
    if len(prefix) < 8 + n:
        raise SafetensorsError(f"{where}: the header is cut short")
    try:
        header = json.loads(prefix[8:8 + n].decode("utf-8"), object_pairs_hook=_unique_object,
                            parse_constant=_no_constant)
    except SafetensorsError as e:
        raise SafetensorsError(f"{where}: {e}") from None
    except (UnicodeDecodeError, ValueError, RecursionError) as e:
        raise SafetensorsError(f"{where}: the header is not valid JSON ({type(e).__name__})") from None
    if not isinstance(header, dict):
        raise SafetensorsError(f"{where}: the header is a JSON {type(header).__name__}, not an object")
    meta = header.pop("__metadata__", {})
    if not isinstance(meta, dict) or not all(isinstance(v, str) for v in meta.values()):
        raise SafetensorsError(f"{where}: '__metadata__' must map strings to strings")
    data = 8 + n
    entries = [_entry(name, spec, data, where) for name, spec in header.items()]
    entries.sort(key=lambda e: (e.begin, e.end))
    at = data
    for e in entries:
        if e.begin != at:
            what = "overlaps the tensor before it" if e.begin < at else f"leaves bytes {at - data}..{e.begin - data} unused"
            raise SafetensorsError(f"{where}: tensor '{e.name}' {what}")
        at = e.end
    if at != size:
        raise SafetensorsError(f"{where}: the header covers {at} of the file's {size} bytes"
                               + (" (the file is cut short)" if at > size else ""))
    return entries


def header_length(prefix: bytes, size: int, where: str) -> int:
    """N from the first 8 bytes, bounds-checked against `size` and `MAX_HEADER_BYTES`."""
    if size < 8 or len(prefix) < 8:
        raise SafetensorsError(f"{where}: {size} bytes, shorter than the 8-byte header length")
    n = int.from_bytes(prefix[:8], "little")
    if n > MAX_HEADER_BYTES:
        raise SafetensorsError(f"{where}: header length {n} is over the {MAX_HEADER_BYTES}-byte limit")
    if 8 + n > size:
        raise SafetensorsError(f"{where}: header length {n} runs past the end of the {size}-byte file")
    return n


def _entry(name: str, spec, data: int, where: str) -> Entry:
    if not name:
        raise SafetensorsError(f"{where}: a tensor has an empty name")
    if not isinstance(spec, dict) or set(spec) - {"dtype", "shape", "data_offsets"} or len(spec) != 3:
        raise SafetensorsError(f"{where}: tensor '{name}' must be an object of dtype, shape and data_offsets")
    dtype, shape, offsets = spec["dtype"], spec["shape"], spec["data_offsets"]
    if dtype not in DTYPE_BYTES:
        raise SafetensorsError(f"{where}: tensor '{name}' has unknown dtype {str(dtype)[:32]!r}")
    if (not isinstance(shape, list) or len(shape) > MAX_DIMS
            or not all(_integer(d) and d >= 0 for d in shape)):
        raise SafetensorsError(f"{where}: tensor '{name}' shape must be a list of at most {MAX_DIMS} "
                               "non-negative integers")
    if not (isinstance(offsets, list) and len(offsets) == 2 and all(_integer(o) for o in offsets)
            and 0 <= offsets[0] <= offsets[1]):
        raise SafetensorsError(f"{where}: tensor '{name}' data_offsets must be [begin, end] with 0 <= begin <= end")
    numel = 1
    for d in shape:
        numel *= d
    if offsets[1] - offsets[0] != numel * DTYPE_BYTES[dtype]:
        raise SafetensorsError(f"{where}: tensor '{name}' has {offsets[1] - offsets[0]} bytes, its {dtype} "
                               f"shape {shape} needs {numel * DTYPE_BYTES[dtype]}")
    return Entry(name, dtype, tuple(shape), data + offsets[0], data + offsets[1])


def as_tensor(raw: torch.Tensor, entry: Entry) -> torch.Tensor:
    """The entry's tensor from its `end - begin` raw bytes (a uint8 tensor; the result shares them)."""
    return raw.view(TORCH_DTYPES[entry.dtype]).reshape(entry.shape)


def decode(buf: bytes, where: str) -> list[tuple[Entry, torch.Tensor]]:
    """Every tensor of an in-memory safetensors file (a weight-update payload), copied out of `buf`."""
    entries = parse_header(buf[:8 + header_length(buf, len(buf), where)], len(buf), where)
    data = torch.frombuffer(bytearray(buf), dtype=torch.uint8) if buf else torch.empty(0, dtype=torch.uint8)
    return [(e, as_tensor(data[e.begin:e.end].clone(), e)) for e in entries]  # clone: aligned, owned


class RegularFile:
    """A regular file opened for reading without following a final symlink and without blocking (a FIFO
    or device is refused by `fstat` after the non-blocking open, never read). Use as a context manager."""

    def __init__(self, path: str, where: str):
        self.where = where
        flags = os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_NOFOLLOW", 0)
        try:
            self.fd = os.open(path, flags)
        except OSError as e:
            raise SafetensorsError(f"{where}: cannot open ({e.strerror})") from None
        st = os.fstat(self.fd)
        if not stat.S_ISREG(st.st_mode):
            os.close(self.fd)
            raise SafetensorsError(f"{where}: not a regular file")
        self.size = st.st_size

    def __enter__(self) -> "RegularFile":
        return self

    def __exit__(self, *exc) -> None:
        os.close(self.fd)

    def read(self, begin: int, n: int) -> torch.Tensor:
        """Bytes [begin, begin + n) as a new uint8 tensor; a file that shrank is an error."""
        out = torch.empty(n, dtype=torch.uint8)
        view, got = memoryview(out.numpy()), 0
        while got < n:
            k = os.preadv(self.fd, [view[got:]], begin + got)
            if k <= 0:
                raise SafetensorsError(f"{self.where}: the file ended at byte {begin + got}, expected {begin + n}")
            got += k
        return out

    def entries(self) -> list[Entry]:
        head = bytes(self.read(0, min(8, self.size)).numpy())
        n = header_length(head, self.size, self.where)
        return parse_header(bytes(self.read(0, 8 + n).numpy()), self.size, self.where)

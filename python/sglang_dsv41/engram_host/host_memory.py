"""Host memory allocated for the Engram tables: one mapping, huge pages asked for, pinned for the GPU.

    shared   a memfd (anonymous shared memory, no file in /dev/shm, so a container's small /dev/shm
             does not limit it) mapped MAP_SHARED. The creating rank hands `handle` = (pid, fd) to
             the other ranks of the node, which open `/proc/<pid>/fd/<fd>` and map the same pages:
             one physical copy for the whole node (needs a shared PID namespace, i.e. one node).
             Huge pages depend on /sys/kernel/mm/transparent_hugepage/shmem_enabled.
    private  an anonymous MAP_PRIVATE mapping of this process; huge pages depend on
             transparent_hugepage/enabled (`madvise` or `always`).

Order (spec model 5.5): map -> madvise(MADV_HUGEPAGE) before the first touch -> (prefault) ->
write rows -> `pin()` (cudaHostRegister: the GPU reads the rows in place; with unified addressing
the device address equals the host address). `tensor` is a torch uint8 [nbytes] view of the whole
mapping; it stays valid as long as this object lives. `huge_page_bytes()` reads /proc/self/smaps.
"""

from __future__ import annotations

import ctypes
import mmap
import os
from dataclasses import dataclass

import torch

HUGE_PAGE = 2 << 20
"""Section alignment inside the mapping (the x86-64 PMD size; a multiple of every base page size)."""
MADV_COLLAPSE = 25  # linux/mman.h (Linux >= 6.1); Python's mmap module does not name it
_SMAPS_HUGE_FIELDS = ("AnonHugePages:", "ShmemPmdMapped:", "FilePmdMapped:")


@dataclass(frozen=True)
class HugePageCoverage:
    huge_bytes: int
    mapped_bytes: int

    @property
    def fraction(self) -> float:
        return self.huge_bytes / self.mapped_bytes if self.mapped_bytes else 0.0


class HostRegion:
    """`nbytes` of page-aligned host memory (rounded up to HUGE_PAGE)."""

    def __init__(self, nbytes: int, shared: bool, attach: tuple[int, int] | None = None, name: str = "dsv41-engram"):
        self.nbytes = max(HUGE_PAGE, -(-int(nbytes) // HUGE_PAGE) * HUGE_PAGE)
        self.shared = shared
        self._fd: int | None = None
        self._pinned_device: int | None = None
        prot = mmap.PROT_READ | mmap.PROT_WRITE
        if shared:
            if attach is None:  # the creating rank
                self._fd = os.memfd_create(name, os.MFD_CLOEXEC)
                os.ftruncate(self._fd, self.nbytes)
            else:  # another rank of the node maps the creator's pages
                pid, fd = attach
                self._fd = os.open(f"/proc/{pid}/fd/{fd}", os.O_RDWR | os.O_CLOEXEC)
                if os.fstat(self._fd).st_size != self.nbytes:
                    raise RuntimeError(f"shared Engram table at /proc/{pid}/fd/{fd} has {os.fstat(self._fd).st_size} "
                                       f"bytes, expected {self.nbytes}")
            self._mm = mmap.mmap(self._fd, self.nbytes, flags=mmap.MAP_SHARED, prot=prot)
        else:
            if attach is not None:
                raise ValueError("a private host region cannot attach to another rank's")
            self._mm = mmap.mmap(-1, self.nbytes, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS, prot=prot)
        self.huge_pages_advised = _madvise(self._mm, mmap.MADV_HUGEPAGE)  # before the first touch
        self.tensor = torch.frombuffer(self._mm, dtype=torch.uint8)
        self.address = self.tensor.data_ptr()

    @property
    def handle(self) -> tuple[int, int]:
        """(pid, fd) another rank of this node passes as `attach` (shared regions only)."""
        if self._fd is None:
            raise ValueError("a private host region has no handle")
        return os.getpid(), self._fd

    def prefault(self) -> None:
        """Touch every page now (one zero byte per 4 KiB, the mapping is zero already), so huge pages
        are taken at fault time."""
        self.tensor[::4096] = 0

    def collapse(self) -> bool:
        """Ask the kernel to collapse the mapping into huge pages now (MADV_COLLAPSE, Linux >= 6.1).
        Returns False where the kernel refuses (older kernel, no THP); retried once on EAGAIN."""
        libc = ctypes.CDLL(None, use_errno=True)
        for _ in range(2):
            if libc.madvise(ctypes.c_void_p(self.address), ctypes.c_size_t(self.nbytes), MADV_COLLAPSE) == 0:
                return True
            if ctypes.get_errno() != 11:  # EAGAIN
                return False
        return False

    def huge_page_bytes(self) -> HugePageCoverage:
        """Bytes of this mapping backed by huge pages, from /proc/self/smaps."""
        lo, hi = self.address, self.address + self.nbytes
        huge, inside = 0, False
        with open("/proc/self/smaps") as f:
            for line in f:
                head = line.split(None, 1)[0]
                if "-" in head and not head.endswith(":"):  # a mapping header "start-end perms ..."
                    start, end = (int(x, 16) for x in head.split("-"))
                    inside = start < hi and end > lo
                elif inside and head in _SMAPS_HUGE_FIELDS:
                    huge += int(line.split()[1]) * 1024
        return HugePageCoverage(min(huge, self.nbytes), self.nbytes)

    def pin(self, device: torch.device) -> None:
        """cudaHostRegister the whole mapping (portable + mapped). No-op off CUDA."""
        if device.type != "cuda" or self._pinned_device is not None:
            return
        rt = torch.cuda.cudart()
        err = rt.cudaHostRegister(self.address, self.nbytes, 3)  # cudaHostRegisterPortable | Mapped
        if int(getattr(err, "value", err)) != 0:
            raise RuntimeError(f"cudaHostRegister of the Engram host table ({self.nbytes} B) failed: {err}")
        self._pinned_device = device.index if device.index is not None else torch.cuda.current_device()

    def close(self) -> None:
        """Unpin (if pinned). The mapping itself goes with the last tensor view that uses it."""
        if self._pinned_device is not None:
            torch.cuda.cudart().cudaHostUnregister(self.address)
            self._pinned_device = None

    def __del__(self) -> None:
        try:
            self.close()
        except Exception:  # interpreter shutdown: CUDA may already be gone
            pass


def _madvise(mm: mmap.mmap, advice: int) -> bool:
    try:
        mm.madvise(advice)
        return True
    except OSError:  # a kernel without THP
        return False

"""The host allocator for SGLang's "cpu" device type.

SGLang's host-buffer allocators are a defaultdict keyed by device type: npu / musa / xpu pin through
torch, every other key (so "cpu") gets alloc_with_host_register, which calls cudaHostRegister for a
pinned request and raises "Found no NVIDIA driver" without CUDA. The routed-experts capturer
(state_capturer/base.py BaseHostCache, built by ModelRunner.init_routed_experts_capturer) always asks
for pinned memory under the model's device, so without this entry `--enable-return-routed-experts`
kills the scheduler at startup on CPU. Pinning only serves DMA from an accelerator; on CPU the
capturer's "device" cache is host memory already, and the readback (on_forward_end / finalize /
get_topk) is plain CPU indexing. The other users of the table (HiCache host pools) key it by their
device pool's type, so on a GPU machine they never read "cpu".
"""

from __future__ import annotations


def alloc_host_unpinned(dims: tuple, dtype, device: str, pin_memory: bool, allocator=None,
                        registration_granularity_bytes: int | None = None):
    """ALLOC_MEMORY_FUNCS["cpu"]: SGLang's allocator signature; the storage allocator's memory
    (anonymous mmap by default) without cudaHostRegister. `pin_memory` has nothing to pin for."""
    import torch

    if allocator is not None:
        return allocator.allocate(dims, dtype=dtype, device="cpu")
    return torch.empty(dims, dtype=dtype, device="cpu")


def add_cpu_allocator() -> None:
    """Set ALLOC_MEMORY_FUNCS["cpu"] to alloc_host_unpinned, replacing only SGLang's CUDA-registering
    default (a lookup may already have stored it under "cpu"); an explicit CPU allocator from a future
    SGLang wins."""
    from sglang.srt.mem_cache.pool_host.common import ALLOC_MEMORY_FUNCS

    if ALLOC_MEMORY_FUNCS.get("cpu") in (None, ALLOC_MEMORY_FUNCS.default_factory()):
        ALLOC_MEMORY_FUNCS["cpu"] = alloc_host_unpinned

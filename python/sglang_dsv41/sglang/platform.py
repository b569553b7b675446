"""Out-of-tree CPU platform: lets SGLang's real server run where there is no CUDA and no sgl_kernel.

SGLang's own CPU engine (`SGLANG_USE_CPU_ENGINE=1`) needs CPU builds of sgl_kernel ops everywhere;
an out-of-tree (OOT) platform instead makes every CUDA-assuming seam take its portable path
(`is_out_of_tree()` guards), RoPE/norm fused ops dispatch to `forward_native`, the paged allocator
uses its torch path (no Triton) and graph capture stays off. Our model does its own math anyway.

`activate()` returns the class only on a machine with no accelerator torch can see, so it never
takes over a CUDA (or ROCm / XPU) machine.
"""

from __future__ import annotations

import functools
import os

DEFAULT_CPU_MAX_TOTAL_TOKENS = 32768
"""Token slots on CPU when --max-total-tokens is unset (SGLang would size the pool from host RAM,
tens of GB and ~25 s of page faults at startup)."""
DEFAULT_CPU_MAX_RUNNING_REQUESTS = 64
V41_CONTEXT = 1 << 20
"""max_position_embeddings of the released DeepSeek-V4.1 config and of every tiny.py preset."""


def _accelerator_present() -> bool:
    import torch

    if torch.cuda.is_available():
        return True
    xpu = getattr(torch, "xpu", None)
    return bool(xpu is not None and xpu.is_available())


def on_our_cpu_platform() -> bool:
    """Whether SGLang's resolved platform (`current_platform`) is this module's Dsv41CpuPlatform."""
    from sglang.srt.platforms import current_platform

    return type(current_platform).__name__ == "Dsv41CpuPlatform"


def activate() -> str | None:
    """Entry point `sglang.srt.platforms:dsv41_cpu`."""
    if _accelerator_present() or os.environ.get("SGLANG_USE_CPU_ENGINE"):
        return None
    return "sglang_dsv41.sglang.platform:Dsv41CpuPlatform"


@functools.cache
def _platform_class():
    """The platform class, built once (the same class object for every lookup)."""
    from sglang.srt.platforms.cpu import CpuDeviceMixin
    from sglang.srt.platforms.interface import PlatformCapabilities, PlatformEnum, SRTPlatform

    class Dsv41CpuPlatform(CpuDeviceMixin, SRTPlatform):
        _enum = PlatformEnum.OOT
        device_name = "cpu"
        device_type = "cpu"
        capabilities = PlatformCapabilities()  # no Triton, no graphs, no pynccl, no HiCache kernels

        def apply_server_args_defaults(self, server_args) -> None:
            # Called through SGLang's handle_platform_defaults; only unset fields are filled.
            if server_args.max_total_tokens is None:
                server_args.max_total_tokens = int(
                    os.environ.get("SGLANG_DSV41_CPU_MAX_TOTAL_TOKENS", DEFAULT_CPU_MAX_TOTAL_TOKENS)
                )
            # SGLang's req_to_token table is (max_running_requests + 1) x context_length int32: with
            # the model's 1M context and 2048 requests that is 8 GiB of host RAM zeroed at startup.
            # When unset, never above V4.1's context (SGLang refuses that); arg_resolution.context_step then
            # lowers it to what the pool can always schedule and to the checkpoint's own context (pool_limits.py).
            if server_args.context_length is None:
                server_args.context_length = min(server_args.max_total_tokens, V41_CONTEXT)
            if server_args.max_running_requests is None:
                server_args.max_running_requests = DEFAULT_CPU_MAX_RUNNING_REQUESTS
            if server_args.attention_backend in (None, "intel_amx"):
                server_args.attention_backend = "torch_native"
            if server_args.sampling_backend is None:
                server_args.sampling_backend = "pytorch"

        def get_default_attention_backend(self) -> str:
            return "torch_native"

        # The profiler manager asks an out-of-tree platform for its torch profiler activity on
        # /start_profile; SGLang's base raises NotImplementedError there, which killed the scheduler.
        def get_torch_profiler_activity_str(self) -> str:
            return "CPU"

        def get_torch_profiler_activity(self):
            import torch

            return torch.profiler.ProfilerActivity.CPU

    return Dsv41CpuPlatform


def __getattr__(name: str):
    # SGLang loads "module:Dsv41CpuPlatform" after activate(); build it lazily so importing this
    # module (entry-point discovery) never imports SGLang's platform package.
    if name == "Dsv41CpuPlatform":
        return _platform_class()
    raise AttributeError(name)

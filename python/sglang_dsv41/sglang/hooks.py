"""Every hook into SGLang internals, in one place (SGLang 0.5.23 is pinned in pyproject.toml).

Each entry of `HOOKS` names the SGLang object it touches and why; `install()` applies them and
`test/sglang/test_hooks.py` fails loudly when a target moves. Public plugin APIs (resolution-hook and
model-override registries, HookRegistry) are preferred; the only wrap of a plain function is the
architecture rewrite below, and the only write into an SGLang table is the CPU host allocator.
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass

from sglang_dsv41.sglang.server_args import ARCHITECTURE, resolve_model_name, v41_defaults, validate_flags

logger = logging.getLogger(__name__)

EXTERNAL_PACKAGE = "sglang_dsv41.sglang"


@dataclass(frozen=True)
class Hook:
    target: str
    """Dotted path of the SGLang object that must exist."""
    why: str


HOOKS = (
    Hook("sglang.srt.configs.deepseek_v41.normalize_deepseek_v41_config",
         "AFTER hook: SGLang rewrites architectures [DeepseekV41ForCausalLM] -> [DeepseekV4ForCausalLM] "
         "(its CUDA-only V4 class); we keep the checkpoint's name so the registry resolves our class."),
    Hook("sglang.srt.arg_groups.resolution_hooks.register_resolution_hook",
         "wraps step handle_model_source_paths: `--model deepseek-v4.1-tiny` becomes the generated "
         "checkpoint dir (served under the alias) and `deepseek-v4.1` the hub id, before any download."),
    Hook("sglang.srt.arg_groups.resolution_hooks._OVERRIDABLE_HOOKS",
         "the step names we wrap (handle_model_source_paths, handle_missing_default_values) must stay "
         "overridable."),
    Hook("sglang.srt.arg_groups.model_override_base.register_model_override",
         "per-architecture provider for DeepseekV41ForCausalLM: page size 64 when unset, even page sizes "
         "only, and startup errors naming rejected flags (server_args.py)."),
    Hook("sglang.srt.models.registry.import_model_classes",
         "SGLANG_EXTERNAL_MODEL_PACKAGE (set by the plugin) makes the registry import our package and "
         "defer the in-tree model zoo; if the registry was imported first, we add our class directly."),
    Hook("sglang.srt.models.registry.ModelRegistry",
         "fallback registration target (ModelRegistry.models[arch] = class)."),
    Hook("sglang.srt.entrypoints.openai.serving_completions.OpenAIServingCompletion._validate_request",
         "AFTER hook: SGLang ignores the request's `model`; a name this server does not serve becomes a 4xx."),
    Hook("sglang.srt.entrypoints.openai.serving_chat.OpenAIServingChat._validate_request",
         "AFTER hook: same model-name check for chat completions."),
    Hook("sglang.srt.mem_cache.pool_host.common.ALLOC_MEMORY_FUNCS",
         "entry 'cpu' (unless SGLang has its own): --enable-return-routed-experts allocates the routed-expert "
         "capturer's host cache through ALLOC_MEMORY_FUNCS[device], whose default pins it with "
         "cudaHostRegister (no CUDA on CPU); on CPU the device cache is host memory, so nothing to pin."),
)


def resolve(target: str):
    """Import the object at a dotted path (raises if SGLang moved it)."""
    import importlib

    parts = target.split(".")
    for i in range(len(parts), 0, -1):
        try:
            obj = importlib.import_module(".".join(parts[:i]))
        except ImportError:
            continue
        for attr in parts[i:]:
            obj = getattr(obj, attr)
        return obj
    raise ImportError(target)


def _targets(suffix: str) -> list[str]:
    """The HOOKS targets ending with `suffix` (install code names its targets through HOOKS only)."""
    return [h.target for h in HOOKS if h.target.endswith(suffix)]


# ---------------------------------------------------------------------------- architecture
def keep_v41_architecture(result: dict, values, *args, **kwargs):
    """AFTER hook on normalize_deepseek_v41_config(values) -> dict."""
    src = values.get("architectures") if hasattr(values, "get") else None
    if src == [ARCHITECTURE] and result.get("architectures") != [ARCHITECTURE]:
        result = dict(result)
        result["architectures"] = [ARCHITECTURE]
    return result


def _install_architecture_hook() -> None:
    from sglang.srt.plugins.hook_registry import HookRegistry, HookType

    HookRegistry.register(HOOKS[0].target, keep_v41_architecture, HookType.AFTER)


# ---------------------------------------------------------------------------- request model name
# Names a request may use: the served name (the alias, e.g. deepseek-v4.1-tiny), the model path,
# SGLang's own default "default", and LoRA-style "<served>:<adapter>".
def check_model_name(result, serving, request, *args, **kwargs):
    """AFTER hook on OpenAIServing{Completion,Chat}._validate_request(self, request) -> str | None."""
    if result:
        return result
    model = getattr(request, "model", None)
    tm = serving.tokenizer_manager
    served = tm.served_model_name
    allowed = {served, getattr(tm, "model_path", served), "default"}
    if model is None or model in allowed or model.startswith(f"{served}:"):
        return None
    return f"The model '{model}' does not exist on this server; it serves '{served}'."


def _install_model_name_check() -> None:
    from sglang.srt.plugins.hook_registry import HookRegistry, HookType

    for target in _targets("._validate_request"):
        HookRegistry.register(target, check_model_name, HookType.AFTER)


# ---------------------------------------------------------------------------- host buffers on CPU
# SGLang's host-buffer allocators are a defaultdict keyed by device type: npu / musa / xpu pin through
# torch, every other key (so "cpu") gets alloc_with_host_register, which calls cudaHostRegister for a
# pinned request and raises "Found no NVIDIA driver" without CUDA. The routed-experts capturer
# (state_capturer/base.py BaseHostCache, built by ModelRunner.init_routed_experts_capturer) always asks
# for pinned memory under the model's device, so without this entry `--enable-return-routed-experts`
# kills the scheduler at startup on CPU. Pinning only serves DMA from an accelerator; on CPU the
# capturer's "device" cache is host memory already, and the readback (on_forward_end / finalize /
# get_topk) is plain CPU indexing. The other users of the table (HiCache host pools) key it by their
# device pool's type, so on a GPU machine they never read "cpu".
def alloc_host_unpinned(dims: tuple, dtype, device: str, pin_memory: bool, allocator=None,
                        registration_granularity_bytes: int | None = None):
    """ALLOC_MEMORY_FUNCS["cpu"]: SGLang's allocator signature; the storage allocator's memory
    (anonymous mmap by default) without cudaHostRegister. `pin_memory` has nothing to pin for."""
    import torch

    if allocator is not None:
        return allocator.allocate(dims, dtype=dtype, device="cpu")
    return torch.empty(dims, dtype=dtype, device="cpu")


def _install_cpu_host_alloc() -> None:
    (target,) = _targets(".ALLOC_MEMORY_FUNCS")
    alloc_funcs = resolve(target)
    # Replace only SGLang's CUDA-registering default (a lookup may already have stored it under
    # "cpu"); an explicit CPU allocator from a future SGLang wins.
    if alloc_funcs.get("cpu") in (None, alloc_funcs.default_factory()):
        alloc_funcs["cpu"] = alloc_host_unpinned


# ---------------------------------------------------------------------------- model registry
def _install_model_package() -> None:
    import sys

    if "sglang.srt.models.registry" not in sys.modules and not os.environ.get("SGLANG_EXTERNAL_MODEL_PACKAGE"):
        # Inherited by the scheduler subprocesses, whose registry import happens before plugins load.
        os.environ["SGLANG_EXTERNAL_MODEL_PACKAGE"] = EXTERNAL_PACKAGE
        return
    register_model_class()


def register_model_class() -> None:
    from sglang.srt.models.registry import ModelRegistry

    if ARCHITECTURE not in ModelRegistry.models:
        from sglang_dsv41.sglang.deepseek_v41 import DeepseekV41ForCausalLM

        ModelRegistry.models[ARCHITECTURE] = DeepseekV41ForCausalLM


# ---------------------------------------------------------------------------- server args
def _on_our_cpu_platform() -> bool:
    from sglang.srt.platforms import current_platform

    return type(current_platform).__name__ == "Dsv41CpuPlatform"


def resolve_alias_step(server_args, previous) -> None:
    """Wrapper of SGLang's handle_model_source_paths."""
    from sglang.srt.arg_groups.overrides import declare_resolution, resolving_view

    cfg = resolving_view(server_args)
    path, served = resolve_model_name(cfg.model_path)
    if path != cfg.model_path:
        fields = {"model_path": path}
        if cfg.tokenizer_path in (None, cfg.model_path):
            fields["tokenizer_path"] = path
        if cfg.served_model_name is None and served:
            fields["served_model_name"] = served
        logger.info("sglang-dsv41: model %r -> %s", cfg.model_path, path)
        declare_resolution(server_args, "sglang_dsv41.resolve_alias", **fields)
    previous(server_args)


def cpu_device_step(server_args, previous) -> None:
    """Wrapper of SGLang's handle_missing_default_values: on our CPU platform the device is 'cpu'
    (SGLang's get_device() knows no device when CUDA is absent and its CPU engine is off)."""
    from sglang.srt.arg_groups.overrides import declare_resolution, resolving_view

    if resolving_view(server_args).device is None and _on_our_cpu_platform():
        declare_resolution(server_args, "sglang_dsv41.cpu_device", device="cpu")
    previous(server_args)


def v41_overrides(server_args, hf_config) -> dict:
    """Provider registered for DeepseekV41ForCausalLM."""
    from sglang.srt.arg_groups.overrides import resolving_view

    cfg = resolving_view(server_args)
    on_cpu = cfg.device == "cpu"
    validate_flags(cfg, on_cpu)
    raw = dict(getattr(server_args, "_raw_input", None) or {})
    return v41_defaults(cfg, raw, on_cpu)


def _install_server_arg_hooks() -> None:
    from sglang.srt.arg_groups.model_override_base import register_model_override
    from sglang.srt.arg_groups.resolution_hooks import register_resolution_hook

    register_resolution_hook("handle_model_source_paths")(resolve_alias_step)
    register_resolution_hook("handle_missing_default_values")(cpu_device_step)
    register_model_override(ARCHITECTURE)(v41_overrides)


def install() -> None:
    """Register every hook. Called by the general plugin; SGLang's `load_plugins()` runs each plugin once
    per process (it guards itself) and then applies the HookRegistry hooks."""
    _install_model_package()
    _install_architecture_hook()
    _install_server_arg_hooks()
    _install_model_name_check()
    _install_cpu_host_alloc()

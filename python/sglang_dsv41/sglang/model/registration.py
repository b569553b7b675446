"""How SGLang finds our model class: the external model package, a direct registration when SGLang's
registry was imported first, and the checkpoint's architecture name kept through SGLang's config rewrite."""

from __future__ import annotations

import os
import sys

from sglang_dsv41.sglang.model.server_args import ARCHITECTURE

EXTERNAL_PACKAGE = "sglang_dsv41.sglang.model"
"""SGLang's registry imports every module directly in this package and collects each `EntryClass`."""
PROCESSOR_PACKAGE = "sglang_dsv41.sglang.processor"
"""SGLang's tokenizer manager imports this package's processors for a checkpoint with a vision tower."""


def use_model_package() -> None:
    """Point SGLang's registry at EXTERNAL_PACKAGE (`SGLANG_EXTERNAL_MODEL_PACKAGE`, which also defers the
    in-tree model zoo); when the registry is already imported, register our class into it directly."""
    # the image processor of our class (a checkpoint with a vision tower); a package the user named stays
    os.environ.setdefault("SGLANG_EXTERNAL_MM_PROCESSOR_PACKAGE", PROCESSOR_PACKAGE)
    if "sglang.srt.models.registry" not in sys.modules and not os.environ.get("SGLANG_EXTERNAL_MODEL_PACKAGE"):
        # Inherited by the scheduler subprocesses, whose registry import happens before plugins load.
        os.environ["SGLANG_EXTERNAL_MODEL_PACKAGE"] = EXTERNAL_PACKAGE
        return
    register_model_class()


def register_model_class() -> None:
    from sglang.srt.models.registry import ModelRegistry

    if ARCHITECTURE not in ModelRegistry.models:
        from sglang_dsv41.sglang.model.deepseek_v41 import DeepseekV41ForCausalLM

        ModelRegistry.models[ARCHITECTURE] = DeepseekV41ForCausalLM


def keep_v41_architecture(result: dict, values, *args, **kwargs):
    """AFTER hook on normalize_deepseek_v41_config(values) -> dict. For our checkpoint the architecture
    stays ours (SGLang renames it to its CUDA-only V4 class). A vision tower (`vision_n_layers` > 0) stays
    in the config: SGLang then serves the checkpoint as a vision model, with our image processor
    (PROCESSOR_PACKAGE) and the model's image path (docs/vision.md)."""
    src = values.get("architectures") if hasattr(values, "get") else None
    if src == [ARCHITECTURE] and result.get("architectures") != [ARCHITECTURE]:
        result = dict(result)
        result["architectures"] = [ARCHITECTURE]
    return result


def language_model_only(original, server_args, *args, **kwargs):
    """AROUND hook on handle_language_model_only(server_args): SGLang keeps a class-level tuple of the
    architectures that may drop their vision tower; during this call ours is in it (the adapter builds
    `cfg.text_only()` under the flag). Resolution forbids writing the instance, so the class holds the
    longer tuple for the call only."""
    cls = type(server_args)
    allowed = tuple(cls.LANGUAGE_MODEL_ONLY_ARCHITECTURES)
    if ARCHITECTURE in allowed:
        return original(server_args, *args, **kwargs)
    cls.LANGUAGE_MODEL_ONLY_ARCHITECTURES = (*allowed, ARCHITECTURE)
    try:
        return original(server_args, *args, **kwargs)
    finally:
        cls.LANGUAGE_MODEL_ONLY_ARCHITECTURES = allowed

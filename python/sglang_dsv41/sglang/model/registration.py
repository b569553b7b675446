"""How SGLang finds our model class: the external model package, a direct registration when SGLang's
registry was imported first, and the checkpoint's architecture name kept through SGLang's config rewrite."""

from __future__ import annotations

import os
import sys

from sglang_dsv41.sglang.model.server_args import ARCHITECTURE

EXTERNAL_PACKAGE = "sglang_dsv41.sglang.model"
"""SGLang's registry imports every module directly in this package and collects each `EntryClass`."""


def use_model_package() -> None:
    """Point SGLang's registry at EXTERNAL_PACKAGE (`SGLANG_EXTERNAL_MODEL_PACKAGE`, which also defers the
    in-tree model zoo); when the registry is already imported, register our class into it directly."""
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
    """AFTER hook on normalize_deepseek_v41_config(values) -> dict. For our checkpoint: the architecture
    stays ours, and the config SGLang builds its server from is the text model's (vision_n_layers 0), so
    SGLang does not take it for a multimodal model. The adapter serves text only; image requests get a
    400 (requests/validation.py), the vision tower is not loaded (docs/vision.md "Not built")."""
    src = values.get("architectures") if hasattr(values, "get") else None
    if src == [ARCHITECTURE] and (result.get("architectures") != [ARCHITECTURE] or result.get("vision_n_layers")):
        result = dict(result)
        result["architectures"] = [ARCHITECTURE]
        result["vision_n_layers"] = 0
    return result

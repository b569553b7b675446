"""Model names that resolve to embedded checkpoints: trained ones shipped in the package, random ones
generated on first use into a cache dir.

`deepseek-v4.1-tiny` (the default for CPU serving) is the trained checkpoint shipped in the package,
`assets/deepseek-v4.1-tiny/` (the `mini-digits` preset after supervised QAT on the arithmetic task,
train/sft.py; its `training.json` records the command, accuracies and generator versions), or the
random `tiny` preset if that directory is absent. `deepseek-v4.1-tiny-random` (tests),
`deepseek-v4.1-mini-random` and `deepseek-v4.1-small` are seeded random presets of
`sglang_dsv41.tiny`. The cache dir is `$SGLANG_DSV41_CACHE` or
`~/.cache/sglang_dsv41`, one subdirectory per alias and generator version (a generator change
never serves stale bytes); generation writes into a temporary sibling and renames it into place, so
concurrent first uses never see a half-written checkpoint.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path

ASSETS = Path(__file__).resolve().parent / "assets"
TRAINED_MODELS = {"deepseek-v4.1-tiny": "deepseek-v4.1-tiny"}
"""alias -> checkpoint directory under ASSETS (used when it exists)."""
EMBEDDED_MODELS = {
    "deepseek-v4.1-tiny": "tiny",  # random fallback when the trained asset is absent
    "deepseek-v4.1-tiny-random": "tiny",
    "deepseek-v4.1-mini-random": "mini",
    "deepseek-v4.1-small": "small",
}


def cache_dir() -> Path:
    return Path(os.environ.get("SGLANG_DSV41_CACHE", Path.home() / ".cache" / "sglang_dsv41"))


def resolve_model_path(name_or_path: str | os.PathLike) -> Path:
    """A checkpoint directory for `name_or_path`: an existing directory, or an embedded alias."""
    p = Path(name_or_path)
    if p.is_dir():
        return p
    trained = TRAINED_MODELS.get(str(name_or_path))
    if trained is not None and (ASSETS / trained / "config.json").exists():
        return ASSETS / trained
    preset = EMBEDDED_MODELS.get(str(name_or_path))
    if preset is None:
        known = ", ".join(sorted(EMBEDDED_MODELS))
        raise FileNotFoundError(f"model '{name_or_path}' is neither a checkpoint directory nor an embedded model ({known})")
    from sglang_dsv41.tiny import GENERATOR_VERSION, write_tiny_checkpoint

    target = cache_dir() / f"{name_or_path}-g{GENERATOR_VERSION}"
    if (target / "config.json").exists():
        return target

    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{target.name}-", dir=target.parent))
    try:
        write_tiny_checkpoint(tmp, preset)
        try:
            os.replace(tmp, target)
        except OSError:  # another process won the race; its copy is identical
            shutil.rmtree(tmp, ignore_errors=True)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
    return target

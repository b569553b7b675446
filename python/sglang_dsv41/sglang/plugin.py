"""General plugin (entry point `sglang.srt.plugins:dsv41`), run by SGLang's `load_plugins()` in the
main process (before argument parsing), the scheduler and the detokenizer."""

from __future__ import annotations

import os


def register() -> None:
    from sglang_dsv41.sglang.platform import _accelerator_present

    if not _accelerator_present():
        # Scalar ATen CPU kernels make a row's result independent of the batch (docs/numerics.md 4c).
        # Read once, at torch's first CPU kernel: set here, in the launching process, it reaches the
        # scheduler, which is spawned afterwards and inherits the environment.
        os.environ.setdefault("ATEN_CPU_CAPABILITY", "default")
    from sglang_dsv41.sglang import hooks

    hooks.install()

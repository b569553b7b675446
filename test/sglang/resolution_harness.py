"""Our resolution rows installed through SGLang's own registries (HookRegistry, resolution hooks, model override
providers) for one test at a time, restored by pytest's monkeypatch afterwards. Shared by the server-arg tests
(test_dspark_args.py, test_rl_args.py)."""

from __future__ import annotations

import sys
from collections import defaultdict
from types import ModuleType

from sglang_dsv41.sglang import hooks
from sglang_dsv41.sglang.model.server_args import ARCHITECTURE


def keep_bindings(monkeypatch, target: str) -> None:
    """Let monkeypatch restore `target` and every module's `from ... import` of it after HookRegistry patched them."""
    owner, attr = target.rsplit(".", 1)
    original = hooks.resolve(target)
    monkeypatch.setattr(hooks.resolve(owner), attr, original)
    for mod in [m for m in list(sys.modules.values()) if isinstance(m, ModuleType)]:
        for name, value in list(vars(mod).items()):
            if value is original:
                monkeypatch.setattr(mod, name, original)


def install(monkeypatch, rows) -> None:
    """`rows` applied as hooks.install applies them, into emptied registries that monkeypatch restores."""
    from sglang.srt.arg_groups import model_override_base, resolution_hooks
    from sglang.srt.plugins.hook_registry import HookRegistry

    monkeypatch.setattr(resolution_hooks, "_HOOKS", {})
    monkeypatch.setitem(model_override_base._MODEL_OVERRIDE_FNS, ARCHITECTURE, [])
    monkeypatch.setattr(HookRegistry, "_hooks", defaultdict(list))
    monkeypatch.setattr(HookRegistry, "_patched", set())
    for row in rows:
        if row.kind in (hooks.BEFORE, hooks.AFTER, hooks.AROUND):
            keep_bindings(monkeypatch, row.target)
        hooks.apply(row)
    HookRegistry.apply_hooks()

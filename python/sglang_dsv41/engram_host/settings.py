"""The Engram host-table switches (spec model 5.5, mode 2), read once at startup.

    SGLANG_ENABLE_DSV41_ENGRAM_HOST_TABLE      unset / "" / 0 / false / off: tables stay with the other
                                               weights (default); 1 / true / on: tables in host memory
    SGLANG_DSV41_ENGRAM_HOST_TABLE_LAYOUT      shared (default): one copy per node, mapped by every rank;
                                               per_rank: each rank holds only its own row shard

Any other value raises `HostTableSettingsError` naming the variable, the value and the allowed
values; a layout given while the table is off is still validated (a typo must not pass silently).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Mapping

ENABLE_ENV = "SGLANG_ENABLE_DSV41_ENGRAM_HOST_TABLE"
LAYOUT_ENV = "SGLANG_DSV41_ENGRAM_HOST_TABLE_LAYOUT"
LAYOUTS = ("shared", "per_rank")
_ON = ("1", "true", "on", "yes")
_OFF = ("", "0", "false", "off", "no")


class HostTableSettingsError(ValueError):
    """An Engram host-table variable holds a value outside its allowed set."""


@dataclass(frozen=True)
class HostTableSettings:
    enabled: bool = False
    layout: str = "shared"
    """'shared' or 'per_rank' (see the module docstring)."""

    def __post_init__(self) -> None:
        if self.layout not in LAYOUTS:
            raise HostTableSettingsError(_bad(LAYOUT_ENV, self.layout, LAYOUTS))

    @staticmethod
    def from_env(environ: Mapping[str, str] | None = None) -> "HostTableSettings":
        env = os.environ if environ is None else environ
        raw_on = env.get(ENABLE_ENV, "")
        on = raw_on.strip().lower()
        if on not in _ON + _OFF:
            raise HostTableSettingsError(_bad(ENABLE_ENV, raw_on, ("1", "0") + _ON[1:] + _OFF[2:]))
        layout = env.get(LAYOUT_ENV, "").strip() or "shared"
        if layout not in LAYOUTS:
            raise HostTableSettingsError(_bad(LAYOUT_ENV, env.get(LAYOUT_ENV, ""), LAYOUTS))
        return HostTableSettings(enabled=on in _ON, layout=layout)


def _bad(var: str, value: str, allowed: tuple[str, ...]) -> str:
    return f"{var}={value!r} is not a valid value; allowed: {', '.join(allowed)}"

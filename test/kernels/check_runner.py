"""Runs named checks of an interpreter script, one 'PASS name' / 'FAIL name: reason' line each."""

from __future__ import annotations

from typing import Callable, Iterable


def run_checks(checks: Iterable[tuple[str, Callable[[], None]]]) -> int:
    """Run every check (a failure does not stop the others) -> exit code: 1 if any failed, else 0."""
    bad = 0
    for name, fn in checks:
        try:
            fn()
            print(f"PASS {name}", flush=True)
        except Exception as e:  # noqa: BLE001 - report every case
            bad += 1
            print(f"FAIL {name}: {type(e).__name__}: {str(e)[:300]}", flush=True)
    return 1 if bad else 0

"""Kernel tests: helpers (kernel_cases, kernel_compare) live beside the tests."""

from __future__ import annotations


def pytest_configure(config):
    config.addinivalue_line("markers", "interp: runs Triton kernels through the CPU interpreter (about 15 s)")

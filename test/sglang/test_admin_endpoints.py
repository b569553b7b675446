"""The admin-route rules of `sglang_dsv41.sglang.admin_endpoints` without a server (the routes themselves:
test/server/test_robustness.py::test_admin_profile_and_memory_routes_keep_the_server)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from sglang_dsv41.sglang.admin_endpoints import PROFILER_ACTIVITIES, output_dir_error, profile_request_error


def _req(**kw):
    return SimpleNamespace(**{"activities": None, "num_steps": None, "start_step": None, "output_dir": None, **kw})


@pytest.mark.parametrize("kw, cpu, fragment", [
    (dict(activities=["XYZ"]), False, "'XYZ' is not one of"),
    (dict(activities=[]), False, "non-empty"),
    (dict(activities="CPU"), False, "non-empty"),
    (dict(activities=["GPU"]), True, "CPU only"),
    (dict(num_steps=0), False, "num_steps"),
    (dict(num_steps=True), False, "num_steps"),
    (dict(start_step=-1), False, "start_step"),
    (dict(output_dir=""), False, "output_dir"),
    (dict(output_dir="/proc/no/such"), False, "output_dir"),
])
def test_profile_request_refused(kw, cpu, fragment):
    error = profile_request_error(_req(**kw), cpu_platform=cpu)
    assert error is not None and fragment in error, error


def test_profile_request_accepted(tmp_path):
    assert profile_request_error(_req(), cpu_platform=True) is None
    assert profile_request_error(_req(activities=["CPU"], num_steps=3, start_step=0), cpu_platform=True) is None
    assert profile_request_error(_req(activities=list(PROFILER_ACTIVITIES)), cpu_platform=False) is None
    new = tmp_path / "a" / "b"
    assert output_dir_error(str(new)) is None and new.is_dir()  # created, as the profiler would at stop


def test_output_dir_that_is_a_file(tmp_path):
    f = tmp_path / "f"
    f.write_text("x")
    assert "output_dir" in output_dir_error(str(f))
    assert "output_dir" in output_dir_error(str(f / "sub"))

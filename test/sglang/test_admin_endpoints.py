"""The admin-route rules of `sglang_dsv41.sglang.requests.admin_endpoints` without a server (the routes themselves:
test/server/test_robustness.py::test_admin_profile_and_memory_routes_keep_the_server)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from sglang_dsv41.sglang.requests.admin_endpoints import (
    PROFILER_ACTIVITIES,
    logging_request_error,
    output_dir_error,
    profile_request_error,
    weight_group_error,
)


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


def _group(**kw):
    return SimpleNamespace(**{"master_address": "127.0.0.1", "master_port": 1, "rank_offset": 1, "world_size": 2,
                              "backend": "gloo", **kw})


@pytest.mark.parametrize("kw, tp, cpu, fragment", [
    (dict(backend="nccl"), 1, True, "not available on the CPU platform"),
    (dict(world_size=1), 1, False, "world_size"),
    (dict(rank_offset=2), 1, False, "rank_offset"),
    (dict(rank_offset=1, world_size=2), 2, False, "rank_offset"),  # two TP ranks from 1 need a world of 3
    (dict(master_port=0), 1, False, "master_port"),
    (dict(), 1, False, "nothing answers"),  # port 1: connection refused
])
def test_weight_group_refused(kw, tp, cpu, fragment):
    error = weight_group_error(_group(**kw), tp, cpu)
    assert error is not None and fragment in error, error


def test_weight_group_hosted_here_is_not_probed():
    """rank_offset 0: this server hosts the group's store and waits for the trainer (the protocol)."""
    assert weight_group_error(_group(rank_offset=0), 1, cpu_platform=True) is None


@pytest.mark.parametrize("kw, fragment", [
    (dict(log_requests_level=99), "log_requests_level"), (dict(log_requests_level=True), "log_requests_level"),
    (dict(log_requests_format="xml"), "log_requests_format"), (dict(log_level="loud"), "log_level"),
    (dict(dump_requests_threshold=0), "dump_requests_threshold"), (dict(crash_dump_folder="/proc/x"), "crash_dump_folder"),
])
def test_logging_refused(kw, fragment):
    obj = SimpleNamespace(**kw)
    error = logging_request_error(obj)
    assert error is not None and fragment in error, error


def test_logging_accepted():
    assert logging_request_error(SimpleNamespace(log_requests=True, log_requests_level=3, log_requests_format="json",
                                                 log_level="warning")) is None


def test_profile_output_dir_confined_to_the_profile_directory(tmp_path):
    """`output_dir` must resolve inside the profile directory (SGLANG_TORCH_PROFILER_DIR): `..`, absolute paths
    elsewhere and symlinks out are refused naming the field (and without the server's directory); a relative path
    is taken inside it; `profile_prefix` / `profile_id` are file-name parts."""
    from sglang_dsv41.sglang.requests.admin_endpoints import confined_output_dir, file_part_error

    root, outside = tmp_path / "profiles", tmp_path / "outside"
    root.mkdir()
    outside.mkdir()
    (root / "link").symlink_to(outside)
    for path in ("../escape", str(root / ".." / "escape"), str(outside), "/etc", "link/x", "a/../../x", "~"):
        where, error = confined_output_dir(path, str(root))
        assert where is None and error.startswith("output_dir:") and str(root) not in error.replace(path, ""), path
        assert profile_request_error(_req(output_dir=path), cpu_platform=True, root=str(root)).startswith("output_dir")
    assert confined_output_dir("run1", str(root)) == (str(root / "run1"), None)
    assert confined_output_dir(str(root / "a" / ".." / "b"), str(root)) == (str(root / "b"), None)
    assert confined_output_dir(str(root), str(root)) == (str(root), None)
    assert profile_request_error(_req(output_dir="run2"), cpu_platform=True, root=str(root)) is None
    assert (root / "run2").is_dir() and list(outside.iterdir()) == []  # created inside, as the profiler would
    for name in ("profile_prefix", "profile_id"):
        assert file_part_error("../x", name).startswith(name) and file_part_error("ok-1.5", name) is None
        req = _req(**{name: "a/b"})
        assert profile_request_error(req, cpu_platform=True, root=str(root)).startswith(name)

"""Start and stop a real `python -m sglang.launch_server` (one per test module)."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import requests

STARTUP_TIMEOUT_S = float(os.environ.get("DSV41_SERVER_STARTUP_TIMEOUT", 420))


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@dataclass
class Server:
    url: str
    proc: subprocess.Popen
    log: Path
    startup_s: float

    def log_text(self) -> str:
        return self.log.read_text(errors="replace")


def start_server(model: str | os.PathLike, log: Path, *extra: str, env: dict | None = None,
                 unset: tuple[str, ...] = ()) -> Server:
    """Launch SGLang with only the flags a user would pass, wait for /health; kill on failure. The server gets this
    process's environment with `env` added and the variables in `unset` removed."""
    port = free_port()
    cmd = [sys.executable, "-m", "sglang.launch_server", "--model", str(model), "--host", "127.0.0.1",
           "--port", str(port), *extra]
    out = open(log, "w")
    t0 = time.monotonic()
    server_env = {k: v for k, v in {**os.environ, **(env or {})}.items() if k not in unset}
    proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, start_new_session=True, env=server_env)
    url = f"http://127.0.0.1:{port}"
    while time.monotonic() - t0 < STARTUP_TIMEOUT_S:
        if proc.poll() is not None:
            raise RuntimeError(f"server exited with {proc.returncode}:\n{log.read_text()[-4000:]}")
        try:
            if requests.get(url + "/health", timeout=2).status_code == 200:
                return Server(url, proc, log, time.monotonic() - t0)
        except requests.RequestException:
            pass
        time.sleep(1)
    stop_server(proc)
    raise RuntimeError(f"server not healthy after {STARTUP_TIMEOUT_S}s:\n{log.read_text()[-4000:]}")


def stop_server(proc: subprocess.Popen) -> None:
    if proc.poll() is not None:
        return
    try:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(timeout=20)
    except (subprocess.TimeoutExpired, ProcessLookupError):
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        proc.wait(timeout=10)

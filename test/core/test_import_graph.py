"""CPU: the package import graph (project issue 8, "kernels as a transformation").

- The engine-agnostic core (`sglang_dsv41.layers` and all its submodules, `reference`, `config`,
  `quant`) imports no kernel package (`dsv41_kernels*`) and not SGLang itself (`sglang`, `sglang.*`).
- The kernel package (`dsv41_kernels` and every module in it, Triton modules included when Triton
  is installed) imports nothing from `sglang_dsv41.layers`.
- The numerics policy (`sglang_dsv41.numerics`: the policy object and `apply_numerics`), which the
  layers import for their slot declarations, imports no layer, no kernel package, no SGLang and
  nothing of `train` (the op table is handed to it).
Each half runs in a fresh interpreter (`python -c`) so that no other test's imports count. Oracle:
`sys.modules` after the imports.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

_PRELUDE = f"""
import importlib, json, pkgutil, sys
sys.path[:0] = [{str(ROOT / "python")!r}, {str(ROOT / "sgl-kernel")!r}]
def walk(name):
    mod = importlib.import_module(name)
    names = [name]
    for info in pkgutil.walk_packages(getattr(mod, "__path__", []), name + "."):
        if info.name.endswith("__main__"):
            continue
        importlib.import_module(info.name)
        names.append(info.name)
    return names
"""

_CORE = _PRELUDE + """
imported = []
for name in ("sglang_dsv41.layers", "sglang_dsv41.reference", "sglang_dsv41.config", "sglang_dsv41.quant",
             "sglang_dsv41.numerics"):
    imported += walk(name)
bad = sorted(m for m in sys.modules if m.split(".")[0] in ("dsv41_kernels", "sglang"))
print(json.dumps({"imported": imported, "bad": bad}))
"""

_KERNELS = _PRELUDE + """
import importlib.util
have_triton = importlib.util.find_spec("triton") is not None
imported = walk("dsv41_kernels") if have_triton else []
if not have_triton:  # the Triton modules cannot import; every other module must
    pkg = importlib.import_module("dsv41_kernels")
    for info in pkgutil.iter_modules(pkg.__path__, "dsv41_kernels."):
        if not (info.name.endswith("_triton") or info.name.endswith("triton_numerics")):
            importlib.import_module(info.name)
            imported.append(info.name)
bad = sorted(m for m in sys.modules if m == "sglang_dsv41.layers" or m.startswith("sglang_dsv41.layers."))
print(json.dumps({"imported": imported, "bad": bad}))
"""


_POLICY = _PRELUDE + """
imported = walk("sglang_dsv41.numerics")
bad = sorted(m for m in sys.modules if m.split(".")[0] in ("dsv41_kernels", "sglang")
             or m.startswith(("sglang_dsv41.layers", "sglang_dsv41.train", "sglang_dsv41.runtime")))
print(json.dumps({"imported": imported, "bad": bad}))
"""


def _run(code: str) -> dict:
    env = dict(os.environ, PYTHONWARNINGS="ignore")
    res = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert res.returncode == 0, res.stderr[-3000:]
    return json.loads(res.stdout.strip().splitlines()[-1])


def test_core_imports_no_kernels_and_no_sglang():
    out = _run(_CORE)
    assert "sglang_dsv41.layers.sparse_attention" in out["imported"] and "sglang_dsv41.quant.fp8" in out["imported"]
    assert out["bad"] == [], f"the core imported {out['bad']}"


def test_kernel_package_imports_no_layers():
    out = _run(_KERNELS)
    assert {"dsv41_kernels.ops", "dsv41_kernels.twin_math", "dsv41_kernels.registry"} <= set(out["imported"])
    assert out["bad"] == [], f"dsv41_kernels imported {out['bad']}"


def test_numerics_policy_imports_no_layers_kernels_or_train():
    out = _run(_POLICY)
    assert out["imported"] == ["sglang_dsv41.numerics"]
    assert out["bad"] == [], f"sglang_dsv41.numerics imported {out['bad']}"

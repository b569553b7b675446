"""CPU: the package import graph (project issue 8, "kernels as a transformation").

- The engine-agnostic core (`sglang_dsv41.layers` and all its submodules, `reference`, `config`,
  `quant`) imports no kernel package (`dsv41_kernels*`) and not SGLang itself (`sglang`, `sglang.*`).
- The kernel package (`dsv41_kernels` and every module in it, Triton modules included when Triton
  is installed) imports nothing from `sglang_dsv41.layers`, and of `sglang_dsv41` only the pure core
  modules in KERNEL_MAY_IMPORT (storage formats, the fixed-order reductions, the shared math that the
  layers import too): a twin that needs layer math imports it from `shared_math`, never copies it.
- The numerics policy (`sglang_dsv41.numerics`: the policy object and `apply_numerics`), which the
  layers import for their slot declarations, imports no layer, no kernel package, no SGLang and
  nothing of `train` (the op table is handed to it).
Each half runs in a fresh interpreter (`python -c`) so that no other test's imports count. Oracle:
`sys.modules` after the imports.
- In the SGLang adapter, the request rules (`sglang_dsv41.sglang.requests`) import neither the hook
  installer (`hooks`, `plugin`) nor the model adapter (`model`), and the model adapter imports neither
  the request rules nor the installer. Oracle: every import statement of each module's source, those
  inside functions included (`ast`), and `sys.modules` after importing the request rules.
"""

from __future__ import annotations

import ast
import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

KERNEL_MAY_IMPORT = {"sglang_dsv41", "sglang_dsv41.determinism", "sglang_dsv41.quant", "sglang_dsv41.quant.fp4",
                     "sglang_dsv41.quant.fp8", "sglang_dsv41.quant.layouts", "sglang_dsv41.quant.ste",
                     "sglang_dsv41.reduction",
                     "sglang_dsv41.shared_math"}

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
core = sorted(m for m in sys.modules if m.split(".")[0] == "sglang_dsv41")
print(json.dumps({"imported": imported, "core": core}))
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
    assert {"dsv41_kernels.ops", "dsv41_kernels.registry", "dsv41_kernels.attention"} <= set(out["imported"])
    assert "sglang_dsv41.shared_math" in out["core"]
    layers = [m for m in out["core"] if m == "sglang_dsv41.layers" or m.startswith("sglang_dsv41.layers.")]
    assert layers == [], f"dsv41_kernels imported {layers}"
    assert set(out["core"]) <= KERNEL_MAY_IMPORT, f"dsv41_kernels imported {sorted(set(out['core']) - KERNEL_MAY_IMPORT)}"


ADAPTER = ROOT / "python" / "sglang_dsv41" / "sglang"
INSTALLER = ("sglang_dsv41.sglang.hooks", "sglang_dsv41.sglang.plugin")


def _imported_names(path: Path, package: str) -> set[str]:
    """Every module an import statement in `path` names (function-level imports too; relative ones
    resolved against `package`). `from a import b` counts as both `a` and `a.b`."""
    names = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            names |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom):
            base = ".".join(package.split(".")[:len(package.split(".")) - node.level + 1]) if node.level else ""
            module = ".".join(p for p in (base, node.module or "") if p)
            names |= {module} | {f"{module}.{alias.name}" for alias in node.names}
    return names


def _forbidden_imports(subpackage: str, forbidden: tuple[str, ...]) -> dict[str, list[str]]:
    bad = {}
    for path in sorted((ADAPTER / subpackage).glob("*.py")):
        names = _imported_names(path, f"sglang_dsv41.sglang.{subpackage}")
        hits = sorted(n for n in names if any(n == f or n.startswith(f + ".") for f in forbidden))
        if hits:
            bad[path.name] = hits
    return bad


def test_request_rules_import_neither_installer_nor_model_adapter():
    assert {"validation.py", "admission.py", "admin_endpoints.py"} <= {p.name for p in (ADAPTER / "requests").glob("*.py")}
    bad = _forbidden_imports("requests", INSTALLER + ("sglang_dsv41.sglang.model",))
    assert bad == {}, f"request rules import back from the installer or the model adapter: {bad}"


def test_model_adapter_imports_neither_installer_nor_request_rules():
    assert {"deepseek_v41.py", "kv_budget.py"} <= {p.name for p in (ADAPTER / "model").glob("*.py")}
    bad = _forbidden_imports("model", INSTALLER + ("sglang_dsv41.sglang.requests",))
    assert bad == {}, f"the model adapter imports the installer or the request rules: {bad}"


_REQUESTS = _PRELUDE + """
imported = walk("sglang_dsv41.sglang.requests")
bad = sorted(m for m in sys.modules if m in ("sglang_dsv41.sglang.hooks", "sglang_dsv41.sglang.plugin")
             or m.startswith("sglang_dsv41.sglang.model"))
print(json.dumps({"imported": imported, "bad": bad}))
"""


def test_importing_request_rules_loads_no_installer_and_no_model_adapter():
    out = _run(_REQUESTS)
    assert "sglang_dsv41.sglang.requests.admission" in out["imported"]
    assert out["bad"] == [], f"importing the request rules imported {out['bad']}"


def test_shared_math_imports_only_reduction_and_determinism():
    """`shared_math` is imported by layers and kernels alike: it must stay a leaf of the core."""
    out = _run(_PRELUDE + """
import sglang_dsv41.shared_math
print(json.dumps({"core": sorted(m for m in sys.modules if m.split(".")[0] == "sglang_dsv41")}))
""")
    assert out["core"] == ["sglang_dsv41", "sglang_dsv41.determinism", "sglang_dsv41.reduction", "sglang_dsv41.shared_math"], out["core"]


def test_numerics_policy_imports_no_layers_kernels_or_train():
    out = _run(_POLICY)
    assert out["imported"] == ["sglang_dsv41.numerics"]
    assert out["bad"] == [], f"sglang_dsv41.numerics imported {out['bad']}"

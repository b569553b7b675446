"""The SGLang adapter: everything that imports SGLang lives in this package.

  platform.py   out-of-tree CPU platform (entry point `sglang.srt.platforms`), CPU-only machines
  plugin.py     general plugin (entry point `sglang.srt.plugins`): CPU env, then `hooks.install()`
  hooks.py      the hook table: every hook into SGLang internals, one row each (target, kind, our function, why)
  model/        the model adapter: the model class SGLang builds (`deepseek_v41.py`, the only `EntryClass`),
                ForwardBatch -> runtime `Batch` (forward.py, decode_batch.py), KV budget, request windows,
                server-arg rules and resolution steps, CUDA graphs, Engram host tables, tensor parallelism,
                model registration, the CPU host allocator
  requests/     request hardening: validation rules (validation.py, stop_regex.py), the hook functions that
                apply them at admission (admission.py), Ollama / score / tokenize rules (other_endpoints.py),
                admin routes (admin_endpoints.py), HTTP error handlers (error_handlers.py)

Dependencies point one way: hooks.py imports both subpackages; `requests/` and `model/` import neither
hooks.py nor each other (test/core/test_import_graph.py). SGLang discovers `model/` as its external model
package (`SGLANG_EXTERNAL_MODEL_PACKAGE`, set by the plugin).
"""

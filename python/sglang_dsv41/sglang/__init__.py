"""The SGLang adapter: everything that imports SGLang lives in this package.

  platform.py     out-of-tree CPU platform (entry point `sglang.srt.platforms`), CPU-only machines
  plugin.py       general plugin (entry point `sglang.srt.plugins`): env, model registration, hooks
  hooks.py        every hook into SGLang internals, each naming the function it wraps and why
  server_args.py  V4.1 server-arg defaults and rejected features (plain functions, no SGLang import)
  cuda_graphs.py  SGLang's CUDA graphs off for V4.1 on CUDA (no capture-safe entry wired into SGLang's runners)
  forward.py      ForwardBatch -> runtime `Batch` (+ the Engram token-id store), logits output
  decode_batch.py pure-decode ForwardBatch -> fixed-shape `Batch` (no host read; capacity buckets)
  deepseek_v41.py the model class `DeepseekV41ForCausalLM` SGLang builds (EntryClass)
  report.py       the startup report block

SGLang discovers this package as its external model package (`SGLANG_EXTERNAL_MODEL_PACKAGE`, set by
the plugin); only `deepseek_v41.py` defines an `EntryClass`.
"""

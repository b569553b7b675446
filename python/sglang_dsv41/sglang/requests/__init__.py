"""Request hardening: what a request may be, and how a bad one is answered (a 4xx naming the field).

Rules are plain functions over SGLang's request objects and bodies; nothing here imports the model
adapter (`sglang_dsv41.sglang.model`) or the hook installer (`sglang_dsv41.sglang.hooks`).
"""

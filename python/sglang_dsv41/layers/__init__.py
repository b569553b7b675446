"""Layer modules shared by the reference forward, the runtime and (later) training.

Each module owns its checkpoint parameters (same names as the released checkpoint) and exposes
pure functions of its inputs; caches and cross-layer sharing live with the caller.
"""

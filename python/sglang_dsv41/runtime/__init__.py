"""Engine-agnostic paged runtime: the one forward over a small batch descriptor and paged pools.

`Batch` (batch.py) describes one forward; `KVPools` (pools.py) holds the caches; `PagedKV`
(paged_kv.py) is the forward's KV over them; `Runtime` (paged_runtime.py) runs the model;
`kernels.py` applies kernels to a built model; `driver.py` is the standalone prefill/decode loop.
Nothing here imports SGLang; the SGLang adapter maps its ForwardBatch onto `Batch`.
"""

from sglang_dsv41.layers.decisions import Decisions
from sglang_dsv41.layers.transformer import ForwardOutput
from sglang_dsv41.runtime.batch import Batch
from sglang_dsv41.runtime.paged_kv import PagedKV
from sglang_dsv41.runtime.paged_runtime import Runtime
from sglang_dsv41.runtime.pools import KVPools

__all__ = ["Batch", "Decisions", "ForwardOutput", "KVPools", "PagedKV", "Runtime"]

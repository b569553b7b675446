"""Engine-agnostic paged runtime: the reference math over a small batch descriptor and paged pools.

`Batch` (batch.py) describes one forward; `KVPools` (pools.py) holds the caches; `Runtime`
(model_runner.py) runs the model over them; `driver.py` is the standalone prefill/decode loop.
Nothing here imports SGLang; the SGLang adapter maps its ForwardBatch onto `Batch`.
"""

from sglang_dsv41.runtime.batch import Batch
from sglang_dsv41.runtime.model_runner import Replay, Runtime, RuntimeOutput
from sglang_dsv41.runtime.pools import KVPools

__all__ = ["Batch", "KVPools", "Replay", "Runtime", "RuntimeOutput"]

"""The `req_to_token` write of SGLang's speculative decode allocation, on our CPU platform.

`alloc_for_spec_decode` writes each request's newly allocated slots into `req_to_token` through
`assign_req_to_token_pool_func`, which takes SGLang's CPU path only where SGLang's own CPU engine
runs (`is_cpu()`); on our out-of-tree CPU platform it would launch a Triton kernel on host tensors.
"""

from __future__ import annotations

import torch


def assign_on_cpu(original, req_pool_indices: torch.Tensor, req_to_token: torch.Tensor, start_offset: torch.Tensor,
                  end_offset: torch.Tensor, out_cache_loc: torch.Tensor, batch_size: int, *args, **kwargs):
    """AROUND hook: request r = req_pool_indices[i] gets req_to_token[r, start[i]:end[i]] = the next
    end[i] - start[i] entries of out_cache_loc (requests in order); elsewhere SGLang's kernel."""
    if req_to_token.device.type != "cpu":
        return original(req_pool_indices, req_to_token, start_offset, end_offset, out_cache_loc, batch_size,
                        *args, **kwargs)
    off = 0
    for r, a, b in zip(req_pool_indices[:batch_size].tolist(), start_offset[:batch_size].tolist(),
                       end_offset[:batch_size].tolist()):
        req_to_token[r, a:b] = out_cache_loc[off : off + b - a].to(req_to_token.dtype)
        off += b - a
    return None

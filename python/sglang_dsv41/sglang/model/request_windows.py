"""Encoder SWA bounded replay in the adapter: which request's window each request slot's ring holds.

With `--enable-encoder-swa-bounded-replay` the window KV lives in per-request-slot rings
(`KVPools(window_rings=True)`, layout in runtime/pools.py) and SGLang's prefix cache shares only
compressed KV and index keys. A request slot's ring is valid for a request when the slot's last
forward was that request's and ended exactly where this forward starts (a chunked-prefill
continuation or a decode step). Anything else starts a new window (SGLang's `resets_swa_window`: a
new request slot or a retracted request): the ring is cleared and, on a prefix hit of P cached
tokens, the last min(P, 128) of them are recomputed in front of the new tokens (their window KV
only). SGLang's scheduler charges those rows to the chunk budget when its flag is on.
"""

from __future__ import annotations

from sglang_dsv41.runtime.pools import KVPools


class RequestWindows:
    def __init__(self, pools: KVPools, window: int):
        self.pools, self.window = pools, window
        self.owner: dict[int, object] = {}  # request slot -> rid whose window its ring holds
        self.next_pos: dict[int, int] = {}  # request slot -> first position not yet in the ring

    def plan(self, rids: list, req_slots: list[int], prefix_lens: list[int]) -> list[int]:
        """Replay rows per request of an extend forward (0 = the ring continues); resets the rings
        of requests that start a new window."""
        out = []
        for rid, slot, p in zip(rids, req_slots, prefix_lens):
            if rid is not None and self.owner.get(slot) == rid and self.next_pos.get(slot) == p:
                out.append(0)
                continue
            if p % 2:
                raise ValueError("encoder SWA replay requires an even cached-prefix boundary "
                                 f"(cached prefix of {p} tokens; the page size must be even)")
            self.pools.clear_request(slot)
            out.append(min(p, self.window))
        return out

    def check_decode(self, rids: list, req_slots: list[int], prefix_lens: list[int]) -> None:
        """A decode step needs its request's ring (it reads the last window from it)."""
        for rid, slot, p in zip(rids, req_slots, prefix_lens):
            if self.owner.get(slot) != rid or self.next_pos.get(slot) != p:
                raise RuntimeError(f"encoder SWA replay: request {rid} decodes at position {p} but the window ring of "
                                   f"request slot {slot} holds request {self.owner.get(slot)} up to {self.next_pos.get(slot)}")

    def advance(self, rids: list, req_slots: list[int], ends: list[int]) -> None:
        for rid, slot, e in zip(rids, req_slots, ends):
            self.owner[slot], self.next_pos[slot] = rid, e

"""SGLang's sliding-window (SWA) bounded-replay seams, for our model: our window KV is per token slot in
SGLang's generic pool, and encoder replay runs inside our forward (request_windows.py)."""

from __future__ import annotations

from sglang_dsv41.sglang.model.server_args import REPLAY_WINDOW


def cap_match_for_decoder_replay(result, cache, *args, **kwargs):
    """AFTER hook on UnifiedRadixCache.swa_reprefill_tail_tokens(req) -> int."""
    if result or not getattr(cache, "decoder_swa_bounded_replay", False):
        return result
    from sglang.srt.runtime_context import get_exec

    return 0 if get_exec().features.enable_encoder_swa_bounded_replay else REPLAY_WINDOW


def skip_encoder_replay_forward(original, worker, batch, *args, **kwargs):
    """AROUND hook on run_encoder_swa_replay(worker, batch): our model replays inside its forward."""
    if hasattr(worker.model_runner.model, "windows"):
        return None
    return original(worker, batch, *args, **kwargs)

"""Weight updates into our model: validated whole and staged before anything is touched, refused with
a message (HTTP 400) that names the file or field, never the scheduler's end (docs/sglang.md "Weight updates").

SGLang's own paths end the scheduler on a bad update: its disk loader raises on a malformed shard or
index and its rollback re-reads the same files; its tensor path unpickles the payload (SGLang's
allowlist still lets a pickle call functions) and raises on an unknown `load_format`. For our model:
- disk: `checkpoint/update.py` reads the directory (confined, regular files, bounds-checked headers,
  schema, finite data) into host memory, then `swap_in` copies it into the parameters;
- tensor: each TP rank's payload is the bytes of one safetensors file (base64 over HTTP), decoded by
  the same reader; nothing is unpickled;
- the served model name and path stay what clients use.
Other models go straight to SGLang.
"""

from __future__ import annotations

import logging

from sglang_dsv41.sglang.model.server_args import ARCHITECTURE

logger = logging.getLogger(__name__)

DISK_LOAD_FORMATS = ("auto", "safetensors")
REFUSED = "weight update refused, the served weights are unchanged: "


def _ours(model) -> bool:
    return hasattr(model, "stage_update_dir")


def update_from_disk(original, updater, model_path, load_format=None, weight_name_filter=None, *args, **kwargs):
    """AROUND WeightUpdater.update_weights_from_disk -> (success, message)."""
    model = updater.get_model()
    if not _ours(model):
        return original(updater, model_path, load_format, weight_name_filter, *args, **kwargs)
    if load_format not in DISK_LOAD_FORMATS:
        return False, (REFUSED + f"load_format {str(load_format)[:64]!r} is not served for DeepSeek-V4.1; "
                       f"use one of {list(DISK_LOAD_FORMATS)}")
    try:
        staged = model.stage_update_dir(model_path)
        if weight_name_filter is not None:
            staged = {n: t for n, t in staged.items() if weight_name_filter(n)}
    except Exception as e:  # nothing was written: any failure to stage is the client's input
        logger.warning("%s%s", REFUSED, e)
        return False, REFUSED + str(e)
    model.swap_in(staged)
    return True, f"Succeeded to update model weights ({len(staged)} tensors)."


def decode_payload(original, worker, serialized_named_tensors):
    """AROUND TpModelWorker.deserialize_own_rank: for our model this rank's payload is safetensors bytes
    -> [(name, tensor)], validated; raises CheckpointError (caught by `refuse_bad_tensor_update`)."""
    model = worker.model_runner.model
    if not _ours(model):
        return original(worker, serialized_named_tensors)
    from sglang.srt.runtime_context import get_parallel

    from sglang_dsv41.checkpoint.errors import CheckpointError

    rank = get_parallel().tp_rank
    if not isinstance(serialized_named_tensors, list) or len(serialized_named_tensors) <= rank:
        raise CheckpointError(f"serialized_named_tensors must hold one payload per TP rank (rank {rank} has none)")
    payload = serialized_named_tensors[rank]
    if not isinstance(payload, (bytes, bytearray, memoryview)):
        raise CheckpointError(f"serialized_named_tensors[{rank}] must be bytes")
    where = f"serialized_named_tensors[{rank}]"
    return list(model.stage_update_payload(bytes(payload), where).items())


def refuse_bad_tensor_update(original, manager, recv_req):
    """AROUND SchedulerWeightUpdaterManager.update_weights_from_tensor: for our model only the plain
    payload format, and a payload or tensor our checks refuse is a failed update, not an exception."""
    if not _ours(manager.tp_worker.model_runner.model):
        return original(manager, recv_req)
    from sglang.srt.managers.io_struct import UpdateWeightsFromTensorReqOutput

    from sglang_dsv41.checkpoint.errors import CheckpointError

    if recv_req.load_format is not None:
        return UpdateWeightsFromTensorReqOutput(success=False, message=(
            REFUSED + f"load_format {str(recv_req.load_format)[:64]!r}: DeepSeek-V4.1 takes safetensors bytes "
            "with no load_format"))
    try:
        return original(manager, recv_req)
    except CheckpointError as e:
        logger.warning("%s%s", REFUSED, e)
        return UpdateWeightsFromTensorReqOutput(success=False, message=REFUSED + str(e))


def keep_served_name(original, manager, model_path, load_format):
    """AROUND TokenizerManager._update_model_path_info: SGLang renames the served model to the update's
    directory after a disk update (clients naming the model then got 400). For our model the served name
    and the model path stay; the update is still recorded."""
    config = getattr(getattr(manager, "model_config", None), "hf_config", None)
    if ARCHITECTURE not in (getattr(config, "architectures", None) or []):
        return original(manager, model_path, load_format)
    name, path = manager.served_model_name, manager.model_path
    original(manager, model_path, load_format)
    manager.served_model_name, manager.model_path = name, path

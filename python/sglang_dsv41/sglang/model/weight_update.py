"""Disk weight updates into our model, checked before SGLang reads a tensor."""

from __future__ import annotations


def check_weight_update(original, updater, model_path, *args, **kwargs):
    """AROUND hook on WeightUpdater.update_weights_from_disk(self, model_path, ...): refuse a disk weight update
    our model cannot take, before SGLang reads any tensor (-> (False, why), which the endpoint answers with a
    400). Other models go straight to SGLang."""
    check = getattr(updater.get_model(), "weight_update_error", None)
    error = check(model_path) if check is not None else None
    if error:
        return False, error  # SGLang logs the message
    return original(updater, model_path, *args, **kwargs)

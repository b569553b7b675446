"""Every parameter names its dtype: the tree built under a bf16 default dtype (as SGLang builds
models) has the same dtypes as under fp32, so no caller has to flip the process-wide default."""

from __future__ import annotations

import torch

from sglang_dsv41.layers.transformer import DeepseekV41
from sglang_dsv41.config import ModelConfig
from sglang_dsv41.tiny import PRESETS, hf_config


def test_parameter_dtypes_do_not_follow_the_default_dtype():
    cfg = ModelConfig.from_hf(hf_config(PRESETS["tiny"], 1024, 64))
    prev = torch.get_default_dtype()
    try:
        with torch.device("meta"):
            torch.set_default_dtype(torch.float32)
            a = {n: p.dtype for n, p in DeepseekV41(cfg).named_parameters()}
            torch.set_default_dtype(torch.bfloat16)
            b = {n: p.dtype for n, p in DeepseekV41(cfg).named_parameters()}
    finally:
        torch.set_default_dtype(prev)
    assert a == b
    assert a["layers.0.attn.attn_sink"] == torch.float32 and a["layers.0.hc_attn_fn"] == torch.float32

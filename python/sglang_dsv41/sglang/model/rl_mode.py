"""Our RL target (`--rl-on-policy-target sglang_dsv41`) and deterministic mode in SGLang's runtime: the choice
added to SGLang's, the sampler kept on its fp32 path, SGLang's batch-invariant aten ops left off for our model,
and the scheduler's own state in `/server_info` for the trainer's start-up check (train/rollout.py).

The resolution side (what the flags set, what they refuse) is arg_resolution.deterministic_step and
server_args.py.
"""

from __future__ import annotations

import logging
import os

from sglang_dsv41.sglang.model.server_args import MKL_CBWR_ENV, RL_TARGET

logger = logging.getLogger(__name__)

STATE_KEY = "dsv41"
"""Key of our entry in each scheduler's internal state (`/server_info` `internal_states[i]`)."""


def add_rl_target() -> None:
    """SGLang's public seam for out-of-tree targets; the parser is built after the plugins load."""
    from sglang.srt.arg_groups.choices import RL_ON_POLICY_TARGET_CHOICES, add_rl_on_policy_target_choices

    if RL_TARGET not in RL_ON_POLICY_TARGET_CHOICES:
        add_rl_on_policy_target_choices([RL_TARGET])


def keep_fp32_sampling(result, sampler) -> None:
    """AFTER hook on SGLang's `Sampler.__init__`. With any target SGLang samples from
    `log_softmax(bf16(logits) / T)` (its FSDP trainer's rounding); the trainer's policy is `softmax(logits / T)` in
    fp32. For our target the sampler keeps its deterministic fp32 path: softmax of the fp32 logits and Gumbel
    noise seeded per request; the returned logprobs are the raw ones either way."""
    if sampler.rl_on_policy_target == RL_TARGET:
        sampler.rl_on_policy_target = None
        sampler.use_log_softmax_logprob = False


def skip_batch_invariant_mode(original, runner) -> None:
    """AROUND hook on SGLang's `ModelRunner.maybe_enable_batch_invariant_mode`. SGLang's mode replaces aten
    mm/addmm/log_softmax/... with its Triton kernels in the whole process (on the CPU it raises: no accelerator);
    our model's batch invariance is its own (determinism.py), and the trainer runs the plain aten ops."""
    from sglang.srt.runtime_context import get_exec

    from sglang_dsv41.sglang.model.deepseek_v41 import DeepseekV41ForCausalLM

    if not isinstance(runner.model, DeepseekV41ForCausalLM):
        return original(runner)
    if get_exec().deterministic.enable_deterministic_inference:
        logger.info("sglang-dsv41: SGLang's batch-invariant aten ops stay off (DeepSeek-V4.1's deterministic mode "
                    "is its own)")
    return None


def rl_state() -> dict:
    """What this process computes with, as the trainer must match it (read where the model runs)."""
    import torch
    from sglang.srt.layers import sampler

    from sglang_dsv41.determinism import deterministic

    return {"deterministic": deterministic(), "return_original_logprob": bool(sampler.SGLANG_RETURN_ORIGINAL_LOGPROB),
            "mkl_cbwr": os.environ.get(MKL_CBWR_ENV), "aten_cpu_capability": os.environ.get("ATEN_CPU_CAPABILITY"),
            "torch_threads": torch.get_num_threads()}


def report_rl_state(result, controller, recv_req):
    """AFTER hook on SGLang's `SchedulerInternalStateController.get_internal_state`: our `rl_state()` under
    STATE_KEY (SGLang reports its resolved args there, and environment variables only when asked to)."""
    result.internal_state[STATE_KEY] = rl_state()
    return result

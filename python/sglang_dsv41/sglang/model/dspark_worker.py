"""`Dsv41DSparkWorker`: SGLang's speculative worker for `--speculative-algorithm DSPARK` on DeepSeek-V4.1.

There is no draft model runner: the drafter's stages (`mtp.*`) are part of our `DeepseekV41`, loaded
with the target, and its context windows live in our `KVPools(speculative=True)`. The scheduler calls
`forward_batch_generation(ScheduleBatch)` synchronously (overlap is declared off at startup):
  extend   the target's own forward (the model adds every captured row to the drafter's context:
           DeepseekV41ForCausalLM.forward) and SGLang's sampler; the sampled token is the bonus
  decode   one `DSparkStep` over SGLang's tables: draft from the bonus, ONE chain verify of gamma + 1
           rows, accept, commit. `batch.seq_lens` is the committed length; the verify's slots are
           req_to_token[req, seq_len .. seq_len + gamma], which SGLang's DSPARK decode preparation
           (`DFlashDraftInputV2.prepare_for_decode`) allocated. Rejected rows' slots stay allocated
           and are rewritten by the next verify.
The result follows SGLang's DSPARK layout (its `DSparkWorkerV2`): `next_token_ids` int64 [B * (gamma + 1)]
(row b's first accept_lens[b] entries are its tokens, untruncated: the scheduler cuts at EOS, stop
strings and max_new_tokens), `accept_lens` int32 [B] (accepted drafts + 1), logits [B * (gamma + 1), V].
SGLang computes the accept-length log line, `meta_info.spec_*` and `/server_info` from these.
"""

from __future__ import annotations

import logging

import torch

from sglang.srt.layers.logits_processor import LogitsProcessorOutput
from sglang.srt.layers.logprob_processor import compute_spec_logprobs
from sglang.srt.managers.utils import GenerationBatchResult
from sglang.srt.speculative.base_spec_worker import BaseSpecWorker
from sglang.srt.speculative.draft_worker_common import make_draft_input_v2

from sglang_dsv41.runtime.spec_step import RowSampling
from sglang_dsv41.sglang.model.decode_batch import decode_capacity

logger = logging.getLogger(__name__)


def row_sampling(sampling_info, batch: int, device) -> RowSampling:
    """SGLang's SamplingBatchInfo -> per-request parameters (greedy requests carry top_k 1)."""
    if sampling_info is None or sampling_info.is_all_greedy:
        return RowSampling.uniform(batch, device)
    return RowSampling(
        temperature=sampling_info.temperatures.view(-1).float(),
        top_k=sampling_info.top_ks.view(-1).long(),
        top_p=sampling_info.top_ps.view(-1).float(),
        min_p=(sampling_info.min_ps.view(-1).float() if sampling_info.need_min_p_sampling
               else torch.zeros(batch, device=device)),
    )


class Dsv41DSparkWorker(BaseSpecWorker):
    def __init__(self, server_args, gpu_id: int, nccl_port: int, target_worker, **_):
        super().__init__()
        self._target_worker = target_worker
        self._draft_worker = None
        self.server_args = server_args
        self.model = target_worker.model_runner.model  # DeepseekV41ForCausalLM
        if self.model.cfg.dspark is None:
            raise RuntimeError("DSPARK: the checkpoint has no drafter (mtp.* stages)")
        self.gamma = self.model.cfg.dspark.block_size
        self.device = self.model.device
        logger.info("DSPARK: %d drafter stage(s) of the checkpoint, gamma %d, chain verify of %d rows",
                    self.model.cfg.dspark.n_stages, self.gamma, self.gamma + 1)

    def __getattr__(self, name: str):
        # what the scheduler asks a worker and BaseSpecWorker does not answer: the target's
        if name.startswith("_"):
            raise AttributeError(name)
        return getattr(self._target_worker, name)

    @property
    def model_runner(self):
        return self._target_worker.model_runner

    @property
    def verify_num_draft_tokens(self) -> int:
        return self.gamma + 1

    def block_accept_estimate_log_suffix(self) -> str:
        return ""

    def dump_info_records(self) -> dict | None:
        return None

    # ------------------------------------------------------------------ steps
    def forward_batch_generation(self, batch, on_publish=None, grammar_barrier=None, *, pp_proxy_tensors=None):
        if batch.forward_mode.is_idle() or batch.batch_size() == 0:
            return self._idle_result()
        if batch.forward_mode.is_extend() or batch.is_extend_in_batch:
            out = self._target_worker.forward_batch_generation(batch)
            out.new_seq_lens = batch.seq_lens
            out.next_draft_input = make_draft_input_v2(bonus_tokens=out.next_token_ids, new_seq_lens=batch.seq_lens)
            return out
        return self._decode(batch)

    def _idle_result(self) -> GenerationBatchResult:
        empty = torch.empty((0,), dtype=torch.int64, device=self.device)
        return GenerationBatchResult(
            next_token_ids=empty, accept_lens=empty.int(), can_run_cuda_graph=False,
            speculative_num_draft_tokens=self.gamma + 1, new_seq_lens=empty,
            next_draft_input=make_draft_input_v2(bonus_tokens=empty, new_seq_lens=empty))

    @torch.inference_mode()
    def _decode(self, batch) -> GenerationBatchResult:
        m, g1 = self.model, self.gamma + 1
        spec = m.dspark
        B = batch.batch_size()
        anchors = batch.spec_info.bonus_tokens.to(self.device, torch.int64)
        cached = batch.seq_lens.to(self.device, torch.int64)
        slots = batch.req_pool_indices.to(self.device, torch.int64)
        req_to_token = batch.req_to_token_pool.req_to_token
        longest = int(batch.seq_lens_cpu.max()) if batch.seq_lens_cpu is not None else int(cached.max())
        capacity = decode_capacity(longest + g1, int(req_to_token.shape[1]))
        table = req_to_token[slots, :capacity].to(torch.int64)
        history = m.store.history(table, cached, m.history_width)
        sampling = row_sampling(batch.sampling_info, B, self.device)
        d = spec.draft(anchors, cached, table, slots, sampling)
        ids = d.ids
        verify_slots = table.gather(1, cached.unsqueeze(1) + torch.arange(g1, device=self.device))
        m.store.write(verify_slots.flatten(), ids.flatten())
        v = spec.verify(ids, cached, table, slots, history, capacity=capacity)
        accepted, tokens = spec.accept(ids, d, v, sampling)
        spec.commit(v, accepted)
        accept_lens = (accepted + 1).to(torch.int32)
        new_seq_lens = cached + accept_lens
        bonus = tokens.gather(1, accepted.unsqueeze(1))[:, 0]
        # a normal tensor: SGLang's logprob code may scale it in place (see DeepseekV41ForCausalLM.forward)
        logits = LogitsProcessorOutput(next_token_logits=v.logits.flatten(0, 1).clone())
        if batch.return_logprob:
            compute_spec_logprobs(batch, logits, tokens.flatten(), chain_stride=g1)
        return GenerationBatchResult(
            logits_output=logits,
            next_token_ids=tokens.flatten(),
            accept_lens=accept_lens,
            can_run_cuda_graph=False,
            next_draft_input=make_draft_input_v2(bonus_tokens=bonus, new_seq_lens=new_seq_lens),
            speculative_num_draft_tokens=g1,
            new_seq_lens=new_seq_lens,
        )


def init_draft_worker(original, scheduler, *args, **kwargs):
    """AROUND hook on Scheduler.maybe_init_draft_worker: DSPARK on our model gets `Dsv41DSparkWorker`
    (SGLang's `create_worker` would build its own DSpark draft runner for the V4 architecture)."""
    from sglang_dsv41.sglang.model.deepseek_v41 import DeepseekV41ForCausalLM

    model = scheduler.tp_worker.model_runner.model
    if not (scheduler.spec_algorithm.is_dspark() and isinstance(model, DeepseekV41ForCausalLM)):
        return original(scheduler, *args, **kwargs)
    scheduler.draft_worker = Dsv41DSparkWorker(server_args=scheduler.server_args, gpu_id=getattr(scheduler, "gpu_id", 0),
                                               nccl_port=scheduler.nccl_port, target_worker=scheduler.tp_worker)
    scheduler.external_corpus_manager = None
    return None

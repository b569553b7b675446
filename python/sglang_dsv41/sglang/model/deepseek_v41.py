"""`DeepseekV41ForCausalLM`: the model class SGLang builds for the released checkpoint.

SGLang owns scheduling, the radix cache, the token/request allocators and sampling; this class owns
the math: our `DeepseekV41` parameters (named as the checkpoint), our paged `KVPools` (indexed by
SGLang's token slots; allocated at load from the sizes of SGLang's pools, which SGLang sized from our
bytes per token: kv_budget.py) and the engine-agnostic `Runtime`. Logits are the runtime's fp32 logits,
handed to SGLang unchanged.
"""

from __future__ import annotations

import logging
import os
from typing import Iterable

import torch
from torch import nn

from sglang.srt.layers.logits_processor import LogitsMetadata, LogitsProcessor, LogitsProcessorOutput
from sglang.srt.managers.mm_utils import pad_mm_tokens
from sglang.srt.model_executor.forward_context import get_req_to_token_pool

from dsv41_kernels.op_table import OpTable
from sglang_dsv41.checkpoint.io import CheckpointError, check_finite, check_tensors
from sglang_dsv41.checkpoint.loader import replace_tensors
from sglang_dsv41.checkpoint.update import read_update_dir, read_update_payload, scan_checkpoint
from sglang_dsv41.config import ModelConfig
from sglang_dsv41.layers.transformer import DeepseekV41
from sglang_dsv41.parallel import shard, take_shards, tensor_shards
from sglang_dsv41.runtime import KVPools, Runtime
from sglang_dsv41.runtime.decode_graphs import DecodeGraphSet
from sglang_dsv41.runtime.spec_step import DSparkStep
from sglang_dsv41.sglang.model.engram_host import EngramHostPlacement
from sglang_dsv41.sglang.model.request_windows import RequestWindows
from sglang_dsv41.sglang.model.server_args import swa_replay_modes
from sglang_dsv41.sglang.model.tensor_parallel import sglang_sharding
from sglang_dsv41.sglang.model.cuda_graphs import DECODE_GRAPHS_ENV, decode_graph_buckets
from sglang_dsv41.sglang.model.decode_batch import build_decode_batch, decode_capacity, host_max_seq_len
from sglang_dsv41.sglang.model.forward import TokenStore, build_batch, identity_logits, plan_logits
from sglang_dsv41.sglang.model.forward_dump import ForwardDump
from sglang_dsv41.sglang.model.image_rows import image_rows, remap_pad_ids
from sglang_dsv41.sglang.model.report import startup_report

logger = logging.getLogger(__name__)


def apply_kernels(model: DeepseekV41, device: torch.device) -> OpTable | None:
    """On CUDA: point every kernel slot of the loaded model (GEMMs, norms, MoE, indexer, Engram hash /
    gather / gate, host tables included) at the registry op table (`NumericsPolicy.kernels(table)`) and
    return the table, which the paged KV uses too. Elsewhere None: the layers keep their torch
    defaults (the twins' math). Call after the token map is set (the hasher exists) and before the
    Engram prefetch attaches (it wraps the hasher's slot)."""
    if torch.device(device).type != "cuda":
        return None
    from sglang_dsv41.numerics import NumericsPolicy, apply_numerics
    from sglang_dsv41.runtime.kernels import kernel_table

    table = kernel_table(device)
    apply_numerics(model, NumericsPolicy.kernels(table))
    return table


def dspark_enabled() -> bool:
    """--speculative-algorithm DSPARK, from SGLang's published config (scheduler / model process)."""
    from sglang.srt.runtime_context import get_spec

    return str(get_spec().speculative_algorithm or "").upper() == "DSPARK"


def _model_config(config) -> ModelConfig:
    """Our record from the checkpoint's own config.json when the path is known (SGLang's config
    object is its flattened V3-derived class), else from the config object. The vision tower is built
    when SGLang's config keeps it (registration.keep_v41_architecture) and --language-model-only is off;
    otherwise the text model is served and the vision tensors are skipped."""
    path = getattr(config, "_name_or_path", None)
    if path and os.path.isfile(os.path.join(str(path), "config.json")):
        cfg = ModelConfig.from_pretrained(path)
    else:
        cfg = ModelConfig.from_hf(config)
    return cfg if getattr(config, "vision_n_layers", 0) and not _language_model_only() else cfg.text_only()


def _language_model_only() -> bool:
    """SGLang's --language-model-only: the vision tower is not loaded (SGLang refuses images itself)."""
    try:
        from sglang.srt.runtime_context import get_disagg

        return bool(get_disagg().language_model_only)
    except Exception:  # no published server config (a model built outside a server)
        return False


class DeepseekV41ForCausalLM(nn.Module):
    def __init__(self, config, quant_config=None, prefix: str = "", **kwargs):
        super().__init__()
        self.config = config
        self.cfg = _model_config(config)
        # SGLang constructs the model inside `with torch.device(target)`; weights go there at load.
        self.device = torch.get_default_device()
        # SGLang builds under its default dtype (bf16); every parameter of our modules names its dtype
        # explicitly, so the default does not matter. Parameters come from the checkpoint (load_weights).
        with torch.device("meta"):
            self.model = DeepseekV41(self.cfg)
        # --tp-size / --ep-size: this rank's part of the model over SGLang's TP group (docs/parallel.md)
        self.sharding = sglang_sharding(self.cfg)
        self.shards = None
        if self.sharding is not None:
            shard(self.model, *self.sharding)
            self.shards = tensor_shards(self.cfg, self.sharding[0])
        self.logits_processor = LogitsProcessor(config)
        self.runtime: Runtime | None = None
        self.ops = None  # the kernel op table on CUDA (apply_kernels), else None: registry ops
        self.windows: RequestWindows | None = None
        self.store: TokenStore | None = None
        self.decode_rows: torch.Tensor | None = None  # int64 [req slots] arange: rows of a decode batch
        self.decode_graphs: DecodeGraphSet | None = None  # CUDA: pure decode's captured graphs
        self.dspark: DSparkStep | None = None  # --speculative-algorithm DSPARK (dspark_worker.py)
        ngram = self.cfg.engram.max_ngram_size if self.cfg.engram else 2
        self.history_width = max(ngram - 1, 1)
        # Engram tables in host memory (docs/engram.md); a bad variable value fails here, at startup.
        self.engram_host = EngramHostPlacement.from_env(self.cfg, self.device)
        self.dump = ForwardDump.from_env()  # diagnostic (forward_dump.py); None unless asked for

    # ------------------------------------------------------------------ weights
    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> None:
        """Validate SGLang's (name, tensor) stream against our checkpoint schema (CheckpointError
        names a missing / unexpected / mis-shaped tensor) and assign it to the parameters. On an
        already-loaded model this is a weight update (`update_weights`)."""
        if not self.model.embed.weight.is_meta:
            return self.update_weights(weights)
        device, host = self.device, self.engram_host
        where = str(getattr(self.config, "_name_or_path", "the checkpoint"))
        # Every shard's header first (bounds, names, dtypes, shapes): a bad file is one error naming it.
        file_of = scan_checkpoint(where, self.cfg) if os.path.isdir(where) else {}
        tensors = {name: t.to(device) for name, t in (host.stream(weights, where) if host else weights)}
        tensors = check_tensors({**tensors, **(host.placeholders() if host else {})}, self.cfg, where=where,
                                finite=False)
        for name, t in tensors.items():
            check_finite(name, t, file_of.get(name, where))
        if self.shards is not None:  # validated whole, kept in part
            tensors = take_shards(tensors, self.shards)
        if host:  # the Engram tables stay in host memory: swap their modules, drop their names
            tensors = host.install(self.model, tensors)
        self.model.load_state_dict(tensors, strict=True, assign=True)
        for p in self.model.parameters():
            p.requires_grad_(False)
        path = getattr(self.config, "_name_or_path", None)
        if self.cfg.engram is not None:
            from sglang_dsv41.tokenizer.token_map import token_map_tensor

            self.model.set_token_map(token_map_tensor(str(path), device=device))
        else:
            self.model.engram_token_map = torch.zeros(0, dtype=torch.int64, device=device)
        self.ops = apply_kernels(self.model, torch.device(device))
        if host:
            host.finish(self.model)
        self.model.eval()

    # ------------------------------------------------------------------ weight updates
    # Every update is staged whole (validated tensors in host memory) and then swapped in by `swap_in`;
    # any failure before the swap leaves the served weights untouched (docs/sglang.md "Weight updates").
    def update_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> None:
        """A weight update into the running server through SGLang's `load_weights` (`_from_tensor`,
        `_from_distributed`): any subset of the checkpoint's tensors, validated (names, dtypes, shapes,
        finite values) before any is written. Raises `CheckpointError`."""
        try:
            named = dict(weights)
        except (TypeError, ValueError):
            raise CheckpointError("the weight update must be a list of (name, tensor) pairs") from None
        self.swap_in(self._staged(check_tensors(named, self.cfg, where="the weight update", complete=False)))

    def stage_update_dir(self, path: str) -> dict[str, torch.Tensor]:
        """The validated tensors of a weight-update directory (checkpoint/update.py rules). Raises."""
        return self._staged(read_update_dir(path, self.cfg))

    def stage_update_payload(self, buf: bytes, where: str) -> dict[str, torch.Tensor]:
        """The validated tensors of a weight update sent as safetensors bytes. Raises."""
        return self._staged(read_update_payload(buf, self.cfg, where))

    def _staged(self, tensors: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        if self.shards is not None:
            tensors = take_shards(tensors, self.shards)
        error = self._frozen_in_update(tensors)
        if error:
            raise CheckpointError(error)
        if not tensors:
            raise CheckpointError("weight update without any tensor of this model")
        return tensors

    def swap_in(self, tensors: dict[str, torch.Tensor]) -> None:
        """Copy staged tensors into the parameters in place, so every reference to a parameter (the
        runtime, kernel slots) stays valid. KV pools and the token store need no reset: SGLang flushes
        its radix cache after the update, and every slot is written before it is read again. The
        Engram token map comes from the tokenizer and does not change."""
        replace_tensors(self.model, tensors)
        logger.info("weight update: %d of %d tensors replaced", len(tensors), len(self.model.state_dict()))

    def _frozen_in_update(self, names) -> str | None:
        if self.engram_host is None:
            return None
        from sglang_dsv41.engram_host.lookup import table_tensor_names

        held = [n for n in names if n in table_tensor_names(self.cfg)]
        if held:
            return (f"weight update: '{held[0]}' is an Engram table, held in host memory "
                    f"(SGLANG_ENABLE_DSV41_ENGRAM_HOST_TABLE=1); Engram tables are frozen, leave them out of updates")
        return None

    # ------------------------------------------------------------------ pools
    def allocate_pools(self, kv_pool, req_to_token_pool) -> None:
        """Allocate our `KVPools`, the token store and the runtime at load, once SGLang has built its
        pools (kv_budget.allocate_at_load): one slot per SGLang token slot (`kv_pool.size + page`),
        one pending ratio-2 state (and, with encoder replay, one window ring) per `req_to_token` row.
        SGLang's `max_total_num_tokens` was sized from these bytes (kv_budget.size_from_our_bytes)."""
        from sglang_dsv41.sglang.model.kv_budget import generic_pool_facts

        page = int(getattr(kv_pool, "page_size", 1))
        num_slots = int(kv_pool.size) + page
        req_to_token = req_to_token_pool.req_to_token
        num_req_slots = int(req_to_token.shape[0])
        replay = swa_replay_modes()
        speculative = dspark_enabled()
        pools = KVPools(self.cfg, num_slots, num_req_slots, self.device, window_rings=replay.encoder,
                        speculative=speculative)
        self.runtime = Runtime(self.model, pools, self.ops, decoder_replay=replay.decoder)
        self.dspark = DSparkStep(self.runtime) if speculative else None
        self.windows = RequestWindows(pools, self.cfg.attention.window_size) if replay.encoder else None
        self.store = TokenStore(num_slots, self.device)
        self.decode_rows = torch.arange(num_req_slots, dtype=torch.int64, device=self.device)
        self.decode_graphs = self._decode_graphs(num_req_slots, int(req_to_token.shape[1]), page)
        logger.info("\n%s", startup_report(self.cfg, num_slots, num_req_slots, page, int(req_to_token.shape[1]),
                                           self.engram_host, replay, generic_pool_facts(kv_pool), speculative))

    def _decode_graphs(self, num_req_slots: int, table_width: int, page: int) -> DecodeGraphSet | None:
        """Our decode CUDA graphs (cuda_graphs.py, runtime/decode_graphs.py): on CUDA as SGLang's decode
        graph settings say, captured per (batch, capacity) bucket on first use; None (eager) elsewhere."""
        if torch.device(self.device).type != "cuda":
            return None
        buckets = decode_graph_buckets(os.environ.get(DECODE_GRAPHS_ENV), num_req_slots, table_width)
        reason = ("turned off by SGLang's decode graph settings" if buckets is None
                  else "encoder SWA bounded replay (per-request window state on the host)" if self.windows is not None
                  else "tensor parallelism (its collectives run eagerly)" if self.shards is not None
                  else "Engram tables in host memory (a host lookup every step)" if self.engram_host is not None
                  else "page size 1 (the warm-up writes two reserved slots)" if page < 2 else None)
        if reason:
            logger.info("decode CUDA graphs off: %s", reason)
            return None
        logger.info("decode CUDA graphs: batch buckets %s, capacity buckets %s (captured on first use)",
                    list(buckets.batch_sizes), list(buckets.capacities))
        return DecodeGraphSet(self.runtime, buckets, self.history_width, scratch_slots=page)

    def set_dspark_layers_to_capture(self, layer_ids) -> None:
        """SGLang's DSPARK setup names the target layers whose input it would capture; our forward
        captures the drafter's input itself (`Runtime.run(capture_draft=True)`), before the
        checkpoint's `dspark_target_layer_ids`, which SGLang read from the same config."""
        want = tuple(self.cfg.dspark.target_layer_ids) if self.cfg.dspark else ()
        if layer_ids is not None and tuple(int(i) for i in layer_ids) != want:
            raise ValueError(f"DSPARK: SGLang asks to capture layers {list(layer_ids)}, the checkpoint's drafter reads "
                             f"{list(want)}")

    # ------------------------------------------------------------------ forward
    @torch.no_grad()
    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor, forward_batch, input_embeds=None, **kwargs):
        fb = forward_batch
        if fb.forward_mode.is_idle() or fb.batch_size == 0 or input_ids.numel() == 0:
            return LogitsProcessorOutput(next_token_logits=torch.empty(0, self.cfg.vocab_size, device=input_ids.device))
        runtime = self.runtime
        if runtime is None:
            raise RuntimeError("DeepseekV41ForCausalLM: KV pools not allocated; SGLang's KVCacheConfigurator.configure "
                               "hook (kv_budget.allocate_at_load) did not run")
        req_to_token = get_req_to_token_pool().req_to_token
        if fb.forward_mode.is_decode() and self.windows is None:
            return self._forward_decode(fb, req_to_token)
        if self.cfg.vision is not None:  # image spans carry SGLang's pad ids (image_rows.py)
            input_ids = remap_pad_ids(input_ids, self.cfg.image_token_id)
        self._check_ids(input_ids, fb)
        meta = LogitsMetadata.from_forward_batch(fb)
        if fb.forward_mode.is_decode():
            plan = plan_logits([1] * fb.batch_size, None, input_ids.device)
        else:
            starts = fb.extend_logprob_start_lens_cpu if meta.extend_return_logprob else None
            plan = plan_logits(list(fb.extend_seq_lens_cpu), starts, input_ids.device)
        replay_lens = self._window_replay(fb)
        batch = build_batch(fb, req_to_token, self.store, self.history_width, plan.rows, replay_lens, input_ids)
        images = self._image_rows(fb, replay_lens)
        # with DSPARK every row this forward runs also becomes the drafter's context
        out = runtime.forward(batch, image_rows=images) if self.dspark is None else self.dspark.prefill(batch, images)
        if self.dump is not None:
            self.dump.write(fb, batch, out.logits)
        if self.windows is not None:
            self.windows.advance(list(fb.rids or [None] * fb.batch_size), batch.req_slots.tolist(), batch.seq_ends.tolist())
        self._capture_routed_experts(out.decisions.routed_experts, batch, out.tail_rows)
        # Runtime.forward runs under inference_mode; SGLang's sampler scales logits in place outside
        # it, which an inference tensor refuses. A copy (rows x vocab) is a normal tensor.
        logits = out.logits.clone()
        if not plan.input_logprobs:
            return LogitsProcessorOutput(next_token_logits=logits)
        meta.sample_indices_cpu = plan.sample_indices
        meta.input_logprob_indices_cpu = plan.input_logprob_indices
        dev = logits.device
        result, sampled = self.logits_processor.input_logprob_processor.forward(
            pruned_states=logits,
            sample_indices=torch.tensor(plan.sample_indices, dtype=torch.int64, device=dev),
            input_logprob_indices=torch.tensor(plan.input_logprob_indices, dtype=torch.int64, device=dev),
            token_to_seq_idx=plan.token_to_seq_idx,
            lm_head=None,
            get_logits_fn=identity_logits,
            logits_metadata=meta,
        )
        output = LogitsProcessorOutput(next_token_logits=sampled)
        result.write_input_to(output)
        return output

    def pad_input_ids(self, input_ids, mm_inputs):
        """SGLang's scheduler: a prompt's image spans get the image's pad ids (its prefix-cache key)."""
        return pad_mm_tokens(input_ids, mm_inputs)

    def _image_rows(self, fb, replay_lens: list[int] | None):
        """This extend forward's image rows (image_rows.py), or None: no vision tower or no image here.
        Encoder SWA replay recomputes cached positions in front of a request's rows: they count too."""
        mm = getattr(fb, "mm_inputs", None)
        if self.cfg.vision is None or fb.forward_mode.is_decode() or not mm or all(m is None for m in mm):
            return None
        rep = replay_lens or [0] * len(fb.extend_seq_lens_cpu)
        starts = [p - r for p, r in zip(fb.extend_prefix_lens_cpu, rep)]
        lens = [n + r for n, r in zip(fb.extend_seq_lens_cpu, rep)]
        return image_rows(self.model, mm, starts, lens)

    def _forward_decode(self, fb, req_to_token: torch.Tensor) -> LogitsProcessorOutput:
        """A pure-decode forward without encoder replay: the fixed-shape, host-sync-free batch
        (decode_batch.py); its capacity comes from SGLang's host lengths, not from the device.

        No `_check_ids` here (it is a host sync): a decode row's id is the token SGLang sampled for
        that request in the previous step (its sampler over our [B, vocab] logits, relayed through
        `FutureMap.output_tokens_buf`), so it lies in [0, vocab). Ids a client sends are prompt ids:
        they are refused at admission (admission.check_tokenized on TokenizerManager._validate_one_request
        and admission.check_admitted on the scheduler's validate_input_length, both through
        validation.ids_error), and every prompt id reaches the model in an extend forward, which
        keeps `_check_ids`, as do a retracted request's re-prefill and the mixed forward."""
        longest = host_max_seq_len(fb)
        capacity = decode_capacity(longest, int(req_to_token.shape[1]))
        batch = build_decode_batch(fb, req_to_token, self.store, self.history_width, self.decode_rows, capacity)
        if self.decode_graphs is not None and longest is not None:  # CUDA: a captured graph, or eager outside its buckets
            out = self.decode_graphs.forward(batch, longest)
        else:
            out = self.runtime.forward(batch)
        if self.dump is not None:
            self.dump.write(fb, batch, out.logits)
        self._capture_routed_experts(out.decisions.routed_experts, batch, out.tail_rows)
        # a normal tensor (see forward): SGLang's sampler scales the logits in place
        return LogitsProcessorOutput(next_token_logits=out.logits.clone())

    def _check_ids(self, input_ids: torch.Tensor, fb) -> None:
        """Token ids outside [0, vocab) would index past the embedding (and the Engram token map).
        Request validation (validation.py) refuses them before the scheduler; this is the last line:
        one reduction and one host sync per extend, mixed or encoder-replay forward (a pure decode
        skips it: `_forward_decode` says why). SGLang's scheduler cannot abort one request from
        inside a forward, so the error names the batch's requests and ends the scheduler."""
        vocab = self.cfg.vocab_size
        bad = (input_ids < 0) | (input_ids >= vocab)
        if bool(bad.any()):
            ids = input_ids[bad][:8].tolist()
            raise ValueError(f"DeepseekV41ForCausalLM: token ids {ids} outside [0, {vocab}) reached the forward "
                             f"(requests {getattr(fb, 'rids', None)}); request validation should have refused them")

    def _window_replay(self, fb) -> list[int] | None:
        """Encoder SWA bounded replay: cached tokens to recompute in front of each request."""
        if self.windows is None:
            return None
        rids = list(fb.rids or [None] * fb.batch_size)
        slots = fb.req_pool_indices.tolist()
        if fb.forward_mode.is_decode():
            self.windows.check_decode(rids, slots, (fb.seq_lens - 1).tolist())
            return None
        return self.windows.plan(rids, slots, list(fb.extend_prefix_lens_cpu))

    def _capture_routed_experts(self, routed: dict[int, torch.Tensor], batch, tail_rows) -> None:
        """SGLang's capturer takes one row per scheduled token. Encoder-replay rows are dropped; rows a
        decoder-replay prefill never ran through the late layers are reported as expert -1."""
        from sglang.srt.state_capturer.routed_experts import get_global_experts_capturer

        capturer = get_global_experts_capturer()
        if capturer is None:
            return
        n = batch.num_rows
        scheduled = None  # every row is scheduled (always in decode): no mask, no data-dependent shape
        if batch.replay_lens is not None:
            scheduled = batch.positions >= (batch.prefix_lens + batch.replay_lens)[batch.req_index]
        for layer_id, ids in routed.items():
            if ids.size(0) != n:  # a decoder-replay late layer: only the tail rows ran
                full = ids.new_full((n, ids.size(1)), -1)
                full[tail_rows] = ids
                ids = full
            if scheduled is not None:
                ids = ids[scheduled]
            capturer.capture(layer_id=layer_id, topk_indices=ids.to(torch.int32))


EntryClass = DeepseekV41ForCausalLM

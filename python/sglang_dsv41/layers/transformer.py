"""The DeepSeek-V4.1 model: parameters named as the checkpoint, and the ONE forward.

`DeepseekV41.forward(input_ids, kv, replay)` owns the layer loop for every caller:
  reference.ReferenceModel   dense KV, whole sequence, inference mode (the oracle)
  runtime.Runtime            paged KV over a packed batch (serving, the offline driver)
  train                      dense KV over a batch of sequences, with autograd (train/trainable.py)
Paper order: embed -> n identical mHC streams -> per layer [Engram] -> attention site -> MoE site
(Block.forward, lagged mHC) -> collapse with the last `pre` -> final RMSNorm -> fp32 logits.
Decoder tail replay (spec attention 7.2) is a property of this loop: at the last KV source, if the
KV asks for it (`kv.tail_rows()`), that layer pools compressed KV for every row, then the forward
narrows to the kept rows. How each op family runs (exact, kernels, trainable, fast) is a numerics
policy applied to a built model from outside (`numerics.apply_numerics`).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from sglang_dsv41.config import ModelConfig
from sglang_dsv41.engram_hash import EngramHasher
from sglang_dsv41.image_input import IMAGE, IMAGE_END, IMAGE_NEW_LINE, IMAGE_START, ImageSpan
from sglang_dsv41.layers.block import Block
from sglang_dsv41.layers.decisions import Decisions
from sglang_dsv41.layers.dspark import DraftStage, stream_mean
from sglang_dsv41.layers.kv import KV
from sglang_dsv41.layers.linear import FP32_GEMM_SLOT, fp32_linear
from sglang_dsv41.layers.mhc import collapse, identity_pre
from sglang_dsv41.layers.norm import RMSNorm
from sglang_dsv41.layers.vision import Aligner, ViT
from sglang_dsv41.numerics import Slot


MARKERS = {IMAGE_START: "image_start", IMAGE_NEW_LINE: "image_newline", IMAGE_END: "image_end"}
"""span position type -> the model parameter (checkpoint tensor) holding its learned embedding."""


class Embedding(nn.Module):
    def __init__(self, vocab: int, hidden: int):
        super().__init__()
        self.weight = nn.Parameter(torch.zeros(vocab, hidden, dtype=torch.bfloat16), requires_grad=False)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return F.embedding(ids, self.weight)


class Head(nn.Module):
    """lm head; logits are computed in fp32 from the bf16 weight (the reference keeps it fp32), through
    the numerics slot `fp32_gemm` (op `fp32_linear`; default: layers.linear.fp32_linear)."""

    numerics_slots = {"fp32_gemm": FP32_GEMM_SLOT}
    fp32_gemm = staticmethod(fp32_linear)  # (x [..., K], w [N, K]) -> fp32 [..., N], batch-invariant rows

    def __init__(self, vocab: int, hidden: int):
        super().__init__()
        self.weight = nn.Parameter(torch.zeros(vocab, hidden, dtype=torch.bfloat16), requires_grad=False)

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        return self.fp32_gemm(h, self.weight)


@dataclass
class ForwardOutput:
    logits: torch.Tensor
    """fp32 [R, vocab] for the KV's logits rows."""
    positions: torch.Tensor
    """int64 [R] absolute position of each logits row."""
    decisions: Decisions
    tail_rows: torch.Tensor | None = None
    """int64 [n] the rows that ran the layers after a decoder-tail narrowing (None: every row)."""
    draft_hidden: torch.Tensor | None = None
    """With `capture_draft`: bf16 [n, H * n_targets], the stream means before each DSpark target layer
    of every row that ran the last layer (positions: `kv.positions` after the forward)."""


class DeepseekV41(nn.Module):
    numerics_slots = {"mhc_collapse": Slot("mhc", kernel="mhc_collapse")}  # the final collapse
    mhc_collapse = staticmethod(collapse)  # (streams [T,n,H], pre [T,n]) -> [T,H]

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.cfg = cfg
        self.embed = Embedding(cfg.vocab_size, cfg.hidden_size)
        self.layers = nn.ModuleList(Block(cfg, role) for role in cfg.layer_roles)
        self.norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.head = Head(cfg.vocab_size, cfg.hidden_size)
        # DSpark stages (`mtp.<k>`, layers/dspark.py); they share the embedding and the head
        self.mtp = nn.ModuleList(DraftStage(cfg, role) for role in cfg.draft_roles)
        if cfg.vision is not None:  # the vision tower and the image span markers (layers/vision.py)
            self.vision = ViT(cfg.vision)
            self.aligner = Aligner(cfg.vision, cfg.hidden_size)
            for marker in MARKERS.values():
                self.register_parameter(marker, nn.Parameter(torch.zeros(cfg.hidden_size, dtype=torch.bfloat16),
                                                             requires_grad=False))
        # Engram compressed-token map (token id -> class), from the tokenizer; not a checkpoint tensor.
        self.register_buffer("engram_token_map", torch.zeros(0, dtype=torch.int64), persistent=False)
        self.hasher: EngramHasher | None = None

    def set_token_map(self, token_map: torch.Tensor) -> None:
        e = self.cfg.engram
        n_classes = int(token_map.max()) + 1 if token_map.numel() else 0
        if e is not None and n_classes != e.compressed_vocab_size:
            raise ValueError(
                f"tokenizer gives {n_classes} Engram token classes but config engram_compressed_vocab_size "
                f"is {e.compressed_vocab_size}"
            )
        self.engram_token_map = token_map.to(torch.int64).to(self.embed.weight.device)
        # with a vision tower, image-span positions take no part in an n-gram (spec model 6.4)
        dead = (self.cfg.image_token_id,) if self.cfg.vision is not None else ()
        self.hasher = EngramHasher(e, self.engram_token_map, dead_token_ids=dead) if e is not None else None

    def image_embeddings(self, span: ImageSpan) -> torch.Tensor:
        """One image's span rows: bf16 [span.length, H] (markers' learned vectors, the aligner's rows at
        the IMAGE positions in reading order)."""
        p = span.plan
        patches = span.patches.to(self.embed.weight.device)
        feats = self.aligner(self.vision(patches, p.vit_h, p.vit_w), p.vit_h, p.vit_w)
        types = span.types.to(feats.device)
        out = feats.new_empty(span.length, feats.size(-1))
        out[types == IMAGE] = feats
        for kind, marker in MARKERS.items():
            out[types == kind] = getattr(self, marker)
        return out

    def image_rows(self, spans: list[ImageSpan], offset: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
        """The `image_rows` argument of `forward` for image spans whose `start` is a row of this
        forward's input minus `offset`: (rows int64 [M], bf16 [M, H])."""
        dev = self.embed.weight.device
        rows = [torch.arange(s.start - offset, s.start - offset + s.length, device=dev) for s in spans]
        return torch.cat(rows), torch.cat([self.image_embeddings(s) for s in spans])

    def forward(self, input_ids: torch.Tensor, kv: KV, replay: Decisions | None = None,
                capture_draft: bool = False, image_rows: tuple[torch.Tensor, torch.Tensor] | None = None) -> ForwardOutput:
        """input_ids int64 [N] (the KV's rows, in its order) -> fp32 logits of `kv.logits_rows()`
        plus the decisions taken (or forced from `replay`); `capture_draft` also returns the DSpark
        drafter's input of every remaining row (`ForwardOutput.draft_hidden`). `image_rows` = (rows
        int64 [M], embeddings bf16 [M, H]) replaces those rows' token embeddings (image spans, from
        `image_embeddings`); with a vision tower, rows holding `image_token_id` route with the VL bias
        and take no Engram contribution."""
        cfg, dec = self.cfg, Decisions()
        if cfg.engram is not None and self.hasher is None:
            raise RuntimeError("Engram model without a token map: call set_token_map (load_model does)")
        hash_ids = kv.engram_ids(self.hasher, input_ids) if self.hasher is not None else None
        h = self.embed(input_ids)
        if image_rows is not None:
            h = h.index_copy(0, image_rows[0].to(h.device), image_rows[1].to(h.dtype))
        in_image = (input_ids == cfg.image_token_id) if cfg.vision is not None else None
        streams = h.unsqueeze(1).repeat(1, cfg.hc.hc_mult, 1)  # [N, n, H]
        pre = identity_pre(input_ids.numel(), cfg.hc.hc_mult, input_ids.device)
        kept = None
        targets = set(cfg.dspark.target_layer_ids) if capture_draft and cfg.dspark is not None else set()
        captured: list[torch.Tensor] = []
        for layer in self.layers:
            lid = layer.role.layer_id
            if layer.engram is not None:
                text = None if in_image is None else ~in_image
                streams = layer.engram(streams, hash_ids[:, cfg.engram.layer_ids.index(lid)], text)
            if lid == cfg.late_layer_start:
                keep = kv.tail_rows()
                if keep is not None:  # decoder tail: pool every row, then go on with the kept ones
                    kv.store_compressed(layer.attn, layer.attn_input(streams, pre))
                    kv.narrow(keep)
                    kept = keep
                    streams, pre = streams[keep], pre[keep]
                    hash_ids = hash_ids[keep] if hash_ids is not None else None
                    in_image = in_image[keep] if in_image is not None else None
                    captured = [c[keep] for c in captured]
            if lid in targets:  # the drafter reads the input of its target layers (after Engram)
                captured.append(stream_mean(streams))
            streams, pre = layer(streams, pre, kv, dec, replay, in_image)
        rows = kv.logits_rows()
        logits = self.head(self.norm(self.mhc_collapse(streams[rows], pre[rows])))
        hidden = torch.cat(captured, dim=-1) if captured else None
        return ForwardOutput(logits=logits, positions=kv.positions[rows], decisions=dec, tail_rows=kept,
                             draft_hidden=hidden)

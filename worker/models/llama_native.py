"""The CPU paths of LlamaModel.forward (float32, bfloat16): a whole-step native call where
one takes the step (``tide::decode_layers``, ``tide::step_layers_packed``), else layer by
layer, each op on the implementation the kernel table names (``kernels/dispatch.py``);
and the embedding, all-reduce and logits steps a tensor-parallel rank adds."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch
import torch.nn.functional as F

from tide_fleet.infra.contract.model_config import ModelConfig
from tide_fleet.kernels import AttentionMetadata, dispatch, paged_attention, write_kv_cache
from tide_fleet.kernels.attention import cpp_decode_shared_tokens, native_prefill
from tide_fleet.kernels.elementwise import Elementwise
from tide_fleet.kernels.linear import Linear, packed_rows
from tide_fleet.worker.lora.step import LoraStep
from tide_fleet.worker.models.layer_weights import LayerWeights
from tide_fleet.worker.models.rope import RotaryEmbedding

if TYPE_CHECKING:
    from tide_fleet.worker.parallel.group import TensorParallel


class NativeSteps:
    """LlamaModel's CPU forward, and the steps' tensor-parallel glue both forwards use (the
    fields are the model's, as LlamaModel sets them)."""

    config: ModelConfig
    layers: list[LayerWeights]
    embed: torch.Tensor
    norm: torch.Tensor
    lm_head: Linear
    dtype: torch.dtype
    device: torch.device
    rope: RotaryEmbedding
    scale: float
    q_size: int
    kv_size: int
    native: Any
    tp: TensorParallel | None
    decode_rows: int
    small_rows: int
    _decode_weights: list[torch.Tensor]
    _decode_biases: list[torch.Tensor]
    _packed_weights: list[torch.Tensor]
    _packed_biases: list[torch.Tensor]
    _small_weights: list[torch.Tensor]

    def embed_tokens(self, input_ids: torch.Tensor) -> torch.Tensor:
        """The rows of the step's tokens; with tp, each rank's vocabulary rows summed."""
        if self.tp is None:
            return F.embedding(input_ids, self.embed)
        local = input_ids - self.vocab_start
        outside = (local < 0) | (local >= self.embed.shape[0])
        rows = F.embedding(local.masked_fill(outside, 0), self.embed)
        return self.tp.all_reduce(rows.masked_fill_(outside.unsqueeze(1), 0))

    def _reduce(self, partial: torch.Tensor) -> torch.Tensor:
        """A row-split projection's output (o, down): each rank's part summed."""
        return partial if self.tp is None else self.tp.all_reduce(partial)

    def _logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """float32 logits over the whole vocabulary (with tp, every rank's columns)."""
        logits = self.lm_head(hidden)
        if self.tp is not None:
            logits = self.tp.gather_vocab(logits, self.config.vocab_size)
        return logits.float()

    def _decode_layers_setup(self) -> None:
        """Weights for the one-call decode step (``tide::decode_layers``), where every
        projection has a native GEMV weight (not fp32, odd sizes, or no AVX-512 BF16)."""
        linears = [lin for lay in self.layers for lin in (lay.qkv, lay.o, lay.gate_up, lay.down)]
        if self.native is None or any(lin.gemv_weight is None for lin in linears):
            return
        for lay in self.layers:
            for part in (lay.input_norm, lay.qkv, lay.o, lay.post_norm, lay.gate_up, lay.down):
                self._decode_weights.append(part.gemv_weight if isinstance(part, Linear) else part)
        self._decode_biases = [lay.qkv.bias for lay in self.layers if lay.qkv.bias is not None]
        self.small_rows = self.layers[0].qkv.gemv_rows
        self.decode_rows = min(self.small_rows, DECODE_LAYERS_ROWS)

    def _packed_step_setup(self) -> None:
        """Weights for the one-call step on the packed matmuls (``tide::step_layers_packed``):
        every projection on the native GEMM (AMX: its weight is the GEMV's) or oneDNN's
        packed path, with the same GEMV row limit, and no bias but the qkv one; with the
        GEMV's weights too where decode_layers has them, for steps of up to small_rows rows."""
        linears = [lin for lay in self.layers for lin in (lay.qkv, lay.o, lay.gate_up, lay.down)]
        if self.native is None or not all(lin.packed or lin.gemm or lin.f32 for lin in linears):
            return
        if len({lin.gemv_rows for lin in linears}) != 1:
            return
        if any(lay.o.bias is not None or lay.gate_up.bias is not None or lay.down.bias is not None
               for lay in self.layers):  # fmt: skip
            return
        for lay in self.layers:
            for part in (lay.input_norm, lay.qkv, lay.o, lay.post_norm, lay.gate_up, lay.down):
                self._packed_weights.append(part.weight if isinstance(part, Linear) else part)
        self._packed_biases = [lay.qkv.bias for lay in self.layers if lay.qkv.bias is not None]
        if self._decode_weights:
            for lay in self.layers:
                projections = (lay.qkv, lay.o, lay.gate_up, lay.down)
                self._small_weights += [lin.gemv_weight for lin in projections]

    def _forward_native(
        self,
        input_ids: torch.Tensor,
        positions: torch.Tensor,
        kv_caches: list[tuple[torch.Tensor, torch.Tensor]],
        meta: AttentionMetadata,
        logits_indices: torch.Tensor,
        lora: LoraStep | None,
    ) -> torch.Tensor:
        """forward() on CPU: a whole-step native call where one takes the step, else layer by
        layer with each op on the implementation the kernel table names (and every step
        with rows under a LoRA adapter: its deltas go in after each projection)."""
        ops, cfg = self.native, self.config
        n, hd, eps = input_ids.shape[0], cfg.head_dim, cfg.rms_norm_eps
        # Nothing forced elsewhere, no adapter rows: the whole step may take one native call.
        whole = lora is None and self.tp is None
        whole = whole and dispatch.is_default(WHOLE_STEP_OPS, self.device)
        if whole and n <= self.decode_rows and _all_one_group_decode(meta, n):
            group = meta.decode_groups[0]
            hidden = ops.decode_layers(
                F.embedding(input_ids, self.embed), positions, self._decode_weights,
                self._decode_biases, [k for k, _ in kv_caches], [v for _, v in kv_caches],
                meta.slot_mapping, group.block_tables, group.context_lens,
                self.rope.cos, self.rope.sin, cfg.num_heads, cfg.num_kv_heads, hd,
                cfg.intermediate_size, eps, self.scale,
            )  # fmt: skip
            return self.lm_head(ops.rms_norm(hidden[logits_indices], self.norm, eps)).float()
        rot_heads = cfg.num_heads + cfg.num_kv_heads
        q_end, k_end = self.q_size, self.q_size + self.kv_size
        # The packed matmuls run at fixed row counts (kernels/linear.py): pad the step's
        # rows once here (token 0 at position 0; attention never sees them) rather than
        # each projection's input in every layer.
        rows = self._padded_rows(n)
        if rows > n:
            input_ids = F.pad(input_ids, (0, rows - n))
            positions = F.pad(positions, (0, rows - n))
        hidden = self.embed_tokens(input_ids)
        if whole and self._takes_packed_step(n, meta):
            hidden = self._packed_step(hidden, positions, kv_caches, meta)
            return self.lm_head(ops.rms_norm(hidden[logits_indices], self.norm, eps)).float()
        glue = Elementwise(ops, self.device)
        delta: torch.Tensor | None = None
        for i, (layer, (k_cache, v_cache)) in enumerate(zip(self.layers, kv_caches, strict=True)):
            if delta is None:
                x = glue.rms_norm(hidden, layer.input_norm, eps)
            else:
                x = glue.add_rms_norm_(hidden, delta, layer.input_norm, eps)
            qkv = adapted(lora, "qkv", i, layer.qkv(x), x)
            glue.rotary_(qkv, positions, self.rope.cos, self.rope.sin, rot_heads, hd)
            q = qkv[:n, :q_end].view(n, cfg.num_heads, hd)
            k = qkv[:n, q_end:k_end].view(n, cfg.num_kv_heads, hd)
            v = qkv[:n, k_end:].view(n, cfg.num_kv_heads, hd)
            write_kv_cache(k, v, k_cache, v_cache, meta.slot_mapping)
            attn = paged_attention(q, k, v, k_cache, v_cache, meta, self.scale)
            attn_in = attn.reshape(n, self.q_size)
            if rows > n:
                attn_in = torch.cat([attn_in, attn_in.new_zeros(rows - n, self.q_size)])
            attn_out = self._reduce(adapted(lora, "o", i, layer.o(attn_in), attn_in))
            x = glue.add_rms_norm_(hidden, attn_out, layer.post_norm, eps)
            if layer.gate_up.fuses_silu and lora is None:
                act = layer.gate_up.silu_glu(x)
            else:
                act = glue.silu_mul(adapted(lora, "gate_up", i, layer.gate_up(x), x))
            delta = self._reduce(adapted(lora, "down", i, layer.down(act), act))
        if delta is not None:
            hidden.add_(delta)
        return self._logits(glue.rms_norm(hidden[logits_indices], self.norm, eps))

    def _takes_packed_step(self, n: int, meta: AttentionMetadata) -> bool:
        """A step whose attention the native kernels run in place: decode rows in at most
        one group, first, and prefill chunks only where the bf16 kernel takes them all in
        one call; past the GEMV's rows where there are no GEMV weights to project small
        steps on. What step_layers_packed runs."""
        if not self._packed_weights:
            return False
        if n <= self.layers[0].qkv.gemv_rows and not self._small_weights:
            return False
        groups = meta.decode_groups
        if len(groups) > 1 or (groups and groups[0].rows.start != 0):
            return False
        if not meta.prefills:
            return bool(groups) and groups[0].rows == slice(0, n)
        return meta.prefill_batch is not None and native_prefill(self.dtype, self.config.head_dim)

    def _packed_step(
        self,
        hidden: torch.Tensor,
        positions: torch.Tensor,
        kv_caches: list[tuple[torch.Tensor, torch.Tensor]],
        meta: AttentionMetadata,
    ) -> torch.Tensor:
        """Every layer of the step in one native call (``tide::step_layers_packed``)."""
        cfg, hd = self.config, self.config.head_dim
        group = meta.decode_groups[0] if meta.decode_groups else None
        shared = 0
        if group is not None:
            shared = cpp_decode_shared_tokens(self.dtype, hd, group, kv_caches[0][0].shape[2])
        batch = meta.prefill_batch if meta.prefills else None
        lay = self.layers[0]
        projections = (lay.qkv, lay.o, lay.gate_up, lay.down)
        splits = [lin.split_rows for lin in projections]
        widths = [lin.out_features for lin in projections]
        return self.native.step_layers_packed(
            hidden, positions, self._packed_weights, self._packed_biases,
            [k for k, _ in kv_caches], [v for _, v in kv_caches], meta.slot_mapping,
            None if group is None else group.block_tables,
            None if group is None else group.context_lens, shared,
            None if batch is None else batch.query_start,
            None if batch is None else batch.start_pos,
            None if batch is None else batch.block_tables,
            0 if batch is None else batch.first_row, splits, widths, self._small_weights,
            self.small_rows,
            self.rope.cos, self.rope.sin, cfg.num_heads, cfg.num_kv_heads, hd,
            cfg.rms_norm_eps, self.scale,
        )  # fmt: skip

    def _padded_rows(self, n: int) -> int:
        """The row count a step of n rows runs its layers at: the packed matmul's bucket
        where the projections take that path (more than their GEMV's rows), else n."""
        first = self.layers[0].qkv
        if not first.packed or n <= first.gemv_rows:
            return n
        return packed_rows(n)


# decode_layers takes decode-only steps of up to this many rows (batch-1 decode, and its
# neighbour); larger ones take step_layers_packed, which also attends rows behind a shared
# cached prefix once and projects on the same GEMV up to small_rows rows.
DECODE_LAYERS_ROWS = 2
# The ops the whole-step calls embed, each as its class's default (prefill chunks also need
# the native prefill kernel: _takes_packed_step).
WHOLE_STEP_OPS = ("gemv", "gemm", "decode_attention", "norm", "rope", "activation", "kv_write")


def adapted(
    lora: LoraStep | None, proj: str, layer: int, y: torch.Tensor, x: torch.Tensor
) -> torch.Tensor:
    """A projection's output with its rows' LoRA deltas added (in place), if any."""
    return y if lora is None else lora.add(proj, layer, y, x)


def _all_one_group_decode(meta: AttentionMetadata, n: int) -> bool:
    """A step of only decode rows in one length group: what decode_layers takes."""
    groups = meta.decode_groups
    return not meta.prefills and len(groups) == 1 and groups[0].rows == slice(0, n)

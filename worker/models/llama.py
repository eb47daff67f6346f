"""Llama-family decoder (Llama, Mistral, Qwen2) over a flattened batch of tokens.

Weights are plain tensors, fused at load time (q|k|v and gate|up) so each layer runs
four matmuls. Attention goes through ``kernels`` so the paged KV cache and the
Triton path stay behind one signature. On CPU (float32, bfloat16) a step runs one of three
ways: every layer in one native call (``tide::decode_layers``, ``tide::step_layers_packed``)
where every op they embed takes its class's default in the kernel table
(``kernels/dispatch.py``), else the op-by-op loop of ``_forward_native``, each op on the
implementation the table names (``llama_native.py``). ``forward``'s own loop is what CUDA
runs: cuBLAS projections, and the table's Triton kernels for the rest (residual add fused
into RMSNorm, RoPE fused with the KV-cache write, SiLU x up; on other devices their torch
reference).
"""

from __future__ import annotations

import torch

from tide_fleet.infra.contract.model_config import ModelConfig
from tide_fleet.kernels import AttentionMetadata, dispatch, paged_attention, write_kv_cache
from tide_fleet.kernels import cpu as cpu_kernels
from tide_fleet.kernels.elementwise import Elementwise
from tide_fleet.kernels.linear import Linear, choose_row_split
from tide_fleet.worker.lora.step import LoraStep
from tide_fleet.worker.models.layer_weights import LayerWeights
from tide_fleet.worker.models.llama_native import NativeSteps, adapted
from tide_fleet.worker.models.rope import RotaryEmbedding
from tide_fleet.worker.parallel.group import TensorParallel


class LlamaModel(NativeSteps):
    def __init__(
        self,
        config: ModelConfig,
        embed: torch.Tensor,
        layers: list[LayerWeights],
        norm: torch.Tensor,
        lm_head: Linear,
        tp: TensorParallel | None = None,
    ) -> None:
        self.config = config  # with tp: this rank's heads and intermediate size
        # Tensor parallel: this rank's shard (worker/parallel/shard.py); the model adds the
        # all-reduces and the logits' gather, and runs op by op (no whole-step calls).
        self.tp = tp
        self.vocab_start = 0 if tp is None else tp.rank * embed.shape[0]
        self.embed = embed
        self.layers = layers
        self.norm = norm
        self.lm_head = lm_head
        self.dtype = embed.dtype
        self.device = embed.device
        self.rope = RotaryEmbedding(
            config.head_dim,
            config.max_position_embeddings,
            config.rope_theta,
            config.rope_scaling,
            self.dtype,
            self.device,
        )
        self.scale = config.head_dim**-0.5
        self.q_size = config.num_heads * config.head_dim
        self.kv_size = config.num_kv_heads * config.head_dim
        dispatch.describe(self.device)  # a force this device cannot run fails at load
        native = self.device.type == "cpu" and self.dtype in (torch.float32, torch.bfloat16)
        self.native = cpu_kernels.ops() if native else None
        self.decode_rows = 0  # steps of up to this many decode rows take decode_layers
        self.small_rows = 0  # steps of up to this many rows project on the GEMV's weights
        self._decode_weights: list[torch.Tensor] = []
        self._decode_biases: list[torch.Tensor] = []
        self._decode_layers_setup()
        # Other steps take step_layers_packed (the GEMM's or oneDNN's packed weights, and
        # the GEMV's for steps of up to small_rows rows).
        self._packed_weights: list[torch.Tensor] = []
        self._packed_biases: list[torch.Tensor] = []
        self._small_weights: list[torch.Tensor] = []
        self._packed_step_setup()

    @torch.inference_mode()
    def forward(
        self,
        input_ids: torch.Tensor,
        positions: torch.Tensor,
        kv_caches: list[tuple[torch.Tensor, torch.Tensor]],
        meta: AttentionMetadata,
        logits_indices: torch.Tensor,
        lora: LoraStep | None = None,
    ) -> torch.Tensor:
        """Run the step's tokens; return float32 logits for the rows in logits_indices.
        ``lora``: the LoRA adapters its rows run under, their deltas added after each
        projection (None: every row is the base model's)."""
        if self.native is not None:
            return self._forward_native(input_ids, positions, kv_caches, meta, logits_indices, lora)
        # Each elementwise op on the implementation the kernel table names: on CUDA the
        # fused Triton kernels (kernels/triton_fused.py), elsewhere their torch reference.
        glue = Elementwise(None, self.device)
        n = input_ids.shape[0]
        hidden = self.embed_tokens(input_ids)
        delta: torch.Tensor | None = None
        for i, (k_cache, v_cache) in zip(range(len(self.layers)), kv_caches, strict=True):
            qkv = self.attention_in(i, hidden, delta, positions, k_cache, v_cache,
                                    meta.slot_mapping, glue, lora)  # fmt: skip
            attn = self.attend(qkv, n, k_cache, v_cache, meta)
            delta = self.attention_out(i, attn, hidden, glue, lora)
        return self.finish(hidden, delta, logits_indices, glue)

    # The halves of a layer around its attention, the pieces ``forward`` runs in turn (and
    # worker/engine/mixed_graphs.py captures as CUDA graphs, with attention between them).

    def attention_in(
        self, i: int, hidden: torch.Tensor, delta: torch.Tensor | None, positions: torch.Tensor,
        k_cache: torch.Tensor, v_cache: torch.Tensor, slots: torch.Tensor, glue: Elementwise,
        lora: LoraStep | None = None,
    ) -> torch.Tensor:  # fmt: skip
        """Layer i up to attention: the layer before's MLP output ``delta`` joins the
        residual ``hidden`` (in place) inside the norm, then the q|k|v projection, RoPE on
        q and k, and k and v written to the cache at ``slots`` (-1: not written). Returns
        the rotated q|k|v rows [T, q + 2 kv]."""
        cfg, hd, layer = self.config, self.config.head_dim, self.layers[i]
        eps, rot_heads = cfg.rms_norm_eps, cfg.num_heads + cfg.num_kv_heads
        if delta is None:
            x = glue.rms_norm(hidden, layer.input_norm, eps)
        else:
            x = glue.add_rms_norm_(hidden, delta, layer.input_norm, eps)
        qkv = adapted(lora, "qkv", i, layer.qkv(x), x)
        # q and k rotated in place in the fused rows, k and v written to the cache: one
        # launch where the table takes both on Triton, else two steps.
        fused = glue.rotary_kv_write_(
            qkv, positions, self.rope.cos, self.rope.sin, cfg.num_heads,
            cfg.num_kv_heads, hd, k_cache, v_cache, slots,
        )  # fmt: skip
        if not fused:
            glue.rotary_(qkv, positions, self.rope.cos, self.rope.sin, rot_heads, hd)
            _, k, v = self._split(qkv, qkv.shape[0])
            write_kv_cache(k, v, k_cache, v_cache, slots)
        return qkv

    def attend(
        self, qkv: torch.Tensor, n: int, k_cache: torch.Tensor, v_cache: torch.Tensor,
        meta: AttentionMetadata, out: torch.Tensor | None = None,
    ) -> torch.Tensor:  # fmt: skip
        """Attention of the first n rows of q|k|v (their K/V already in the cache); returns
        [n, q_size], written into ``out`` [n, q_size] when given."""
        q, k, v = self._split(qkv, n)
        into = None if out is None else out.view(n, self.config.num_heads, -1)
        attn = paged_attention(q, k, v, k_cache, v_cache, meta, self.scale, into)
        return attn.view(n, self.q_size)

    def attention_out(
        self, i: int, attn: torch.Tensor, hidden: torch.Tensor, glue: Elementwise,
        lora: LoraStep | None = None,
    ) -> torch.Tensor:  # fmt: skip
        """Layer i after attention: the o projection joins the residual (in place) inside
        the post-attention norm, then gate|up, SiLU x up and down. Returns the MLP's
        output, which the next layer's norm (or ``finish``) adds to the residual."""
        layer, eps = self.layers[i], self.config.rms_norm_eps
        attn_out = self._reduce(adapted(lora, "o", i, layer.o(attn), attn))
        x = glue.add_rms_norm_(hidden, attn_out, layer.post_norm, eps)
        act = glue.silu_mul(adapted(lora, "gate_up", i, layer.gate_up(x), x))
        return self._reduce(adapted(lora, "down", i, layer.down(act), act))

    def finish(
        self, hidden: torch.Tensor, delta: torch.Tensor | None, logits_indices: torch.Tensor,
        glue: Elementwise,
    ) -> torch.Tensor:  # fmt: skip
        """The last MLP output joined, the final norm and float32 logits of the rows."""
        if delta is not None:
            hidden.add_(delta)
        eps = self.config.rms_norm_eps
        return self._logits(glue.rms_norm(hidden[logits_indices], self.norm, eps))

    def _split(self, qkv: torch.Tensor, n: int) -> tuple[torch.Tensor, ...]:
        """q [n, heads, hd], k and v [n, kv_heads, hd]: views of q|k|v's first n rows."""
        cfg, hd = self.config, self.config.head_dim
        q_end, k_end = self.q_size, self.q_size + self.kv_size
        return (
            qkv[:n, :q_end].view(n, cfg.num_heads, hd),
            qkv[:n, q_end:k_end].view(n, cfg.num_kv_heads, hd),
            qkv[:n, k_end:].view(n, cfg.num_kv_heads, hd),
        )

    def warm_up_matmuls(self, max_rows: int, max_logit_rows: int) -> list[str]:
        """Build the packed CPU matmuls for every row bucket now (``kernels/linear.py``):
        every layer has layer 0's shapes, and oneDNN keeps one build per shape. Then each
        shape chooses whether its large calls run in row pieces (``choose_row_split``).
        Returns the projections that do."""
        split = []
        for name in ("qkv", "o", "gate_up", "down"):
            same_shape: list[Linear] = [getattr(layer, name) for layer in self.layers]
            same_shape[0].warm_up(max_rows)
            if choose_row_split(same_shape, max_rows):
                split.append(name)
        self.lm_head.warm_up(max_logit_rows)
        return split

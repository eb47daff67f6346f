"""One decoder layer's weights, fused at load (q|k|v and gate|up): four matmuls a layer."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from tide_fleet.kernels.linear import Linear


@dataclass
class LayerWeights:
    input_norm: torch.Tensor
    qkv: Linear  # q | k | v fused
    o: Linear
    post_norm: torch.Tensor
    gate_up: Linear  # gate | up fused
    down: Linear

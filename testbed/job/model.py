"""What a training step of a transformer costs, pure: compute per layer and micro-batch, and
the bytes its parallelism moves (docs/REFERENCE.md, "Training jobs").

Counts follow Megatron-LM's (Narayanan et al., SC 2021): a dense layer holds 12h^2 parameters
(attention 4h^2, a 4h MLP 8h^2) and its forward pass costs 2 FLOPs per parameter and token plus
4sh for attention scores and values per token; backward costs twice forward. A mixture-of-
experts layer keeps the attention and has ``experts`` MLPs, each token running ``top_k`` of
them. Tensor parallelism splits a layer's compute and parameters ``tp`` ways and all-reduces its
activations twice per layer in each direction; a pipeline stage sends a micro-batch's
activations forward and their gradients back; expert parallelism all-to-alls the tokens to
their experts and back (dispatch and combine) in each direction.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Dict


@dataclass(frozen=True)
class Model:
    name: str
    layers: int
    hidden: int
    heads: int
    seq_len: int
    vocab: int
    experts: int = 0  # 0: dense
    top_k: int = 0

    @property
    def moe(self) -> bool:
        return self.experts > 0

    def attention_params(self) -> int:
        return 4 * self.hidden ** 2

    def mlp_params(self) -> int:
        """One MLP (one expert's)."""
        return 8 * self.hidden ** 2

    def layer_params(self) -> int:
        return self.attention_params() + self.mlp_params() * max(1, self.experts)

    def params(self) -> int:
        return self.layers * self.layer_params() + self.vocab * self.hidden

    def attention_flops(self, tokens: int) -> float:
        """Forward FLOPs of one layer's attention for ``tokens`` tokens."""
        return tokens * (2 * self.attention_params() + 4 * self.seq_len * self.hidden)

    def mlp_flops(self, tokens: int) -> float:
        """Forward FLOPs of one layer's MLP (its ``top_k`` experts' for a MoE layer)."""
        return tokens * 2 * self.mlp_params() * (self.top_k if self.moe else 1)

    def logits_flops(self, tokens: int) -> float:
        return tokens * 2 * self.hidden * self.vocab


# Shapes of published models of each class (Llama 2 7B and 70B, Mixtral 8x7B: layers, hidden
# size, heads, sequence length, vocabulary), with the 4h MLP of the formulas above
PRESETS: Dict[str, Model] = {
    "dense-7b": Model("dense-7b", 32, 4096, 32, 4096, 32000),
    "dense-70b": Model("dense-70b", 80, 8192, 64, 4096, 32000),
    "moe-8x2": Model("moe-8x2", 32, 4096, 32, 4096, 32000, experts=8, top_k=2),
}


@dataclass(frozen=True)
class GpuModel:
    """How fast a GPU computes: peak dense TFLOP/s at the training precision, and the share of
    it a training step achieves (model FLOPs utilisation)."""
    peak_tflops: float = 989.0  # H100 SXM, BF16 dense (NVIDIA's datasheet)
    efficiency: float = 0.4

    def ns(self, flops: float) -> float:
        return flops / (self.peak_tflops * 1e12 * self.efficiency) * 1e9

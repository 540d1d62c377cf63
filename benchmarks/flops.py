"""Training FLOPs per token and model-FLOPs utilisation (MFU), stated once for every benchmark.

Two accountings, both per token of a causal LM with ``L`` layers, width ``d`` and sequence
length ``S``; ``N`` counts the weights of every matrix multiply (attention and MLP
projections and the LM head, embeddings excluded: a lookup is not a GEMM) and ``N_lora`` the
adapter weights:

- ``full``: the standard MFU numerator (Kaplan et al. 2020, PaLM appendix B) as if every weight
  were trained: ``6N + 12·L·d·S``. ``6N`` is 2N forward + 4N backward (one GEMM for the input
  gradient, one for the weight gradient); ``12·L·d·S`` is attention's ``QKᵀ`` and ``AV``
  (2·2·S·d forward per layer, twice that backward). Causal masking is not discounted.
- ``lora``: the work LoRA actually needs. The frozen base weights get no weight gradient, so
  their backward is the input-gradient GEMM only: ``4N + 6·N_lora + 12·L·d·S``. This is the
  fair numerator for a LoRA run; ``full`` overstates its work by ``2N`` per token.

MFU is achieved FLOP/s over the device's *measured* dense bf16 matmul throughput (the smoke
step's checked 8192³ matmul), not the datasheet peak.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

import torch

MATMUL_MODULES = ("Linear", "Conv1D")  # torch.nn.Linear; GPT-2's transposed transformers Conv1D


@dataclass(frozen=True)
class FlopCount:
    matmul_params: int
    lora_params: int
    n_layer: int
    n_embd: int
    seq_len: int

    @property
    def attention(self) -> int:
        return 12 * self.n_layer * self.n_embd * self.seq_len

    @property
    def full_per_token(self) -> int:
        return 6 * self.matmul_params + 6 * self.lora_params + self.attention

    @property
    def lora_per_token(self) -> int:
        return 4 * self.matmul_params + 6 * self.lora_params + self.attention

    def to_dict(self) -> dict:
        out = asdict(self)
        out.update(full_per_token=self.full_per_token, lora_per_token=self.lora_per_token)
        return out


def count_matmul_params(model: torch.nn.Module) -> tuple[int, int]:
    """(base matmul weights, LoRA adapter weights), counting a tied LM head once as a GEMM.

    A tied head shares its tensor with the token embedding, but the head *is* a V x d GEMM per
    token, so it is counted by module, not by unique tensor.
    """
    base = lora = 0
    for name, module in model.named_modules():
        if type(module).__name__ not in MATMUL_MODULES:
            continue
        weight = getattr(module, "weight", None)
        if weight is None:
            continue
        if ".lora_" in f".{name}" or name.split(".")[-2:-1] in (["lora_A"], ["lora_B"]):
            lora += weight.numel()
        elif not _has_children_of_type(module):
            base += weight.numel()
    return base, lora


def _has_children_of_type(module: torch.nn.Module) -> bool:
    """peft wraps a target Linear in a LoRA layer that is itself a Linear subclass; count the
    wrapped ``base_layer`` once, not the wrapper too."""
    return any(type(c).__name__ in MATMUL_MODULES for c in module.children())


def flop_count(model: torch.nn.Module, n_layer: int, n_embd: int, seq_len: int) -> FlopCount:
    base, lora = count_matmul_params(model)
    return FlopCount(base, lora, n_layer, n_embd, seq_len)


def mfu(flops_per_token: float, tokens_per_s: float, peak_tflops: float) -> float | None:
    """Fraction of the measured matmul peak; None when no peak was measured."""
    if not peak_tflops or peak_tflops <= 0:
        return None
    return flops_per_token * tokens_per_s / (peak_tflops * 1e12)

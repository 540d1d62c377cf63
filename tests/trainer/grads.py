"""Gradients of a small causal LM, for tests that check a memory lever changes none of them."""

from __future__ import annotations

import torch

from draslice.trainer.config import ModelShape
from draslice.trainer.model import build_base
from draslice.trainer.speed import grad_checkpointing


def param_grads(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """Each parameter's gradient by name (those that have one), copied."""
    return {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}


def lm_grads(model: torch.nn.Module, ids: torch.Tensor) -> dict[str, torch.Tensor]:
    """The gradients of one forward and backward of the language-modelling loss on ``ids``."""
    model.zero_grad()
    model(input_ids=ids, labels=ids).loss.backward()
    return param_grads(model)


def checkpointed_base(shape: ModelShape, reentrant: bool = False) -> torch.nn.Module:
    """A synthetic GPT-2 of ``shape`` in training mode, with the loop's gradient checkpointing
    of the kind asked."""
    model = build_base(shape, seed=0)
    model.train()
    grad_checkpointing.enable(model, reentrant)
    return model


def qwen2_lora(layers: int) -> torch.nn.Module:
    """A small random Qwen2 (the architecture the slice benchmarks tune) in training mode with
    LoRA on every projection, B non-zero so that every LoRA weight gets a gradient; the same
    weights every call."""
    from transformers import Qwen2Config, Qwen2ForCausalLM

    from draslice.trainer.model import wrap_lora

    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        base = Qwen2ForCausalLM(Qwen2Config(
            vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=layers,
            num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=32))
        model = wrap_lora(base, 4, 8, 0.0,
                          "q_proj,k_proj,v_proj,o_proj,gate_proj,up_proj,down_proj")
        for name, param in model.named_parameters():
            if "lora_B" in name:
                torch.nn.init.normal_(param, std=0.1)
    base.train()
    return model


def checkpointed_qwen2(layers: int) -> torch.nn.Module:
    """:func:`qwen2_lora` with the loop's gradient checkpointing."""
    model = qwen2_lora(layers)
    grad_checkpointing.enable(model.get_base_model())
    return model


def largest_relative_distance(grads: dict[str, torch.Tensor],
                              reference: dict[str, torch.Tensor]) -> float:
    """The largest ``|g - ref| / |ref|`` (Frobenius) over the reference's gradients: one
    figure for how far a whole set of gradients is, where elementwise tolerances at bf16's
    rounding would let a small systematic error through."""
    return max((torch.linalg.norm(grads[n].float() - g.float()) / torch.linalg.norm(g.float()))
               .item() for n, g in reference.items())

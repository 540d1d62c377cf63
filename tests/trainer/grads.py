"""Gradients of a small causal LM, for tests that check a memory lever changes none of them."""

from __future__ import annotations

import torch

from draslice.trainer import build
from draslice.trainer.config import ModelShape
from draslice.trainer.model import build_base


def param_grads(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """Each parameter's gradient by name (those that have one), copied."""
    return {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}


def lm_grads(model: torch.nn.Module, ids: torch.Tensor) -> dict[str, torch.Tensor]:
    """The gradients of one forward and backward of the language-modelling loss on ``ids``."""
    model.zero_grad()
    model(input_ids=ids, labels=ids).loss.backward()
    return param_grads(model)


def checkpointed_base(shape: ModelShape) -> torch.nn.Module:
    """A synthetic GPT-2 of ``shape`` in training mode, with the loop's gradient checkpointing."""
    model = build_base(shape, seed=0)
    model.train()
    build.checkpointing(model)
    return model

"""How a training step is made fast: one decision per run, taken before the first step.

The eager step of a LoRA fine-tune on a GPU is bound by launching kernels, not by running them
(docs/benchmarks-history.md: GPT-2-124M kept an H200 busy 29.5 ms of a 63 ms step, ~1,800
launches). So the default (``compile="auto"``) removes the launches where it can, with
PyTorch's and Liger's own code rather than kernels of ours:

- ``cudagraphs``: the transformer body is captured once as a CUDA graph, forward and backward
  (``torch.cuda.make_graphed_callables``), and replayed each step: one launch per pass, no
  compiler, a second of capture instead of inductor's 20-70 s. A graph holds one batch shape,
  so it is chosen only where every batch has the same width and no padding (the synthetic run,
  ``pack``, ``pad_to_max_length``); a batch of another shape, evaluation and inference run
  the body eagerly. Gradient checkpointing and a 4-bit base stay eager.
- ``default`` / ``reduce-overhead``: ``torch.compile`` (inductor) of the body, on request only:
  it fuses more but compiles for tens of seconds, worth it on long runs (docs/benchmarks.md).
  Under gradient checkpointing each layer is compiled inside its checkpoint instead, which
  stays eager: dynamo's own checkpoint would break at every layer and run the layers eager
  (:func:`compile_layers` says why), and CUDA graphs are not used there.
- Liger kernels (``liger-kernel``, what LlamaFactory's ``enable_liger_kernel`` applies): fused
  RMSNorm, RoPE and SwiGLU for Llama/Qwen2/Mistral on CUDA when the library is installed and
  the body is not compiled by inductor (which fuses those itself), and its fused linear
  cross-entropy for the loss through the head (``loss.py``; its own chunks otherwise).
"""

from __future__ import annotations

import importlib.util
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial

import torch

from draslice.trainer.config import COMPILE_MODES
from draslice.trainer.speed import grad_checkpointing
from draslice.trainer.speed.cuda_graph import GraphedBody
from draslice.trainer.speed.loss import LIGER_HEAD, VOCAB_ALIGN, split_head

__all__ = ["COMPILE_MODES", "SpeedPlan", "apply_liger", "choose", "choose_mode", "prepare"]
INDUCTOR_MODES = ("default", "reduce-overhead")
LIGER_ARCHS = ("llama", "qwen2", "mistral")


@dataclass(frozen=True)
class SpeedPlan:
    """What the loop needs to know about the speed features in use."""

    mode: str
    """The compile mode actually used: ``off``, ``cudagraphs`` or an inductor mode."""
    liger: bool
    """Liger's fused kernels replace the body's norms, rotary embedding and MLP activation."""
    layerwise: bool = False
    """Inductor compiled each layer inside its checkpoint, not the whole body."""

    @property
    def mark_steps(self) -> bool:
        """Inductor's CUDA graphs need each step's start marked (its outputs reuse buffers)."""
        return self.mode == "reduce-overhead"

    @property
    def autocast_cache(self) -> bool:
        """Graph capture refuses autocast's weight-cast cache (the cast must be in the graph)."""
        return self.mode != "cudagraphs"

    def describe(self) -> str:
        return (f"speed: {self.mode}" + (", each layer compiled" if self.layerwise else "")
                + (", Liger kernels" if self.liger else ""))


def fixed_width(cfg) -> bool:
    """Whether every batch of an ``SFTConfig`` has one width: synthetic data, packed rows, or
    rows padded to ``max_length``."""
    return bool(cfg.synthetic or cfg.pack or cfg.pad_to_max_length)


def choose(cfg, on_cuda: bool, log: Callable[[str], None]) -> str:
    """The mode for an ``SFTConfig`` (``auto`` captures a graph only at a fixed width)."""
    # FSDP2 gathers each block's weights inside the body: auto captures no CUDA graph of it.
    mode = choose_mode(cfg.compile, on_cuda, fixed_width(cfg) and not cfg.fsdp,
                       cfg.gradient_checkpointing, cfg.load_in_4bit)
    if cfg.compile == "reduce-overhead" and mode == "default":
        log("compile: CUDA graphs need a GPU; compiling without them (mode 'default')")
    elif cfg.compile == "cudagraphs" and mode == "off":
        log("compile: CUDA graphs need a GPU; running eager")
    elif mode == "reduce-overhead" and cfg.gradient_checkpointing:
        mode = "default"
        log("compile: with gradient_checkpointing each layer is compiled inside its "
            "checkpoint, which runs eager between the layers; CUDA graphs do not replay "
            "that, compiling without them (mode 'default')")
    return mode


def choose_mode(requested: str, on_cuda: bool, fixed_width: bool, checkpointing: bool,
                quantized: bool) -> str:
    """``auto`` made concrete; an explicit mode is kept, except what a CPU cannot do."""
    if requested == "auto":
        if on_cuda and fixed_width and not checkpointing and not quantized:
            return "cudagraphs"
        return "off"
    if not on_cuda and requested in ("cudagraphs", "reduce-overhead"):
        return "default" if requested == "reduce-overhead" else "off"
    return requested


def liger_available() -> bool:
    return importlib.util.find_spec("liger_kernel") is not None


def apply_liger(base: torch.nn.Module, on_cuda: bool, mode: str) -> bool:
    """Liger's RMSNorm/RoPE/SwiGLU on a Llama-family base, in place; whether it was applied."""
    arch = getattr(getattr(base, "config", None), "model_type", "")
    if not (on_cuda and arch in LIGER_ARCHS and mode not in INDUCTOR_MODES and liger_available()):
        return False
    from liger_kernel.transformers import _apply_liger_kernel_to_instance

    _apply_liger_kernel_to_instance(model=base, rope=True, rms_norm=True, swiglu=True,
                                    cross_entropy=False, fused_linear_cross_entropy=False)
    head = base.get_output_embeddings()
    # The loss calls the backbone and the head itself (loss.py), so Liger's patched forward
    # with labels would never run: the head is marked for loss.py to use Liger's function.
    # An odd vocabulary (GPT-2's 50,257) stays with loss.py's chunks, which pad the head
    # for the tensor cores; Liger's matmuls would take the unpadded head.
    if head is not None and head.weight.shape[0] % VOCAB_ALIGN == 0:
        setattr(head, LIGER_HEAD, True)
    return True


def prepare(model: torch.nn.Module, mode: str, liger: bool, log: Callable[[str], None]
            ) -> SpeedPlan:
    """Apply ``mode`` (from :func:`choose`) to the LoRA model's body, in place.

    In place: module names, and so the saved adapter, stay the same. Liger was applied by
    :func:`apply_liger` on the base before LoRA wrapped it (``liger`` says whether).
    """
    backbone = split_head(model)[0]
    layerwise = mode in INDUCTOR_MODES and bool(grad_checkpointing.layers(backbone))
    if layerwise:
        compile_layers(grad_checkpointing.flagged(backbone), mode)
    elif mode in INDUCTOR_MODES:
        backbone.compile(mode=mode)
    elif mode == "cudagraphs":
        GraphedBody.install(backbone, log)
    plan = SpeedPlan(mode, liger, layerwise)
    log(plan.describe())
    return plan


def compile_layers(checkpointed: list[torch.nn.Module], mode: str) -> None:
    """Compile what each checkpointed module runs inside its checkpoint, with one compiled
    function for all of them.

    ``torch.compile`` of a checkpointed body breaks its graph at every layer and runs each
    layer eager: dynamo refuses to trace ``saved_tensors_hooks`` (``offload_activations``),
    and transformers 5.25's layers set a context variable that dynamo's checkpoint will not
    replay ("HOP: Unsafe side effect"; 5.17's traced). Here the checkpoint and its hooks stay
    eager around a compiled layer. The compiled function takes the layer's call as an
    argument, so the identical layers share one graph (two: the first layer's input, the frozen
    embeddings' output, needs no gradient) instead of compiling one each, which torch's
    recompile limit of 8 would cut short at 28 layers.
    """
    run = torch.compile(_run_layer, mode=mode)
    for module in checkpointed:
        module._gradient_checkpointing_func = _CompiledInside(
            module._gradient_checkpointing_func, run)


def _run_layer(call: Callable, *args):
    return call(*args)


class _CompiledInside:
    """A module's checkpoint function, given the compiled layer call to checkpoint."""

    def __init__(self, checkpoint: Callable, run: Callable) -> None:
        self.checkpoint = checkpoint
        self.run = run

    def __call__(self, function: Callable, *args, **kwargs):
        return self.checkpoint(partial(self.run, function), *args, **kwargs)

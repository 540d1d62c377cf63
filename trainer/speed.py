"""How a training step is made fast: one decision per run, taken before the first step.

The eager step of a LoRA fine-tune on a GPU is bound by launching kernels, not by running them
(docs/benchmarks.md: GPT-2-124M kept an H200 busy 29.5 ms of a 63 ms step, ~1,800 launches). So
the default (``compile="auto"``) removes the launches where it can, with PyTorch's and Liger's
own code rather than kernels of ours:

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
  the body is not compiled by inductor (which fuses those itself). The loss keeps its own
  chunked cross-entropy through the head (``loss.py``): it is already the fused-linear form.
"""

from __future__ import annotations

import gc
import importlib.util
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial

import torch

from draslice.trainer import grad_checkpointing
from draslice.trainer.config import COMPILE_MODES
from draslice.trainer.loss import split_head

__all__ = ["COMPILE_MODES", "SpeedPlan", "apply_liger", "choose", "choose_mode", "prepare"]
INDUCTOR_MODES = ("default", "reduce-overhead")
LIGER_ARCHS = ("llama", "qwen2", "mistral")
WARMUP_ITERS = 3
"""Forward-backward passes before a CUDA graph capture (``make_graphed_callables``' own count)."""


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
        _GraphedBody.install(backbone, log)
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


class _HiddenStates(torch.nn.Module):
    """The body as a module of one tensor in, one out: what graph capture takes."""

    def __init__(self, backbone: torch.nn.Module, eager: Callable) -> None:
        super().__init__()
        self.backbone = backbone  # registered: capture takes the trainable weights from here
        self.eager = eager  # the body's own forward (its ``forward`` is now the dispatcher)

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        return self.eager(input_ids=input_ids, use_cache=False).last_hidden_state


class _GraphedBody:
    """Replaces the body's ``forward``: a training call with unpadded ``input_ids`` of the
    captured shape replays the graph; any other call runs the original forward.

    The graph is captured at the first training call, inside the loop's autocast, so it holds
    the same casts an eager step would run. If capture fails (an operation that cannot be
    captured, e.g. a host sync inside a model's forward) the run goes on eagerly and says why.
    """

    def __init__(self, backbone: torch.nn.Module, log: Callable[[str], None]) -> None:
        self.eager = backbone.forward
        self.hidden = _HiddenStates(backbone, self.eager)
        self.log = log
        self.shape: torch.Size | None = None
        self.failed = False

    @classmethod
    def install(cls, backbone: torch.nn.Module, log: Callable[[str], None]) -> None:
        backbone.forward = cls(backbone, log)

    def __call__(self, input_ids: torch.Tensor | None = None, attention_mask=None,
                 use_cache: bool | None = None, **kwargs):
        # The graph holds a forward without a KV cache, as the loss calls it (use_cache=False).
        graphable = (input_ids is not None and attention_mask is None and not use_cache
                     and not kwargs and torch.is_grad_enabled()
                     and self.hidden.backbone.training and not self.failed)
        if graphable and self.shape is None:
            self._capture(input_ids)
        if not graphable or self.failed or input_ids.shape != self.shape:
            return self.eager(input_ids=input_ids, attention_mask=attention_mask,
                              use_cache=use_cache, **kwargs)
        from transformers.modeling_outputs import BaseModelOutputWithPast

        return BaseModelOutputWithPast(last_hidden_state=self.hidden(input_ids))

    def _capture(self, input_ids: torch.Tensor) -> None:
        """Capture the body, warmed up by :meth:`_warm_up` first; if that capture fails, once
        more with ``make_graphed_callables``' own warm-up (the way this loop captured before,
        which captured GPT-2 and the seed model but never Qwen2.5-1.5B); then eager."""
        sample = input_ids.clone()

        def warmed_up_here() -> None:
            self._warm_up(sample, WARMUP_ITERS)
            torch.cuda.make_graphed_callables(self.hidden, (sample,), num_warmup_iters=0)

        failure = self._try(warmed_up_here)
        if failure is not None:
            first = failure
            failure = self._try(lambda: torch.cuda.make_graphed_callables(self.hidden, (sample,)))
            if failure is None:
                self.log("speed: CUDA graph captured on a second try, warmed up by "
                         f"make_graphed_callables itself (the first: {first})")
        if failure is not None:
            self.failed = True
            self.log(f"speed: CUDA graph capture failed ({failure}); running eager")
            return
        self.shape = input_ids.shape

    def _warm_up(self, sample: torch.Tensor, iters: int) -> None:
        """Forward and backward of the body on a side stream, everything they made dropped.

        ``make_graphed_callables`` warms up the same way, but its last warm-up's outputs stay
        referenced into the capture (torch 2.11's ``for v in [...]: del v`` deletes nothing),
        and with them the autograd graph and each LoRA weight's ``AccumulateGrad`` node,
        created on the warm-up stream, so the capture reuses nodes of another stream, which
        torch (2.10+) then has to synchronise with. On Qwen2.5-1.5B the capture failed right
        after torch's warning that "the AccumulateGrad node's stream does not match", which
        points here (docs/benchmarks.md, run H; not yet confirmed on a GPU, hence the second
        try). Warmed up here, nothing of it is alive at the capture, and the nodes are made
        anew on the capture's stream. The warm-up itself is what the capture
        needs: cuDNN plans, Triton autotuning and lazy CUDA set-up happen outside it.
        """
        params = tuple(p for p in self.hidden.parameters() if p.requires_grad)
        torch.cuda.synchronize()
        with torch.cuda.stream(torch.cuda.Stream()):
            for _ in range(iters):
                out = self.hidden(sample)
                torch.autograd.grad(out, params, grad_outputs=torch.empty_like(out))
                del out
        torch.cuda.synchronize()

    @staticmethod
    def _try(capture: Callable[[], object]) -> str | None:
        """Run one capture; None when it worked, else the error and the warnings raised during
        it (a warning tends to say why, the error only that the capture broke)."""
        with warnings.catch_warnings(record=True) as raised:
            warnings.simplefilter("always")
            try:
                capture()
            except Exception as err:  # noqa: BLE001 -- any capture failure leaves the eager path
                why = f"{type(err).__name__}: {str(err).splitlines()[0][:200]}"
            else:
                return None
        gc.collect()  # the failed capture's graph, before another capture or the eager steps
        said = dict.fromkeys(str(w.message).splitlines()[0][:200] for w in raised
                             if not issubclass(w.category, DeprecationWarning | FutureWarning))
        return why + "".join(f"; warning: {text}" for text in list(said)[:2])

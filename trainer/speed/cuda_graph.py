"""The transformer body replayed as one CUDA graph, forward and backward (``compile="cudagraphs"``,
what ``auto`` picks on a GPU at a fixed width; ``speed`` decides when).

``torch.cuda.make_graphed_callables`` captures the body once, at the first training call, and
each step replays it: one launch per pass instead of one per kernel, no compiler. Any call the
graph does not hold (another batch shape, padding, evaluation, a KV cache) runs the body's own
forward, and a capture that fails leaves the run eager with a line that says why.
"""

from __future__ import annotations

import gc
import time
import warnings
from collections.abc import Callable, Iterator
from contextlib import contextmanager

import torch

WARMUP_ITERS = 3
"""Forward-backward passes before a CUDA graph capture (``make_graphed_callables``' own count)."""
TIMED_REPLAYS = 2
"""Replays of a captured graph timed against the eager warm-up (``GraphedBody._keep_if_faster``)."""
KEEP_SLOWER = False
"""Keep a graph that replays but is not faster than eager. Off in every run of the loop; a
benchmark that checks what the graph learns rather than its speed (``loss_match.py``, whose
runs share one GPU and time each other's load) turns it on."""


class HiddenStates(torch.nn.Module):
    """The body as a module of one tensor in, one out: what graph capture takes."""

    def __init__(self, backbone: torch.nn.Module, eager: Callable) -> None:
        super().__init__()
        self.backbone = backbone  # registered: capture takes the trainable weights from here
        self.eager = eager  # the body's own forward (its ``forward`` is now the dispatcher)

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        return self.eager(input_ids=input_ids, use_cache=False).last_hidden_state


class GraphedBody:
    """Replaces the body's ``forward``: a training call with unpadded ``input_ids`` of the
    captured shape replays the graph; any other call runs the original forward.

    The graph is captured at the first training call, inside the loop's autocast, so it holds
    the same casts an eager step would run. If capture fails (an operation that cannot be
    captured, e.g. a host sync inside a model's forward) the run goes on eagerly and says why.
    """

    def __init__(self, backbone: torch.nn.Module, log: Callable[[str], None]) -> None:
        self.eager = backbone.forward
        self.hidden = HiddenStates(backbone, self.eager)
        self.log = log
        self.shape: torch.Size | None = None
        self.failed = False
        self.eager_pass_s = float("inf")  # the warm-up's fastest forward-backward

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

        first = self._try(warmed_up_here)
        if first is None:
            self._keep_if_faster(sample)
            return
        second = self._try(lambda: torch.cuda.make_graphed_callables(self.hidden, (sample,)))
        if second is None:
            self.log("speed: CUDA graph captured on a second try, warmed up by "
                     f"make_graphed_callables itself (the first: {first})")
            self._keep_if_faster(sample)
            return
        self.failed = True
        self.log(f"speed: CUDA graph capture failed ({first}; on a second try, warmed up by "
                 f"make_graphed_callables itself: {second}); running eager")

    def _warm_up(self, sample: torch.Tensor, iters: int) -> None:
        """Forward and backward of the body on a side stream, everything they made dropped.

        ``make_graphed_callables`` warms up the same way, but its last warm-up's outputs stay
        referenced into the capture (torch 2.11's ``for v in [...]: del v`` deletes nothing),
        and with them the autograd graph and each LoRA weight's ``AccumulateGrad`` node,
        created on the warm-up stream, so the capture reuses nodes of another stream, which
        torch (2.10+) then has to synchronise with. On Qwen2.5-1.5B the capture failed right
        after torch's warning that "the AccumulateGrad node's stream does not match", which
        points here. Warmed up here, nothing of it is alive at the capture, and the nodes are
        made anew on the capture's stream (a newer torch also redirects such nodes itself,
        :func:`stale_streams_redirected`): so the first try captures Qwen2.5-1.5B on an H200;
        the second try stays for shapes not measured.
        torch still prints that warning once there, and the capture and replays work. The
        warm-up itself is what the capture needs: cuDNN plans, Triton autotuning and lazy CUDA
        set-up happen outside it.

        The blocks the warm-up freed stay cached for its side stream, where neither the
        capture's private pool nor the eager steps can use them, so they go back to the device
        first: on Qwen2.5-1.5B at 8 x 2048 a step's activations take about half the H200, and
        with the warm-up's kept the capture failed and the eager run after it ran out of
        memory at 134.8 of 139.8 GiB.
        """
        torch.cuda.synchronize()
        with torch.cuda.stream(torch.cuda.Stream()):
            for i in range(iters):  # the first pass sets things up: the others are timed
                took = self._timed_pass(sample)
                if i:
                    self.eager_pass_s = min(self.eager_pass_s, took)
        torch.cuda.empty_cache()

    def _timed_pass(self, sample: torch.Tensor) -> float:
        """One forward and backward of the body (graphed or not), nothing kept; seconds,
        host and device, from an idle device to an idle device."""
        params = tuple(p for p in self.hidden.parameters() if p.requires_grad)
        torch.cuda.synchronize()
        start = time.perf_counter()
        out = self.hidden(sample)
        torch.autograd.grad(out, params, grad_outputs=torch.empty_like(out))
        del out
        torch.cuda.synchronize()
        return time.perf_counter() - start

    def _keep_if_faster(self, sample: torch.Tensor) -> None:
        """Replay the captured graph ``TIMED_REPLAYS`` times; keep it only if its fastest
        pass beats the eager warm-up's fastest, else drop it and run eager.

        A graph removes the host's launch cost, which bounds small models' steps (GPT-2-124M
        at 8 x 512: the default 2.6x HF Trainer); on a large step the device is busy anyway,
        and the graph was slower: Qwen2.5-1.5B at 8 x 2048 on an H200 ran 45,908 tokens/s
        replayed against 52,769 eager. Where the two cross
        depends on the model, the batch and the device, so it is measured here, on the
        shape the run trains, for the cost of a few passes.
        """
        try:
            graphed = min(self._timed_pass(sample) for _ in range(TIMED_REPLAYS))
        except Exception as err:  # noqa: BLE001 -- a graph that cannot replay is not kept
            graphed, why = float("inf"), _said(err)
        else:
            why = ""
        if graphed < self.eager_pass_s or (KEEP_SLOWER and not why):
            self.shape = sample.shape
            return
        # the graphed forward make_graphed_callables set, and with it the graph and its pool
        self.hidden.__dict__.pop("forward", None)
        gc.collect()
        torch.cuda.empty_cache()
        self.failed = True
        if why:
            self.log(f"speed: CUDA graph captured but its replay failed ({why}); running eager")
        else:
            self.log(f"speed: CUDA graph not faster here ({graphed * 1e3:.1f} ms a forward and "
                     f"backward replayed, {self.eager_pass_s * 1e3:.1f} ms eager); "
                     "running eager")

    @staticmethod
    def _try(capture: Callable[[], object]) -> str | None:
        """Run one capture; None when it worked, else the error and the warnings raised during
        it (a warning tends to say why, the error only that the capture broke)."""
        with warnings.catch_warnings(record=True) as raised, stale_streams_redirected():
            warnings.simplefilter("always")
            try:
                capture()
            except Exception as err:  # noqa: BLE001 -- any capture failure leaves the eager path
                why = _said(err)
            else:
                return None
        # The failed capture's graph and pool, before another capture or the eager steps.
        gc.collect()
        torch.cuda.empty_cache()
        said = dict.fromkeys(str(w.message).splitlines()[0][:200] for w in raised
                             if not issubclass(w.category, DeprecationWarning | FutureWarning))
        return why + "".join(f"; warning: {text}" for text in list(said)[:2])


def _said(err: Exception) -> str:
    """An error in one short line: its type and its message's first line."""
    return f"{type(err).__name__}: {str(err).splitlines()[0][:200]}"


@contextmanager
def stale_streams_redirected() -> Iterator[None]:
    """While capturing: an autograd node still on a stream from before the capture runs on the
    capturing one (``torch.autograd.graph.set_override_stale_capture_stream``, pytorch
    PR #180090; torch 2.13 has it).

    Torch's own remedy for the failure :meth:`GraphedBody._warm_up` works around: without it,
    a node made on a stream that is not capturing makes the capture wait on that stream, which
    invalidates it. The setting is process-wide, so the one before is put back. An older torch
    has no such setting, and only the warm-up protects its capture.
    """
    override = getattr(torch.autograd.graph, "set_override_stale_capture_stream", None)
    current = getattr(torch._C, "_override_stale_capture_stream", None)
    if override is None or current is None:
        yield
        return
    before = current()
    override(True)
    try:
        yield
    finally:
        override(before)

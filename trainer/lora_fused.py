"""LoRA's update added to the base projections in fewer, larger operations while the loop trains.

peft adds a LoRA layer's update as ``result + lora_B(lora_A(x)) * scaling``: the update is
written at the projection's full output width, read and written again to scale it, and read
once more with ``result`` to add them, and the scaling's backward makes one more full-width
pass. For the seven projections of a Qwen2.5-1.5B layer that is about 4.5 GB of memory traffic
a forward at 16,384 tokens. ``addmm(result, x A^T, B^T, alpha=scaling)`` does the same in the
matmul's epilogue (cuBLAS reads ``result`` once and writes the sum once; ``alpha`` scales in
the accumulator). On an H200 that made a Qwen2.5-1.5B step at 8 x 2,048 tokens 1.05x faster,
uncapped and in a 5.75 GiB slice alike (docs/benchmarks.md, run H).

A small model's step is bound by launching kernels rather than by running them (Qwen2.5-0.5B
in a slice: ~4,000 launches a step, run L), so the projections that read one input (a Llama
or Qwen layer's q/k/v, and its gate/up) are computed in one call, as Unsloth's LoRA kernels do:
one matmul for all their ``x A^T``, and a backward of our own (:class:`_LoRAGroup`) that adds
every input gradient into one buffer and makes each weight gradient with one matmul, where
autograd's generic backward scales, casts and adds each projection's pieces apart. The bf16
copies of the fp32 LoRA weights are made once a step and reused by the recompute of gradient
checkpointing (:class:`_CastWeights`). ``benchmarks/lora_launches.py`` counts the operators.

Only while the loop trains under bf16 autocast (``build.Training.lora_inputs_uncast``), and only
for plain LoRA (one active adapter, no dropout, not merged, no DoRA or other variant, no
per-call arguments): anything else, and every forward outside the loop, is peft's own.
"""

from __future__ import annotations

from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import torch
from torch.optim.optimizer import register_optimizer_step_post_hook

from draslice.trainer.device import matmul_dtype

if TYPE_CHECKING:
    from collections.abc import Iterator, Sequence

# Sibling projections that read the same input, by name, in the model families whose layers
# call them one after the other on one tensor (Llama, Qwen2/3, Mistral, Gemma).
# A member called with another input computes alone (:meth:`Group.output`): grouping is only
# ever an optimisation.
SIBLINGS = (("q_proj", "k_proj", "v_proj"), ("gate_proj", "up_proj"))


@dataclass(eq=False)
class _CastWeights:
    """A group's LoRA weights in the matmul dtype, concatenated: ``a`` is (sum of ranks, in),
    ``b`` is (sum of outputs, rank).

    Made again after every optimizer step (:func:`fused` clears them then: the fused AdamW
    writes the weights without bumping their version), after any other in-place change, or for
    another dtype, so the recompute of a checkpointed layer reuses the forward's copies instead
    of casting every weight again. Never kept while a CUDA graph is captured: its replays must
    cast the weights the optimizer has changed since.
    """

    key: tuple = ()
    a: torch.Tensor | None = None
    b: torch.Tensor | None = None

    def clear(self) -> None:
        self.key, self.a, self.b = (), None, None

    def get(self, a_weights: Sequence[torch.Tensor], b_weights: Sequence[torch.Tensor],
            dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
        key = (dtype, *((id(w), w.data_ptr(), w._version) for w in (*a_weights, *b_weights)))
        capturing = a_weights[0].is_cuda and torch.cuda.is_current_stream_capturing()
        if key == self.key and not capturing:
            return self.a, self.b
        with torch.no_grad():
            a = _cat(a_weights).to(dtype)
            b = _cat(b_weights).to(dtype)
        if not capturing:
            self.key, self.a, self.b = key, a, b
        return a, b


def _cat(tensors: Sequence[torch.Tensor]) -> torch.Tensor:
    return tensors[0] if len(tensors) == 1 else torch.cat(tensors)


@dataclass(eq=False)
class _Spec:
    """What :class:`_LoRAGroup` needs besides its tensor inputs (none of it differentiated)."""

    a: torch.Tensor
    """The members' A weights in the matmul dtype, concatenated (``_CastWeights.a``)."""
    b: torch.Tensor
    """Their B weights so (``_CastWeights.b``)."""
    ranks: list[int]
    outs: list[int]
    scalings: list[float]
    bases: list[tuple[torch.Tensor, torch.Tensor | None]] | None
    """Each member's frozen (weight, bias), when the base matmuls run inside the group's own
    call; None when each member's base output is an input (4-bit and other base layers)."""
    offsets: list[int] = field(init=False)
    out_offsets: list[int] = field(init=False)

    def __post_init__(self) -> None:
        self.offsets = [sum(self.ranks[:i]) for i in range(len(self.ranks) + 1)]
        self.out_offsets = [sum(self.outs[:i]) for i in range(len(self.outs) + 1)]


class _LoRAGroup(torch.autograd.Function):
    """``out_i = base_i(x) + s_i (x A_i^T) B_i^T`` for the members of a group, on 2-D ``x``.

    Inputs after the spec: ``x``, the members' fp32 A weights, their B weights, then (when
    ``spec.bases`` is None) their base outputs. The weights are inputs so that autograd hands
    their gradients to the optimizer's parameters; the matmuls read the spec's cast copies.
    """

    @staticmethod
    def forward(ctx, spec: _Spec, x: torch.Tensor, *tensors: torch.Tensor):
        n = len(spec.ranks)
        low = x @ spec.a.t()  # every member's x A^T, in one matmul
        outs = []
        for i in range(n):
            if spec.bases is None:
                base = tensors[2 * n + i]
            else:
                weight, bias = spec.bases[i]
                base = (torch.mm(x, weight.t()) if bias is None
                        else torch.addmm(bias, x, weight.t()))
            outs.append(torch.addmm(base, low[:, spec.offsets[i]:spec.offsets[i + 1]],
                                    _rows(spec.b, spec.out_offsets, i).t(),
                                    alpha=spec.scalings[i]))
        ctx.spec = spec
        ctx.save_for_backward(x, low)
        return tuple(outs)

    @staticmethod
    def backward(ctx, *grads: torch.Tensor | None):
        spec: _Spec = ctx.spec
        x, low = ctx.saved_tensors
        n = len(spec.ranks)
        # u^T = s B^T g^T for every member, stacked: the gradient of x A^T, transposed, so that
        # each member's rows are one contiguous block (the matmul writes it in place).
        u_t = x.new_empty(spec.offsets[-1], x.shape[0])
        b_grad = spec.b.new_empty(spec.b.shape)
        x_grad = None
        for i, grad in enumerate(grads):
            u_rows = u_t[spec.offsets[i]:spec.offsets[i + 1]]
            b_rows = _rows(b_grad, spec.out_offsets, i)
            if grad is None:  # a member whose output was not used
                u_rows.zero_()
                b_rows.zero_()
                continue
            grad = grad.to(x.dtype)
            scaling = spec.scalings[i]  # applied in the matmuls' accumulators
            torch.addmm(u_rows, _rows(spec.b, spec.out_offsets, i).t(), grad.t(), beta=0,
                        alpha=scaling, out=u_rows)
            torch.addmm(b_rows, grad.t(), low[:, spec.offsets[i]:spec.offsets[i + 1]], beta=0,
                        alpha=scaling, out=b_rows)
            if ctx.needs_input_grad[1] and spec.bases is not None:
                weight = spec.bases[i][0]
                x_grad = grad @ weight if x_grad is None else x_grad.addmm_(grad, weight)
        a_grad = (u_t @ x).float()
        b_grad = b_grad.float()
        if ctx.needs_input_grad[1]:
            x_grad = (u_t.t() @ spec.a if x_grad is None
                      else x_grad.addmm_(u_t.t(), spec.a))
        base_grads = (tuple(grads) if spec.bases is None else ())
        return (None, x_grad,
                *(a_grad[spec.offsets[i]:spec.offsets[i + 1]] for i in range(n)),
                *(_rows(b_grad, spec.out_offsets, i) for i in range(n)),
                *base_grads)


def _rows(t: torch.Tensor, offsets: list[int], i: int) -> torch.Tensor:
    return t[offsets[i]:offsets[i + 1]]


class Group:
    """Sibling LoRA layers that read one input: the first called computes them all.

    The others' outputs wait in ``pending`` until they are called with the same tensor; one
    called with another input (or with arguments, or not plain LoRA) computes alone.
    """

    def __init__(self, layers: Sequence[torch.nn.Module]) -> None:
        self.layers = list(layers)
        self.weights = _CastWeights()
        self.pending: dict[int, torch.Tensor] = {}
        self.pending_x: torch.Tensor | None = None

    def output(self, index: int, x: torch.Tensor) -> torch.Tensor:
        if self.pending_x is x and index in self.pending:
            out = self.pending.pop(index)
            if not self.pending:
                self.pending_x = None
            return out
        members = self.layers if self._plain(self.layers) else [self.layers[index]]
        if len(members) > 1:
            outs = self._compute(members, x, self.weights)
            self.pending = {i: out for i, out in enumerate(outs) if i != index}
            self.pending_x = x
            return outs[index]
        return self._compute(members, x, self.weights if len(self.layers) == 1
                             else _CastWeights())[0]

    @staticmethod
    def _plain(layers: Sequence[torch.nn.Module]) -> bool:
        names = {plain_adapter(layer) for layer in layers}
        return None not in names and len(names) == 1

    @staticmethod
    def _compute(layers: Sequence[torch.nn.Module], x: torch.Tensor, weights: _CastWeights
                 ) -> list[torch.Tensor]:
        """The members' outputs for ``x``: their base matmuls inside the group's call where
        each base is a frozen ``nn.Linear`` in the matmul dtype already, before it otherwise
        (a 4-bit base dequantises in its own call; an fp32 base is cast by autocast)."""
        name = layers[0].active_adapters[0]
        base_layers = [layer.base_layer for layer in layers]
        inside = all(type(base) is torch.nn.Linear and not base.weight.requires_grad
                     and (base.bias is None or not base.bias.requires_grad)
                     for base in base_layers)
        dtype = matmul_dtype(x.device.type, base_layers[0].weight.dtype
                             if inside else x.dtype)
        inside = inside and all(base.weight.dtype == dtype and (
            base.bias is None or base.bias.dtype == dtype) for base in base_layers)
        outer = [] if inside else [base(x) for base in base_layers]
        result_dtype = outer[0].dtype if outer else dtype
        outer = [out.reshape(-1, out.shape[-1]).to(dtype) for out in outer]
        a_weights = [layer.lora_A[name].weight for layer in layers]
        b_weights = [layer.lora_B[name].weight for layer in layers]
        a, b = weights.get(a_weights, b_weights, dtype)
        spec = _Spec(a, b, ranks=[w.shape[0] for w in a_weights],
                     outs=[w.shape[0] for w in b_weights],
                     scalings=[float(layer.scaling[name]) for layer in layers],
                     bases=[(base.weight, base.bias) for base in base_layers] if inside
                     else None)
        flat = x.reshape(-1, x.shape[-1]).to(dtype)
        outs = _LoRAGroup.apply(spec, flat, *a_weights, *b_weights, *outer)
        return [out.view(*x.shape[:-1], out.shape[-1]).to(result_dtype) for out in outs]


def plain_adapter(layer: torch.nn.Module) -> str | None:
    """The one active adapter's name when the fused sum computes what peft would."""
    if layer.disable_adapters or layer.merged or len(layer.active_adapters) != 1:
        return None
    name = layer.active_adapters[0]
    if (name not in layer.lora_A or name in getattr(layer, "lora_variant", {})
            or not isinstance(layer.lora_dropout[name], torch.nn.Identity)):
        return None
    return name


class FusedForward:
    """Replaces a peft ``lora.Linear``'s ``forward`` while installed."""

    def __init__(self, group: Group, index: int) -> None:
        self.group = group
        self.index = index

    def __call__(self, x: torch.Tensor, *args, **kwargs) -> torch.Tensor:
        layer = self.group.layers[self.index]
        if args or kwargs or plain_adapter(layer) is None:
            return type(layer).forward(layer, x, *args, **kwargs)
        return self.group.output(self.index, x)


def lora_layers(model: torch.nn.Module) -> list[torch.nn.Module]:
    """The peft LoRA linear layers of ``model``: over a plain or a 4-bit (QLoRA) base layer.

    peft's 4-bit layer also clones the base output before adding to it ("defensively", against
    an in-place add on a view); the fused sum adds nothing in place, so that full-width copy
    goes too. Subclasses (FSDP2's, other quantisations) keep peft's forward.
    """
    from peft.tuners.lora import Linear

    kinds: tuple[type, ...] = (Linear,)
    try:
        from peft.tuners.lora.bnb import Linear4bit
    except ImportError:  # bitsandbytes not installed: no 4-bit layers either
        pass
    else:
        kinds += (Linear4bit,)
    return [m for m in model.modules() if type(m) in kinds]


def groups(model: torch.nn.Module, group: bool = True) -> list[Group]:
    """Every LoRA layer of ``model`` in one :class:`Group`: with its :data:`SIBLINGS` (same
    parent, same input width), or alone (all alone with ``group=False``)."""
    layers = lora_layers(model)
    chosen = {id(layer) for layer in layers}
    found: list[Group] = []
    placed: set[int] = set()
    if group:
        for parent in model.modules():
            children = dict(parent.named_children())
            for names in SIBLINGS:
                members = [children[n] for n in names
                           if n in children and id(children[n]) in chosen]
                widths = {m.in_features for m in members}
                if len(members) > 1 and len(widths) == 1:
                    found.append(Group(members))
                    placed.update(id(m) for m in members)
    found += [Group([layer]) for layer in layers if id(layer) not in placed]
    return found


@contextmanager
def fused(model: torch.nn.Module, group: bool = True) -> Iterator[int]:
    """Install :class:`FusedForward` on every plain LoRA layer; yields how many layers."""
    installed = groups(model, group)
    for g in installed:
        for i, layer in enumerate(g.layers):
            layer.forward = FusedForward(g, i)

    def stepped(*_args) -> None:  # the weights changed: the casts are stale
        for g in installed:
            g.weights.clear()

    hook = register_optimizer_step_post_hook(stepped)
    try:
        yield sum(len(g.layers) for g in installed)
    finally:
        hook.remove()
        for g in installed:
            for layer in g.layers:
                del layer.forward

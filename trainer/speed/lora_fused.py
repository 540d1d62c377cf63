"""LoRA's update added to the base projections in fewer, larger operations while the loop trains.

peft adds a LoRA layer's update as ``result + lora_B(lora_A(x)) * scaling``: the update is
written at the projection's full output width, read and written again to scale it, and read
once more with ``result`` to add them, and the scaling's backward makes one more full-width
pass. For the seven projections of a Qwen2.5-1.5B layer that is about 4.5 GB of memory traffic
a forward at 16,384 tokens. ``addmm(result, x A^T, B^T, alpha=scaling)`` does the same in the
matmul's epilogue (cuBLAS reads ``result`` once and writes the sum once; ``alpha`` scales in
the accumulator). On an H200 that made a Qwen2.5-1.5B step at 8 x 2,048 tokens 1.05x faster,
uncapped and in a 5.75 GiB slice alike (``benchmarks/peer_trainers.py``, ``ours-offload-peft``).

A small model's step is bound by launching kernels rather than by running them (Qwen2.5-0.5B in
a slice: ~4,000 launches a step, ``benchmarks/profile_step.py``), so the projections that read
one input (a Llama or Qwen layer's q/k/v, and its gate/up) are computed in one call, as
Unsloth's LoRA kernels do: one matmul for all their ``x A^T``, and a backward of our own
(:class:`_LoRAGroup`) that adds every input gradient into one buffer and makes the group's A
gradients in one matmul, where autograd's generic backward scales, casts and adds each
projection's pieces apart. The bf16 copies of the fp32 LoRA weights are made once a step and
reused by the recompute of gradient checkpointing (:class:`_Plan`). A frozen base, plain or
4-bit, is multiplied inside the same call (:class:`_Base`), so its input gradient needs no sum
of its own either. ``benchmarks/host_cost.py`` counts the operators.

Even in the matmul's epilogue, adding the update costs a matmul of inner size r (16) that reads
and writes the whole output, and its backward reads the output's gradient once more for
``s g B``: at 16,384 tokens a gate or up projection's output is 290 MB, and in a profile of the
Qwen2.5-1.5B step in a 5.75 GiB slice on an H100 these thin matmuls took about 15% of the
step. Over a plain bf16 base, a large call whose outputs are wider than its input (gate/up)
instead stacks the inner dimension (:func:`_stacked`): ``[x | x A^T] [W^T ; s B^T]`` is the
base matmul with r more columns and one pass over the output, and the same stacking in
backward gives ``g W`` and ``s g B`` from one read of ``g``. The stacked weight is built for
each use (a copy of ``W``, far smaller than the output at these rows) and never kept, so it
holds no memory between the calls. On an H100 that made the Qwen2.5-1.5B step 1.04x faster at
8 x 2,048 in the slice and 1.02x uncapped at 4 x 2,048, for 0.04-0.16 GiB more at the peak
(``benchmarks/peer_trainers.py``, ``ours-offload-epilogue``).

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
# Whether this torch has the matmul that writes fp32 from bf16 inputs (``mm.dtype``, CUDA only).
_MM_OUT_DTYPE = "dtype" in torch.ops.aten.mm.overloads()

STACK_MIN_ELEMENTS = 1 << 24
"""A call stacks the inner dimension (:func:`_stacked`) when its rows times its members' output
widths reach this many elements, and those widths are :data:`STACK_MIN_WIDTH_RATIO` times its
input's. Below this size the few launches the stacking adds (copies of the input and of each
weight) cost about what the saved passes do at an H100's 3 TB/s, and the step of a small model
is bound by launching kernels."""
STACK_MIN_WIDTH_RATIO = 2.0
"""Stacking saves two passes over the outputs in forward and one over their gradients in
backward, and costs two over the input (copied beside ``x A^T``) in forward and two over its
gradient (made contiguous) in backward: worth it where the outputs are the wider, a Llama or
Qwen layer's gate/up (8,960 x 2 against 1,536 at Qwen2.5-1.5B), not its down projection."""


@dataclass(eq=False)
class _Plan:
    """How some members of a group are computed for one adapter and matmul dtype: which
    weights, where each member's rows and columns lie in the concatenated ones, and whether
    the base matmuls run inside the group's call. Fixed while the loop trains, so it is made
    once, not at every call of a step that is bound by the host.

    It also keeps the members' LoRA weights in the matmul dtype, concatenated: ``a`` (sum of
    ranks, in) and each member's ``B^T`` (a view of one concatenated ``b``). They are made again
    after every optimizer step (:func:`fused` clears them then: the fused AdamW writes the
    weights without bumping their version) and after any other in-place change, so the
    recompute of a checkpointed layer reuses the forward's copies instead of casting every
    weight again. Never kept while a CUDA graph is captured: its replays must
    cast the weights the optimizer has changed since.
    """

    a_weights: list[torch.Tensor]
    b_weights: list[torch.Tensor]
    scalings: list[float]
    bases: list[_Base] | None
    """Each member's frozen base, when the base matmuls run inside the group's own call;
    None when each member's base output is an input (base layers of other kinds)."""
    dtype: torch.dtype
    stackable: bool = False
    """Every base is a plain ``nn.Linear`` inside the call (a 4-bit base is dequantised for each
    use instead) and the members' outputs are :data:`STACK_MIN_WIDTH_RATIO` times as wide as
    their input, so a large call stacks the inner dimension (:func:`_stacked`)."""
    ranks: list[slice] = field(init=False)
    """Each member's columns of ``x A^T`` (its rows of ``a``)."""
    outs: list[slice] = field(init=False)
    """Each member's rows of ``b``."""
    key: tuple = ()
    a: torch.Tensor | None = None
    b_t: list[torch.Tensor] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.ranks = _slices([w.shape[0] for w in self.a_weights])
        self.outs = _slices([w.shape[0] for w in self.b_weights])

    def clear(self) -> None:
        self.key, self.a, self.b_t = (), None, []

    def casts(self) -> tuple[torch.Tensor, list[torch.Tensor]]:
        weights = (*self.a_weights, *self.b_weights)
        key = tuple((w.data_ptr(), w._version) for w in weights)
        capturing = weights[0].is_cuda and torch.cuda.is_current_stream_capturing()
        if key == self.key and not capturing:
            return self.a, self.b_t
        with torch.no_grad():
            a = _cat(self.a_weights).to(self.dtype)
            b = _cat(self.b_weights).to(self.dtype)
        b_t = [b[rows].t() for rows in self.outs]
        if not capturing:
            self.key, self.a, self.b_t = key, a, b_t
        return a, b_t


@dataclass(eq=False)
class _Base:
    """A frozen base projection the group's call multiplies by itself: a plain ``nn.Linear``
    already in the matmul dtype, or bitsandbytes' 4-bit one, dequantised for each use (forward,
    recompute, backward) as bitsandbytes' own matmul does. Inside the call, its input gradient
    is added into the group's one buffer by the matmul, not by a separate full-width sum."""

    layer: torch.nn.Module
    dtype: torch.dtype

    @classmethod
    def of(cls, layer: torch.nn.Module, dtype: torch.dtype) -> _Base | None:
        weight, bias = layer.weight, layer.bias
        if weight.requires_grad or (bias is not None and (
                bias.requires_grad or bias.dtype != dtype)):
            return None
        if type(layer) is torch.nn.Linear:
            return cls(layer, dtype) if weight.dtype == dtype else None
        if _is_4bit(layer) and getattr(weight, "quant_state", None) is not None:
            return cls(layer, dtype)
        return None

    def weight(self) -> torch.Tensor:
        """(out, in) in the matmul dtype."""
        weight = self.layer.weight
        if type(self.layer) is torch.nn.Linear:
            return weight
        from bitsandbytes.functional import dequantize_4bit

        return dequantize_4bit(weight.data, weight.quant_state).to(self.dtype)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        bias = self.layer.bias
        weight = self.weight()
        return torch.mm(x, weight.t()) if bias is None else torch.addmm(bias, x, weight.t())


def _is_4bit(layer: torch.nn.Module) -> bool:
    try:
        from bitsandbytes.nn import Linear4bit
    except ImportError:  # bitsandbytes not installed: no 4-bit layers either
        return False
    return type(layer) is Linear4bit


def _slices(sizes: list[int]) -> list[slice]:
    ends = [sum(sizes[:i + 1]) for i in range(len(sizes))]
    return [slice(end - size, end) for size, end in zip(sizes, ends, strict=True)]


def _cat(tensors: Sequence[torch.Tensor]) -> torch.Tensor:
    return tensors[0] if len(tensors) == 1 else torch.cat(tensors)


class _LoRAGroup(torch.autograd.Function):
    """``out_i = base_i(x) + s_i (x A_i^T) B_i^T`` for the members of a plan, on 2-D ``x``.

    Inputs after the plan and the casts: ``x``, the members' fp32 A weights, their B weights,
    then (without ``plan.bases``) their base outputs. The weights are inputs so that autograd
    hands their gradients to the optimizer's parameters; the matmuls read the cast copies.
    """

    @staticmethod
    def forward(ctx, plan: _Plan, a: torch.Tensor, b_t: list[torch.Tensor], stack: bool,
                x: torch.Tensor, *tensors: torch.Tensor):
        ctx.plan, ctx.a, ctx.b_t, ctx.stack = plan, a, b_t, stack
        if stack:  # [x | x A^T] against each member's [W^T ; s B^T]: one pass over its output
            width = x.shape[1]
            inputs = x.new_empty(x.shape[0], width + a.shape[0])
            inputs[:, :width].copy_(x)
            torch.mm(x, a.t(), out=inputs[:, width:])
            outs = []
            for i, base in enumerate(plan.bases):
                weight, bias = _stacked(plan, i, b_t[i]), base.layer.bias
                outs.append(torch.mm(inputs, weight.t()) if bias is None
                            else torch.addmm(bias, inputs, weight.t()))
                del weight
            ctx.save_for_backward(inputs)
            return tuple(outs)
        n = len(plan.ranks)
        low = x @ a.t()  # every member's x A^T, in one matmul
        outs = []
        for i, cols in enumerate(plan.ranks):
            base = tensors[2 * n + i] if plan.bases is None else plan.bases[i].forward(x)
            outs.append(torch.addmm(base, low[:, cols], b_t[i], alpha=plan.scalings[i]))
        ctx.save_for_backward(x, low)
        return tuple(outs)

    @staticmethod
    def backward(ctx, *grads: torch.Tensor | None):
        if ctx.stack:
            return _LoRAGroup.stacked_backward(ctx, grads)
        plan: _Plan = ctx.plan
        x, low = ctx.saved_tensors
        x_needed = ctx.needs_input_grad[4]
        # u^T = s B^T g^T for every member, stacked: the gradient of x A^T, transposed, so that
        # each member's rows are one contiguous block (the matmul writes it in place).
        u_t = x.new_empty(low.shape[1], x.shape[0])
        b_grad = x.new_empty(plan.outs[-1].stop, low.shape[1] // len(plan.ranks))
        x_grad = None
        for i, grad in enumerate(grads):
            u_rows, b_rows = u_t[plan.ranks[i]], b_grad[plan.outs[i]]
            if grad is None:  # a member whose output was not used
                u_rows.zero_()
                b_rows.zero_()
                continue
            grad = grad.to(x.dtype)
            scaling = plan.scalings[i]  # applied in the matmuls' accumulators
            torch.addmm(u_rows, ctx.b_t[i], grad.t(), beta=0, alpha=scaling, out=u_rows)
            torch.addmm(b_rows, grad.t(), low[:, plan.ranks[i]], beta=0, alpha=scaling,
                        out=b_rows)
            if x_needed and plan.bases is not None:
                weight = plan.bases[i].weight()
                x_grad = grad @ weight if x_grad is None else x_grad.addmm_(grad, weight)
                del weight  # a dequantised 4-bit weight: gone before the next one is made
        a_grad = _mm_fp32(u_t, x)
        b_grad = b_grad.float()
        if x_needed:
            x_grad = u_t.t() @ ctx.a if x_grad is None else x_grad.addmm_(u_t.t(), ctx.a)
        return (None, None, None, None, x_grad, *(a_grad[cols] for cols in plan.ranks),
                *(b_grad[rows] for rows in plan.outs),
                *(grads if plan.bases is None else ()))

    @staticmethod
    def stacked_backward(ctx, grads: tuple[torch.Tensor | None, ...]):
        """The forward's stacking, backwards: ``g [W , s B]`` summed over the members is
        ``[g_x | u]`` in one buffer, where ``u`` is the gradient of ``x A^T``; then
        ``x``'s gradient is ``g_x + u A`` and the A gradients ``u^T x``."""
        plan: _Plan = ctx.plan
        (inputs,) = ctx.saved_tensors
        width = inputs.shape[1] - ctx.a.shape[0]
        x, low = inputs[:, :width], inputs[:, width:]
        summed = None
        b_grad = x.new_empty(plan.outs[-1].stop, low.shape[1] // len(plan.ranks))
        for i, grad in enumerate(grads):
            b_rows = b_grad[plan.outs[i]]
            if grad is None:  # a member whose output was not used
                b_rows.zero_()
                continue
            grad = grad.to(x.dtype)
            weight = _stacked(plan, i, ctx.b_t[i])
            summed = grad @ weight if summed is None else summed.addmm_(grad, weight)
            del weight
            torch.addmm(b_rows, grad.t(), low[:, plan.ranks[i]], beta=0,
                        alpha=plan.scalings[i], out=b_rows)
        if summed is None:
            summed = inputs.new_zeros(inputs.shape)
        u = summed[:, width:]
        a_grad = _mm_fp32(u.t(), x)
        x_grad = None
        if ctx.needs_input_grad[4]:
            # Contiguous for the kernels upstream (a norm's backward reads rows densely).
            x_grad = summed[:, :width].addmm_(u, ctx.a).contiguous()
        b_grad = b_grad.float()
        return (None, None, None, None, x_grad, *(a_grad[cols] for cols in plan.ranks),
                *(b_grad[rows] for rows in plan.outs))


def _mm_fp32(left: torch.Tensor, right: torch.Tensor) -> torch.Tensor:
    """``left @ right`` in fp32, for the A gradients. On CUDA the matmul writes fp32 itself
    (its accumulator is fp32): one cast a call fewer. (The B gradients' addmm keeps its cast:
    torch's CUDA addmm with out_dtype, as read in its source, checks that the sum's ``self``
    has the inputs' dtype.)"""
    if (_MM_OUT_DTYPE and left.is_cuda
            and left.dtype in (torch.bfloat16, torch.float16)):
        return torch.mm(left, right, out_dtype=torch.float32)
    return (left @ right).float()


def _stacked(plan: _Plan, index: int, b_t: torch.Tensor) -> torch.Tensor:
    """Member ``index``'s base weight with the LoRA update as more input columns: ``(out,
    in + sum of ranks)``, ``[W | s B]`` where its own rank's columns hold ``s B`` and the
    other members' zeros, so that ``[x | x A^T]`` times its transpose is the member's output."""
    base = plan.bases[index].weight()
    out, width = base.shape
    total = plan.ranks[-1].stop
    weight = base.new_empty(out, width + total)
    weight[:, :width].copy_(base)
    if len(plan.ranks) > 1:
        weight[:, width:].zero_()
    cols = plan.ranks[index]
    torch.mul(b_t.t(), plan.scalings[index], out=weight[:, width + cols.start:width + cols.stop])
    return weight


class Group:
    """Sibling LoRA layers that read one input: the first called computes them all.

    The others' outputs wait in ``pending`` until they are called with the same tensor; one
    called with another input (or with arguments, or not plain LoRA) computes alone.
    """

    def __init__(self, layers: Sequence[torch.nn.Module]) -> None:
        self.layers = list(layers)
        self.plans: dict[tuple, _Plan] = {}
        self.pending: dict[int, torch.Tensor] = {}
        self.pending_x: torch.Tensor | None = None

    def output(self, index: int, x: torch.Tensor, *args, **kwargs) -> torch.Tensor:
        layer = self.layers[index]
        if args or kwargs:
            return type(layer).forward(layer, x, *args, **kwargs)
        if self.pending_x is x and index in self.pending:
            out = self.pending.pop(index)  # its leader checked it was plain LoRA
            if not self.pending:
                self.pending_x = None
            return out
        names = [plain_adapter(member) for member in self.layers]
        if len(names) > 1 and None not in names and len(set(names)) == 1:
            outs = self._compute(tuple(range(len(names))), names[0], x)
            self.pending = {i: out for i, out in enumerate(outs) if i != index}
            self.pending_x = x
            return outs[index]
        if names[index] is None:
            return type(layer).forward(layer, x)
        return self._compute((index,), names[index], x)[0]

    def clear(self) -> None:
        for plan in self.plans.values():
            plan.clear()

    def _compute(self, members: tuple[int, ...], name: str, x: torch.Tensor
                 ) -> list[torch.Tensor]:
        """The members' outputs for ``x``: their base matmuls inside the group's call where
        every base is a :class:`_Base`, before it otherwise (through each base layer's own
        forward: an fp32 base under autocast, say)."""
        dtype = matmul_dtype(x.device.type, x.dtype)
        plan = self.plans.get((members, name, dtype))
        if plan is None:
            plan = self.plans[members, name, dtype] = self._plan(members, name, x)
        if plan.bases is None:
            outer = [self.layers[i].base_layer(x) for i in members]
            result_dtype = outer[0].dtype
            outer = [out.reshape(-1, out.shape[-1]).to(plan.dtype) for out in outer]
        else:
            outer, result_dtype = [], plan.dtype
        a, b_t = plan.casts()
        flat = x.reshape(-1, x.shape[-1]).to(plan.dtype)
        stack = plan.stackable and flat.shape[0] * plan.outs[-1].stop >= STACK_MIN_ELEMENTS
        outs = _LoRAGroup.apply(plan, a, b_t, stack, flat, *plan.a_weights, *plan.b_weights,
                                *outer)
        return [out.view(*x.shape[:-1], out.shape[-1]).to(result_dtype) for out in outs]

    def _plan(self, members: tuple[int, ...], name: str, x: torch.Tensor) -> _Plan:
        layers = [self.layers[i] for i in members]
        base_layers = [layer.base_layer for layer in layers]
        plain = all(type(base) is torch.nn.Linear for base in base_layers)
        dtype = matmul_dtype(x.device.type, base_layers[0].weight.dtype if plain else x.dtype)
        bases = [_Base.of(base, dtype) for base in base_layers]
        return _Plan(a_weights=[layer.lora_A[name].weight for layer in layers],
                     b_weights=[layer.lora_B[name].weight for layer in layers],
                     scalings=[float(layer.scaling[name]) for layer in layers],
                     bases=bases if None not in bases else None, dtype=dtype,
                     stackable=plain and None not in bases and sum(
                         layer.out_features for layer in layers
                     ) >= STACK_MIN_WIDTH_RATIO * layers[0].in_features)


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
        return self.group.output(self.index, x, *args, **kwargs)


def lora_layers(model: torch.nn.Module) -> list[torch.nn.Module]:
    """The peft LoRA linear layers of ``model``: over a plain or a 4-bit (QLoRA) base layer.

    peft's 4-bit layer also clones the base output before adding to it ("defensively", against
    an in-place add on a view); the group's call adds nothing in place, so that full-width copy
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
    parent, same input width and ranks), or alone (all alone with ``group=False``)."""
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
                shapes = {(m.in_features, tuple(sorted(m.r.items()))) for m in members}
                if len(members) > 1 and len(shapes) == 1:  # one input width, one rank
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
            g.clear()

    hook = register_optimizer_step_post_hook(stepped)
    try:
        yield sum(len(g.layers) for g in installed)
    finally:
        hook.remove()
        for g in installed:
            for layer in g.layers:
                del layer.forward

"""Every log-line format draslice prints, in one place.

The seed's e2e script and users' log alerts grep these lines (``DRA LoRA SFT on GPU slice: OK``
above all), so they are defined once here and nowhere else.
"""

from __future__ import annotations

GIB = 1024**3

SFT_OK_GPU = "DRA LoRA SFT on GPU slice: OK"
SFT_OK_CPU = "LoRA SFT on CPU: OK"
MATMUL_OK = "matmul_on_slice: OK"
MATMUL_FAIL = "matmul_on_slice: FAIL"


def gib(nbytes: float) -> float:
    """Bytes to GiB, rounded as the seed prints them."""
    return round(nbytes / GIB, 2)


def smoke_lines(cuda_available: bool, device_name: str, total_mem_gib: float) -> list[str]:
    """The seed smoke pod's lines, in its order."""
    return [
        f"cuda_available: {cuda_available}",
        f"device: {device_name}",
        f"slice_total_mem_GiB: {total_mem_gib:.2f}",
    ]


def matmul_line(ok: bool) -> str:
    return MATMUL_OK if ok else MATMUL_FAIL


def slice_device(device_name: str, total_mem_gib: float) -> str:
    return f"[slice] device={device_name} total_mem={total_mem_gib:.2f} GiB"


def fsdp_sharded(blocks: int, world: int) -> str:
    return f"[fsdp] {blocks} blocks and the rest of the model sharded over {world} processes"


def offloaded(layers: int, device_type: str = "cuda") -> str:
    if device_type != "cuda":
        return f"[slice] offload_activations: no effect on {device_type} (already in host memory)"
    return f"[slice] activations offloaded to host memory: {layers} checkpointed layers"


def checkpointed(reentrant: bool) -> str:
    kind = ("reentrant (a small model's step is bound by launching kernels)" if reentrant
            else "non-reentrant")
    return f"[slice] gradient checkpointing: {kind}"


def tiled(mlps: int) -> str:
    return f"[slice] MLP run in tiles of tokens: {mlps} layers"


def slice_peak(peak_mem_gib: float) -> str:
    return f"[slice] peak_mem={peak_mem_gib:.2f} GiB"


def effective_config(origin: str, knobs: dict) -> str:
    """The configuration a run starts with, once, before any work: where its values come
    from, then every knob it uses as ``name=value``."""
    return f"[config] {origin}: " + " ".join(f"{k}={v!r}" if isinstance(v, str) else f"{k}={v}"
                                            for k, v in knobs.items())


def trainable_params(trainable: int, total: int) -> str:
    """The line peft's ``print_trainable_parameters`` prints, formatted by us."""
    pct = 100.0 * trainable / total if total else 0.0
    return (
        f"trainable params: {trainable:,} || all params: {total:,} || trainable%: {pct:.4f}"
    )


def step_loss(step: int, loss: float, tokens_per_s: float) -> str:
    return f"{{'loss': {loss:.4f}, 'step': {step}, 'tokens_per_s': {tokens_per_s:.0f}}}"


def speed(tokens_per_s: float, steady_from: int | None, first: int, last: int,
          warmup_seconds: float, wall_seconds: float) -> str:
    """The run's speed as separate figures: the steady rate, the warm-up, the whole wall time."""
    if steady_from is None:
        rate = f"{tokens_per_s:,.0f} tokens/s over every step (no step after the warm-up)"
    else:
        rate = f"{tokens_per_s:,.0f} tokens/s steady (steps {steady_from}-{last})"
    warm_until = (steady_from or last + 1) - 1
    span = f"step {first}" if warm_until == first else f"steps {first}-{warm_until}"
    return (f"[speed] {rate}; warm-up {warmup_seconds:.1f} s ({span}); "
            f"wall {wall_seconds:.1f} s (load, warm-up, steps, evaluation and checkpoints)")


def eval_loss(step: int, loss: float) -> str:
    return f"{{'eval_loss': {loss:.4f}, 'step': {step}}}"


def resumed(step: int, path: object) -> str:
    return f"[checkpoint] resumed at step {step} from {path}"


def merged(path: object) -> str:
    return f"[export] merged model saved to {path}"


def lock_taken_over(folder: object, holder: str) -> str:
    return f"[lock] {folder}: took over the lock of a run that is gone ({holder})"


def lock_unsupported(folder: object, reason: str) -> str:
    return (f"[lock] {folder}: this filesystem cannot lock files ({reason}); nothing stops "
            "a second run from writing here at the same time")


def sft_ok(on_cuda: bool) -> str:
    """The final line: the GPU form only when it truly ran on a CUDA device."""
    return SFT_OK_GPU if on_cuda else SFT_OK_CPU


def task_started(name: str) -> str:
    """``draslice run``: a pipeline task starts."""
    return f"[task] {name}: started"


def task_finished(name: str, status: str, seconds: float) -> str:
    """``draslice run``: a pipeline task ends; ``status`` as kfp names it (SUCCESS, FAILURE)."""
    return f"[task] {name}: {status} in {seconds:.1f} s"


def task_skipped(name: str, why: str) -> str:
    return f"[task] {name}: skipped ({why})"


# The lines a task prints that ``draslice run`` shows (all of them go to its log file): the
# seed's lines users grep, the fine-tune's progress and its outcome.
GREPPABLE_PREFIXES = ("cuda_available:", "device:", "slice_total_mem_GiB:", "matmul ",
                      MATMUL_OK, MATMUL_FAIL, "[slice] ", "trainable params:", "[checkpoint] ",
                      "[config] ", "[lock] ", "[speed] ", "[export] ", SFT_OK_GPU, SFT_OK_CPU)
PROGRESS_PREFIXES = ("{'loss': ", "{'eval_loss': ")


def is_progress(line: str) -> bool:
    """A step line (:func:`step_loss`, :func:`eval_loss`)."""
    return line.startswith(PROGRESS_PREFIXES)


def is_greppable(line: str) -> bool:
    return line.startswith(GREPPABLE_PREFIXES) or is_progress(line)


def verdict(passed: bool, reasons: list[str]) -> str:
    head = "verdict: PASS" if passed else "verdict: FAIL"
    return "\n".join([head, *(f"  - {r}" for r in reasons)])

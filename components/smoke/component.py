"""Smoke: prove the claimed slice computes (checked matmul) and measure it."""

from typing import NamedTuple

from kfp import dsl
from kfp.dsl import Metrics, Output

from draslice.components.image import TRAINER_IMAGE


@dsl.component(base_image=TRAINER_IMAGE, install_kfp_package=False)
def smoke(
    metrics: Output[Metrics],
    device: str = "auto",
    matmul_size: int = 0,
    slice_memory_gib: float = 0.0,
) -> NamedTuple(
    "SmokeOutputs",
    cuda_available=bool,
    device_name=str,
    slice_total_mem_gib=float,
    tflops=float,
):
    """Prints the GPU-slicing guide's smoke lines and fails the step when the matmul is wrong.

    Args:
        metrics: Scalars for the KFP UI: slice memory, achieved TFLOP/s, matmul error.
        device: ``auto``, ``cpu``, ``cuda`` or ``cuda:N``.
        matmul_size: Square matmul size; 0 picks 8192 on a GPU and 1024 on the CPU.
        slice_memory_gib: Emulate a slice of this many GiB on a bigger GPU (0: no cap).

    Returns:
        cuda_available: Whether the task saw a CUDA device.
        device_name: The device's name as CUDA reports it (a MIG slice names its profile).
        slice_total_mem_gib: Memory the task may use (the slice's, or the emulated cap).
        tflops: Achieved TFLOP/s of the matmul (bf16 on GPU, fp32 on CPU).
    """
    from collections import namedtuple

    from draslice.errors import DrasliceError
    from draslice.trainer.tasks.smoke import run_smoke

    result = run_smoke(device=device, matmul_size=matmul_size, slice_memory_gib=slice_memory_gib)
    print("\n".join(result.lines()))
    metrics.log_metric("slice_total_mem_gib", result.device.total_mem_gib)
    metrics.log_metric("matmul_tflops", round(result.tflops, 3))
    metrics.log_metric("matmul_rel_error", result.rel_error)
    if not result.ok:
        raise DrasliceError(
            f"matmul on {result.device.name} is wrong: relative error {result.rel_error:.2e} "
            f"exceeds {result.tolerance:.0e}"
        )
    outputs = namedtuple(
        "SmokeOutputs", ["cuda_available", "device_name", "slice_total_mem_gib", "tflops"]
    )
    return outputs(
        result.device.device != "cpu",
        result.device.name,
        result.device.total_mem_gib,
        result.tflops,
    )

"""The smoke test: prove the slice computes before spending it on training.

A matmul on the device is checked against a float64 reference on a random block of its
entries (a full reference of an 8192^3 product would take longer than the product itself),
then timed to give achieved TFLOP/s — bf16 on a GPU, fp32 on the CPU.
"""

from __future__ import annotations

import math
import time
from dataclasses import asdict, dataclass

import torch

from draslice.errors import InvalidParameter, SliceOutOfMemory
from draslice.trainer import budget, loglines
from draslice.trainer import device as dev

# Relative Frobenius error allowed between the device product and the float64 reference.
# bf16 keeps 8 significant bits (2^-8 ~ 0.4% per rounding); fp32 is ~1e-7 per rounding.
TOLERANCE = {torch.bfloat16: 2e-2, torch.float32: 1e-4}
CHECK_BLOCK = 64


@dataclass
class SmokeResult:
    device: dev.DeviceInfo
    matmul_size: int
    dtype: str
    rel_error: float
    tolerance: float
    ok: bool
    tflops: float
    seconds: float

    def lines(self) -> list[str]:
        out = []
        if self.device.nvidia_smi is not None:
            out += ["===== nvidia-smi -L =====", self.device.nvidia_smi]
        out += loglines.smoke_lines(
            self.device.cuda_available and self.device.device != "cpu",
            self.device.name,
            self.device.total_mem_gib,
        )
        out.append(
            f"matmul {self.matmul_size}^3 {self.dtype}: rel_error={self.rel_error:.2e} "
            f"(tolerance {self.tolerance:.0e}) achieved={self.tflops:.2f} TFLOP/s"
        )
        out.append(loglines.matmul_line(self.ok))
        return out

    def to_dict(self) -> dict:
        out = asdict(self)
        out["device"] = self.device.to_dict()
        return out


def _product(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """The product under test, on the device (one function, so a test can corrupt it)."""
    return a @ b


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _checked_and_timed(
    torch_device: torch.device, n: int, dtype: torch.dtype, iterations: int, seed: int
) -> tuple[float, float, bool]:
    """(relative error on a random block, seconds for ``iterations`` products, all finite)."""
    gen = torch.Generator().manual_seed(seed)
    a = torch.randn(n, n, generator=gen).to(torch_device, dtype)
    b = torch.randn(n, n, generator=gen).to(torch_device, dtype)

    c = _product(a, b)  # also the warm-up
    rows = torch.randperm(n, generator=gen)[:CHECK_BLOCK]
    cols = torch.randperm(n, generator=gen)[:CHECK_BLOCK]
    rows, cols = rows.to(torch_device), cols.to(torch_device)
    got = c[rows][:, cols].double().cpu()
    ref = torch.mm(a[rows].double().cpu(), b[:, cols].double().cpu())
    rel_error = float((got - ref).norm() / ref.norm())
    _sync(torch_device)
    start = time.perf_counter()
    for _ in range(iterations):
        c = _product(a, b)
    _sync(torch_device)
    seconds = time.perf_counter() - start
    return rel_error, seconds, bool(torch.isfinite(c).all().item())


def check_fits(n: int, dtype: torch.dtype, info: dev.DeviceInfo) -> None:
    """Refuse a matmul whose matrices cannot fit, naming the largest size that can. The
    operands are drawn in fp32 on the host, then placed on the device in ``dtype``; the device
    holds them, the product, and the next product while the last is still referenced (four
    n x n matrices; on the CPU the two fp32 operands are those matrices)."""
    elem = torch.empty((), dtype=dtype).element_size()
    host_gib = loglines.gib(dev.host_memory_bytes())
    limits = [(4 * 4 if info.device == "cpu" else 2 * 4, host_gib, "host memory")]
    if info.device != "cpu":
        limits.append((4 * elem, info.total_mem_gib, info.name))
    for per_entry, gib, where in limits:
        if per_entry * n * n > gib * loglines.GIB:
            largest = int(math.sqrt(gib * loglines.GIB / per_entry))
            raise InvalidParameter(
                "matmul_size", n,
                f"must be at most {largest:,} here: a {n} x {n} check needs "
                f"{per_entry * n * n / loglines.GIB:.1f} GiB of {where} and it has {gib:.2f} GiB")


def run_smoke(
    device: str = "auto",
    matmul_size: int = 0,
    iterations: int = 10,
    slice_memory_gib: float = 0.0,
    seed: int = 0,
) -> SmokeResult:
    """Run the checked, timed matmul. ``matmul_size`` 0 picks 8192 on a GPU and 1024 on CPU."""
    torch_device = dev.resolve_device(device)
    if matmul_size < 0 or (0 < matmul_size < CHECK_BLOCK):
        raise InvalidParameter("matmul_size", matmul_size, f"must be 0 (auto) or >= {CHECK_BLOCK}")
    if iterations <= 0:
        raise InvalidParameter("iterations", iterations, "must be >= 1")
    cap = dev.apply_slice_cap(torch_device, slice_memory_gib)
    info = dev.describe(torch_device, cap)
    on_gpu = torch_device.type == "cuda"
    n = matmul_size or (8192 if on_gpu else 1024)
    dtype = torch.bfloat16 if on_gpu and torch.cuda.is_bf16_supported() else torch.float32
    check_fits(n, dtype, info)

    try:
        rel_error, seconds, finite = _checked_and_timed(torch_device, n, dtype, iterations, seed)
    except torch.OutOfMemoryError as err:
        reached = loglines.gib(dev.peak_memory_bytes(torch_device))
        raise SliceOutOfMemory(budget.oom_advice(info.total_mem_gib, reached)) from err
    tflops = 2 * n**3 * iterations / seconds / 1e12
    return SmokeResult(
        device=info,
        matmul_size=n,
        dtype=str(dtype).removeprefix("torch."),
        rel_error=rel_error,
        tolerance=TOLERANCE[dtype],
        ok=bool(rel_error <= TOLERANCE[dtype] and finite),
        tflops=tflops,
        seconds=seconds,
    )

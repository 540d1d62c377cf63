"""Device introspection, the slice cap and the smoke matmul, on the CPU."""

from __future__ import annotations

import pytest
import torch

from draslice.errors import InvalidParameter
from draslice.tests.conftest import requires_cuda
from draslice.trainer import device as dev
from draslice.trainer.tasks import smoke


def test_cpu_is_described_truthfully():
    info = dev.describe(torch.device("cpu"))
    assert info.device == "cpu"
    assert info.is_mig is False
    assert info.slice_cap_gib is None
    if not torch.cuda.is_available():
        assert info.name == "cpu (no CUDA device)"
        assert info.cuda_available is False


@pytest.mark.parametrize("spec", ["tpu", "gpu0", "mps", "cuda0"])
def test_unknown_device_names_the_valid_choices(spec):
    with pytest.raises(InvalidParameter, match="'auto', 'cpu', 'cuda' or 'cuda:N'"):
        dev.resolve_device(spec)


def test_precision_auto_is_fp32_on_cpu_and_unknown_is_refused():
    assert dev.resolve_precision("auto", torch.device("cpu")) == "fp32"
    with pytest.raises(InvalidParameter, match="auto, bf16, fp32"):
        dev.resolve_precision("fp16", torch.device("cpu"))


def test_slice_cap_needs_cuda_and_a_positive_size():
    assert dev.apply_slice_cap(torch.device("cpu"), 0) is None
    with pytest.raises(InvalidParameter, match="needs a CUDA device"):
        dev.apply_slice_cap(torch.device("cpu"), 6)
    with pytest.raises(InvalidParameter, match="must be > 0"):
        dev.apply_slice_cap(torch.device("cpu"), -1)


def test_the_cap_is_reset_for_an_uncapped_run_and_the_cache_emptied_first(monkeypatch):
    """The per-process fraction outlives a run: the CUDA calls are recorded (no GPU here) to
    show a capped run sets it after emptying the cache and an uncapped one sets it back to 1."""
    calls: list[tuple] = []
    total = 100 * 1024**3

    class Props:
        total_memory = total

    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda _d: Props())
    monkeypatch.setattr(torch.cuda, "empty_cache", lambda: calls.append(("empty_cache",)))
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 1)
    monkeypatch.setattr(torch.cuda, "set_per_process_memory_fraction",
                        lambda f, d: calls.append(("fraction", f, str(d))))
    assert dev.apply_slice_cap(torch.device("cuda:0"), 25) == 25
    assert dev.apply_slice_cap(torch.device("cuda"), 0) is None  # no index: the current one
    assert calls == [("empty_cache",), ("fraction", 0.25, "cuda:0"),
                     ("empty_cache",), ("fraction", 1.0, "cuda:1")]


def test_smoke_on_cpu_checks_the_product_and_prints_the_seed_lines():
    result = smoke.run_smoke(device="cpu", matmul_size=256, iterations=2)
    assert result.ok
    assert result.dtype == "float32"
    assert result.rel_error < smoke.TOLERANCE[torch.float32]
    assert result.tflops > 0
    lines = result.lines()
    assert "cuda_available: False" in lines
    assert lines[-1] == "matmul_on_slice: OK"
    assert any(line.startswith("slice_total_mem_GiB: ") for line in lines)


def test_smoke_catches_a_wrong_product(monkeypatch):
    """A device that computes wrong numbers fails the check, not only one that crashes."""
    real = smoke._product
    monkeypatch.setattr(smoke, "_product", lambda a, b: real(a, b) * 1.01)
    result = smoke.run_smoke(device="cpu", matmul_size=128, iterations=1)
    assert not result.ok
    assert result.lines()[-1] == "matmul_on_slice: FAIL"


@pytest.mark.parametrize(("kw", "name"), [({"matmul_size": 10}, "matmul_size"),
                                          ({"iterations": 0}, "iterations")])
def test_smoke_bad_input(kw, name):
    with pytest.raises(InvalidParameter) as err:
        smoke.run_smoke(device="cpu", **kw)
    assert err.value.name == name


@pytest.mark.gpu
@requires_cuda
def test_slice_cap_on_gpu_reports_the_cap_and_refuses_more_than_the_device():
    d = torch.device("cuda:0")
    total = torch.cuda.get_device_properties(d).total_memory / 1024**3
    with pytest.raises(InvalidParameter, match="at most the device's memory"):
        dev.check_slice_cap(d, total + 1)
    result = smoke.run_smoke(device="cuda", matmul_size=1024, slice_memory_gib=4)
    assert result.device.total_mem_gib == 4
    assert result.ok and result.dtype == "bfloat16"

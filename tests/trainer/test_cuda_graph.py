"""The body replayed as a CUDA graph (trainer/speed/cuda_graph.py): its capture's order and
fall-backs, on a CPU with torch.cuda's capture entry points stood in for; tests/trainer/
test_gpu.py captures for real."""

from __future__ import annotations

import pytest


class _Capture:
    """``torch.cuda``'s capture entry points on a CPU: records each call, fails the first
    ``fail`` of them (with a warning first, as torch's autograd engine gives one)."""

    def __init__(self, fail: int) -> None:
        self.fail = fail
        self.calls: list[dict] = []
        self.redirected: list[bool] = []  # torch's stale-stream override, at each capture

    @staticmethod
    def graph_tensors() -> int:
        """Tensors alive in this process that belong to an autograd graph."""
        import gc

        import torch

        gc.collect()
        return sum(1 for o in gc.get_objects()
                   if isinstance(o, torch.Tensor) and o.grad_fn is not None)

    def __call__(self, module, args, **kwargs):
        import warnings

        import torch

        self.calls.append({"kwargs": kwargs, "live_graph_tensors": self.graph_tensors(),
                           "cache_emptied": len(torch.cuda.empty_cache.calls)})
        if hasattr(torch._C, "_override_stale_capture_stream"):  # torch 2.13 has it
            self.redirected.append(torch._C._override_stale_capture_stream())
        if len(self.calls) <= self.fail:
            warnings.warn("The AccumulateGrad node's stream does not match", UserWarning,
                          stacklevel=1)
            raise RuntimeError("CUDA error: operation failed due to a previous error during "
                               "capture")
        module.forward = module.forward  # an instance forward, as the real one sets
        return module


@pytest.fixture
def body(monkeypatch):
    """A one-layer GPT-2 body with one trainable weight, behind speed's graph dispatcher, and
    torch.cuda's stream calls made harmless on a CPU."""
    import contextlib

    import torch
    from transformers import GPT2Config, GPT2Model

    from draslice.trainer.speed import cuda_graph

    monkeypatch.setattr(torch.cuda, "synchronize", lambda: None)
    monkeypatch.setattr(torch.cuda, "Stream", lambda: None)
    monkeypatch.setattr(torch.cuda, "stream", lambda _s: contextlib.nullcontext())
    emptied: list[int] = []

    def empty_cache() -> None:
        emptied.append(1)

    empty_cache.calls = emptied
    monkeypatch.setattr(torch.cuda, "empty_cache", empty_cache)
    model = GPT2Model(GPT2Config(n_layer=1, n_embd=32, n_head=2, vocab_size=64, n_positions=16,
                                 bos_token_id=0, eos_token_id=0))
    for name, param in model.named_parameters():
        param.requires_grad_(name == "h.0.attn.c_attn.weight")
    model.train()
    lines: list[str] = []
    cuda_graph.GraphedBody.install(model, lines.append)
    # A pass's time: the real one runs the pass; its seconds come from ``pass_seconds`` (eager
    # first, then replayed), so whether the graph is kept does not depend on this CPU's clock.
    timed = cuda_graph.GraphedBody._timed_pass
    pass_seconds = {"eager": 2.0, "graphed": 1.0}

    def seconds(self, sample):
        timed(self, sample)
        return pass_seconds["graphed" if "forward" in vars(self.hidden) else "eager"]

    monkeypatch.setattr(cuda_graph.GraphedBody, "_timed_pass", seconds)
    model.pass_seconds = pass_seconds
    forwards: list[int] = []
    model.h[0].register_forward_hook(lambda *_: forwards.append(1))
    return model, lines, forwards


@pytest.mark.parametrize("fail", [0, 1, 2])
def test_graph_capture_is_warmed_up_apart_and_falls_back_twice(body, monkeypatch, fail):
    """The body is warmed up (forward and backward, 3 times) with nothing of it left alive
    when the capture starts (``num_warmup_iters=0``); a failed capture is tried once more with
    make_graphed_callables' own warm-up, and after that the run goes on eagerly, saying why
    with the warnings each capture raised. The device's cache is emptied after the warm-up and
    after each failure (blocks cached for the warm-up's stream or a failed capture's pool would
    serve neither the capture nor the eager steps)."""
    import torch

    model, lines, forwards = body
    capture = _Capture(fail)
    monkeypatch.setattr(torch.cuda, "make_graphed_callables", capture)
    ids = torch.randint(0, 64, (2, 8))
    before = capture.graph_tensors()  # what earlier tests left alive in this process
    out = model(input_ids=ids)
    assert out.last_hidden_state.shape == (2, 8, 32)
    first = capture.calls[0]
    assert first == {"kwargs": {"num_warmup_iters": 0}, "live_graph_tensors": before,
                     "cache_emptied": 1}
    assert len(forwards) >= 3 + 1  # the warm-up ran through the body, then the call itself
    graphed = model.forward
    replays: list[int] = []
    graphed.hidden.register_forward_hook(lambda *_: replays.append(1))
    model(input_ids=ids, use_cache=False)  # the loss's call: the graph's, when there is one
    assert len(replays) == (0 if fail == 2 else 1)
    model(input_ids=ids, use_cache=True)  # a cache was asked for: eager
    assert len(replays) == (0 if fail == 2 else 1)
    if hasattr(torch._C, "_override_stale_capture_stream"):  # torch 2.13 has it
        # every capture ran with torch's stale-stream override on, and it is off again after
        assert capture.redirected == [True] * len(capture.calls)
        assert not torch._C._override_stale_capture_stream()
    if fail == 0:
        assert len(capture.calls) == 1 and graphed.shape == ids.shape and not lines
    elif fail == 1:
        assert capture.calls[1]["kwargs"] == {} and graphed.shape == ids.shape
        assert capture.calls[1]["cache_emptied"] == 2
        assert len(lines) == 1 and "captured on a second try" in lines[0]
        assert "AccumulateGrad" in lines[0]
    else:
        assert len(capture.calls) == 2 and graphed.failed and graphed.shape is None
        assert lines[-1].startswith("speed: CUDA graph capture failed (RuntimeError: CUDA error")
        assert "; warning: The AccumulateGrad node's stream" in lines[-1]
        assert "on a second try, warmed up by make_graphed_callables itself: Runtime" in lines[-1]
        assert len(torch.cuda.empty_cache.calls) == 3
        assert lines[-1].endswith("running eager")
        model(input_ids=ids)  # eager from here on, no capture tried again
        assert len(capture.calls) == 2


def test_a_graph_slower_than_eager_is_dropped(body, monkeypatch):
    """The graph is kept only if its replays beat the eager warm-up's fastest pass: on
    Qwen2.5-1.5B at 8 x 2048 on an H200 the replayed body was slower than eager; then the run
    goes on eagerly, saying both times, and the graphed forward (and with it the graph) is
    gone."""
    import torch

    model, lines, _forwards = body
    model.pass_seconds.update(eager=0.040, graphed=0.046)
    capture = _Capture(0)
    monkeypatch.setattr(torch.cuda, "make_graphed_callables", capture)
    ids = torch.randint(0, 64, (2, 8))
    out = model(input_ids=ids)
    graphed = model.forward
    assert len(capture.calls) == 1 and graphed.failed and graphed.shape is None
    assert "forward" not in vars(graphed.hidden)
    assert lines == ["speed: CUDA graph not faster here (46.0 ms a forward and backward "
                     "replayed, 40.0 ms eager); running eager"]
    assert out.last_hidden_state.shape == (2, 8, 32)
    replays: list[int] = []
    graphed.hidden.register_forward_hook(lambda *_: replays.append(1))
    model(input_ids=ids, use_cache=False)  # the loss's call: eager, no second capture
    assert not replays and len(capture.calls) == 1


def test_keep_slower_keeps_a_slower_graph_for_a_benchmark_that_checks_what_it_learns(
        body, monkeypatch):
    """``KEEP_SLOWER`` (loss_match.py's runs share a GPU): the same slower graph is kept."""
    import torch

    from draslice.trainer.speed import cuda_graph

    model, lines, _forwards = body
    model.pass_seconds.update(eager=0.040, graphed=0.046)
    monkeypatch.setattr(cuda_graph, "KEEP_SLOWER", True)
    monkeypatch.setattr(torch.cuda, "make_graphed_callables", _Capture(0))
    ids = torch.randint(0, 64, (2, 8))
    model(input_ids=ids)
    graphed = model.forward
    assert not graphed.failed and graphed.shape is not None
    assert not any("not faster" in line for line in lines)


def test_a_graph_whose_replay_fails_is_dropped(body, monkeypatch):
    """A replay that raises while it is timed leaves the run eager with one line, not a
    crashed run."""
    import torch

    from draslice.trainer.speed import cuda_graph

    model, lines, _forwards = body
    capture = _Capture(0)
    monkeypatch.setattr(torch.cuda, "make_graphed_callables", capture)
    timed = cuda_graph.GraphedBody._timed_pass

    def replay_fails(self, sample):
        if "forward" in vars(self.hidden):
            raise RuntimeError("CUDA error: an illegal memory access was encountered")
        return timed(self, sample)

    monkeypatch.setattr(cuda_graph.GraphedBody, "_timed_pass", replay_fails)
    out = model(input_ids=torch.randint(0, 64, (2, 8)))
    assert out.last_hidden_state.shape == (2, 8, 32) and model.forward.failed
    assert lines == ["speed: CUDA graph captured but its replay failed (RuntimeError: CUDA "
                     "error: an illegal memory access was encountered); running eager"]

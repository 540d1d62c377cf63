"""The cross-entropy through the head a chunk at a time (trainer/speed/loss.py): the loss and the
gradient of ``F.cross_entropy`` on the whole logits, eager and compiled."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from draslice.trainer.speed import loss

VOCAB = 50  # not a multiple of loss.VOCAB_ALIGN: the head is padded to 64 rows


def _case():
    gen = torch.Generator().manual_seed(0)
    head = torch.nn.Linear(32, VOCAB, bias=False).requires_grad_(False)
    torch.nn.init.normal_(head.weight, generator=gen)
    hidden = torch.randn(37, 32, generator=gen)
    targets = torch.randint(0, VOCAB, (37,), generator=gen)
    return head, hidden, targets


def test_chunks_give_the_whole_batch_loss_and_gradient():
    head, hidden, targets = _case()
    whole = hidden.clone().requires_grad_()
    expected = F.cross_entropy(head(whole), targets, reduction="sum")
    expected.backward()
    chunked = hidden.clone().requires_grad_()
    total = loss.chunked_cross_entropy(chunked, head, targets, chunk=12)  # 12, 12, 12, 1
    total.backward()
    torch.testing.assert_close(total, expected.detach())
    torch.testing.assert_close(chunked.grad, whole.grad)


@pytest.mark.slow
def test_the_compiled_chunk_matches_the_eager_one_at_every_chunk_size():
    """What CUDA runs: inductor's form of the chunk, with dynamic sizes (the last chunk's
    length changes from batch to batch); here compiled for the CPU."""
    head, hidden, targets = _case()
    weight, _ = loss._aligned_head(head.weight, None, torch.bfloat16)
    compiled = torch.compile(loss._loss_and_grad, dynamic=True)
    for n in (12, 7, 1, 12):
        logits = F.linear(hidden[:n].bfloat16(), weight)
        want_loss, want_grad = loss._loss_and_grad(logits.clone(), targets[:n], VOCAB)
        got_loss, got_grad = compiled(logits.clone(), targets[:n], VOCAB)
        torch.testing.assert_close(got_loss, want_loss, rtol=1e-5, atol=1e-4)
        torch.testing.assert_close(got_grad, want_grad)
        assert got_grad.dtype == torch.bfloat16
        assert not got_grad[:, VOCAB:].any()  # the padding rows get no probability


def test_a_compiler_that_fails_leaves_one_line_and_the_eager_chunk(monkeypatch, capsys):
    """A GPU image without a C compiler cannot build Triton's launcher: the first chunk says so
    in one line and it, and every chunk after, runs eager with the same result."""
    head, hidden, targets = _case()
    want = loss.chunked_cross_entropy(hidden.clone().requires_grad_(), head, targets, chunk=12)

    def broken(*_args):
        raise RuntimeError("Failed to find C compiler. Please specify via CC environment variable.")

    monkeypatch.setattr(loss, "FUSED_DEVICES", ("cpu",))
    monkeypatch.setattr(loss, "_fused", broken)
    got = loss.chunked_cross_entropy(hidden.clone().requires_grad_(), head, targets, chunk=12)
    torch.testing.assert_close(got, want)
    assert loss.FUSED_DEVICES == ()
    err = capsys.readouterr().err.strip().splitlines()
    assert err == ["draslice: cross-entropy runs eager (RuntimeError: Failed to find C compiler. "
                   "Please specify via CC environment variable.)"]


def test_liger_loss_is_given_the_chunk_memory_knob(monkeypatch):
    """Liger's fused linear cross-entropy gets the chunk_mem_const loss.liger_chunk_mem sizes
    for these rows, or loss.LIGER_CHUNK_MEM where a benchmark fixes it (the peer
    ``ours-offload-liger1``), with the head detached and the sum asked for. Liger itself needs
    CUDA: a stand-in module records the call."""
    import sys
    import types

    calls = []

    def fake(hidden, weight, targets, bias=None, **kwargs):
        calls.append({"weight_grad": weight.requires_grad, "bias": bias, **kwargs})
        return hidden.sum() * 0.0

    for name in ("liger_kernel", "liger_kernel.transformers"):
        monkeypatch.setitem(sys.modules, name, types.ModuleType(name))
    functional = types.ModuleType("liger_kernel.transformers.functional")
    functional.liger_fused_linear_cross_entropy = fake
    monkeypatch.setitem(sys.modules, functional.__name__, functional)
    head, hidden, targets = _case()
    rows, hidden_size = hidden.shape
    sized = loss.liger_chunk_mem(rows, hidden_size, head.weight.shape[0])
    loss._liger_sum(hidden, head.weight.requires_grad_(), None, targets)
    monkeypatch.setattr(loss, "LIGER_CHUNK_MEM", 1)
    loss._liger_sum(hidden, head.weight, None, targets)
    assert calls == [{"weight_grad": False, "bias": None, "reduction": "sum",
                      "chunk_mem_const": c} for c in (sized, 1)]


def _liger_chunk(rows: int, hidden_size: int, vocab: int, mem: int) -> int:
    """Tokens a chunk of Liger 0.8's fused linear cross-entropy (its documented sizing)."""
    per = -(-rows // -(-vocab // (mem * hidden_size)))
    return 1 << (per - 1).bit_length()


@pytest.mark.parametrize(("rows", "hidden_size", "vocab", "mem"), [
    (16384, 896, 151936, 4),   # Qwen2.5-0.5B: Liger's default would cut 128-token chunks
    (16384, 1536, 151936, 2),  # Qwen2.5-1.5B
    (8192, 1536, 151936, 5),
    (16384, 4096, 32000, 1),   # Llama-7B: its default chunks are already large
    (512, 896, 151936, 146),   # a short batch: one or two chunks
])
def test_liger_chunks_sized_to_the_loss_budget(rows, hidden_size, vocab, mem):
    """The chunk_mem_const the loop gives Liger keeps its chunks within twice chunk_tokens (bf16
    logits inside CHUNK_BYTES), yet never smaller than Liger's default would cut them."""
    got = loss.liger_chunk_mem(rows, hidden_size, vocab)
    assert got == mem
    chunk = _liger_chunk(rows, hidden_size, vocab, got)
    assert chunk >= _liger_chunk(rows, hidden_size, vocab, 1)
    assert chunk <= max(2 * loss.chunk_tokens(vocab), _liger_chunk(rows, hidden_size, vocab, 1))
    assert chunk * vocab * 2 <= loss.CHUNK_BYTES or got == 1

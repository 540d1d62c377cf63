"""GPU behaviour of the SFT; run on a CUDA host (`pytest -m gpu`), skipped elsewhere."""

from __future__ import annotations

import pytest
import torch

from draslice.errors import SliceOutOfMemory
from draslice.tests.conftest import requires_cuda
from draslice.tests.trainer.grads import largest_relative_distance
from draslice.trainer import device as dev
from draslice.trainer import loglines
from draslice.trainer.config import ModelShape, SFTConfig
from draslice.trainer.sft import train
from draslice.trainer.speed import offload

pytestmark = [pytest.mark.gpu, requires_cuda]


def test_sft_on_gpu_runs_bf16_and_prints_the_seed_line(tmp_path):
    lines: list[str] = []
    result = train(SFTConfig(slice_memory_gib=6), tmp_path / "a", tmp_path / "m.jsonl",
                   log=lines.append)
    assert result.precision == "bf16"
    assert result.slice_total_mem_gib == 6
    assert result.peak_mem_gib < 6
    assert result.loss_drop >= 0.3
    assert lines[-1] == loglines.SFT_OK_GPU


def test_out_of_memory_inside_the_slice_is_one_clear_message(tmp_path):
    with pytest.raises(SliceOutOfMemory, match=r"the slice has 0\.01 GiB .* bigger profile"):
        train(SFTConfig(slice_memory_gib=0.01), tmp_path / "a", tmp_path / "m.jsonl",
              log=lambda _line: None)


def test_a_run_without_a_cap_after_a_capped_one_gets_the_whole_device_back(tmp_path):
    """The cap is a process-wide setting: the uncapped run must not inherit the 0.01 GiB."""
    with pytest.raises(SliceOutOfMemory):
        train(SFTConfig(slice_memory_gib=0.01), tmp_path / "a", tmp_path / "a.jsonl",
              log=lambda _line: None)
    result = train(SFTConfig(steps=5), tmp_path / "b", tmp_path / "b.jsonl",
                   log=lambda _line: None)
    assert result.slice_total_mem_gib > 1
    block = torch.empty(256 * 1024**2, dtype=torch.uint8, device="cuda")  # 0.25 GiB
    del block
    assert dev.apply_slice_cap(torch.device("cuda"), 0) is None


def test_cuda_graph_compile_trains_like_eager_on_the_gpu(tmp_path):
    """reduce-overhead: the body replayed as CUDA graphs; same losses as eager within bf16
    noise, and the step-begin marks keep graph buffers from being overwritten while in use."""
    eager = train(SFTConfig(steps=20, compile="off"), tmp_path / "e", tmp_path / "e.jsonl",
                  log=lambda _line: None)
    graphs = train(SFTConfig(steps=20, compile="reduce-overhead"), tmp_path / "g",
                   tmp_path / "g.jsonl", log=lambda _line: None)
    assert graphs.initial_loss == pytest.approx(eager.initial_loss, rel=1e-2)
    assert graphs.final_loss == pytest.approx(eager.final_loss, rel=5e-2)
    assert graphs.loss_drop >= 0.3


@pytest.fixture
def replays(monkeypatch) -> dict[str, int]:
    """Training calls of the body that replayed the captured graph (``replayed``, counted at its
    graphed module) and those the graph takes (``graphable``: no padding mask, no cache).

    The counting hook goes on after the capture: ``make_graphed_callables`` refuses a module
    that already has hooks (the capture would fail and the run go eager)."""
    from draslice.trainer.speed import cuda_graph

    count = {"replayed": 0, "graphable": 0}
    capture, call = cuda_graph.GraphedBody._capture, cuda_graph.GraphedBody.__call__

    def counted_capture(self, input_ids):
        capture(self, input_ids)
        if not self.failed:
            self.hidden.register_forward_hook(
                lambda *_: count.__setitem__("replayed", count["replayed"] + 1))

    def counted_call(self, input_ids=None, attention_mask=None, use_cache=None, **kwargs):
        if attention_mask is None and not use_cache and torch.is_grad_enabled():
            count["graphable"] += 1
        return call(self, input_ids, attention_mask, use_cache, **kwargs)

    monkeypatch.setattr(cuda_graph.GraphedBody, "_capture", counted_capture)
    monkeypatch.setattr(cuda_graph.GraphedBody, "__call__", counted_call)
    return count


def test_the_default_replays_the_body_as_a_cuda_graph_and_trains_like_eager(tmp_path, replays):
    """compile="auto" on a GPU with fixed-width batches: the body captured once
    (make_graphed_callables) and replayed every step; same losses as eager within bf16 noise."""
    eager = train(SFTConfig(steps=20, compile="off"), tmp_path / "e", tmp_path / "e.jsonl",
                  log=lambda _line: None)
    lines: list[str] = []
    graphs = train(SFTConfig(steps=20), tmp_path / "g", tmp_path / "g.jsonl", log=lines.append)
    assert "speed: cudagraphs" in lines and not any("capture failed" in x for x in lines)
    assert replays["replayed"] == replays["graphable"] >= 20  # every step replayed the graph
    assert graphs.initial_loss == pytest.approx(eager.initial_loss, rel=1e-2)
    assert graphs.final_loss == pytest.approx(eager.final_loss, rel=5e-2)


def test_the_default_captures_a_packed_qwen2_body_with_liger_kernels(tmp_path, replays):
    """compile="auto" on a packed Qwen2 run (tied embeddings, grouped KV heads, Liger's kernels
    when installed): the body is captured as a CUDA graph. Qwen2.5-1.5B's capture failed with
    make_graphed_callables' own warm-up on an H200; cuda_graph.GraphedBody now warms up
    itself, and says so when it had to fall back."""
    from draslice.tests import scratch

    model = scratch.save_scratch_model(
        tmp_path / "qwen2", "qwen2", hidden_size=256, num_layers=4, num_heads=4,
        num_kv_heads=2, intermediate_size=768, vocab_size=1024, max_positions=512,
        tie_word_embeddings=True, device="cuda")
    data = scratch.write_demo_data(tmp_path / "train.jsonl", n=512)
    lines: list[str] = []
    result = train(SFTConfig(
        model_dir=str(model), data=str(data), data_format="prompt-completion", max_length=256,
        pack=True, batch_size=8, steps=12, bf16_weights=True,
        lora_targets="q_proj,k_proj,v_proj,o_proj,gate_proj,up_proj,down_proj"),
        tmp_path / "o", tmp_path / "m.jsonl", log=lines.append)
    speed = [line for line in lines if line.startswith("speed:")]
    assert speed[0].startswith("speed: cudagraphs"), speed
    assert not any("capture failed" in line or "second try" in line for line in speed), speed
    # A packed row short of max_length is padded (the end of the data): that step runs eager.
    assert replays["replayed"] == replays["graphable"] >= 8
    assert result.final_loss < result.initial_loss
    # The replays read the LoRA weights each optimizer step wrote (lora_fused casts them inside
    # the graph, never from its cache of the eager warm-up's casts): the losses are eager's.
    eager = train(SFTConfig(
        model_dir=str(model), data=str(data), data_format="prompt-completion", max_length=256,
        pack=True, batch_size=8, steps=12, bf16_weights=True, compile="off",
        lora_targets="q_proj,k_proj,v_proj,o_proj,gate_proj,up_proj,down_proj"),
        tmp_path / "e", tmp_path / "e.jsonl", log=lambda _line: None)
    assert result.final_loss == pytest.approx(eager.final_loss, rel=5e-2)


@pytest.mark.parametrize("mode", ["off", "default"])
def test_offloaded_activations_train_the_same_in_less_device_memory(tmp_path, monkeypatch,
                                                                   mode):
    """offload_activations: the checkpointed layer inputs (32 x 512 x 256 values each, above
    offload.MIN_NUMEL) go to host memory and come back for backward: the same losses, and the
    peak lower by about those inputs; compiled, each layer inside its offloaded checkpoint
    (a compiled body would run the layers eager, speed.compile_layers says why). Every layer's
    input but the last layer's was already on its way back when backward asked for it."""
    base = {"steps": 6, "batch_size": 32, "gradient_checkpointing": True, "compile": mode,
            "shape": ModelShape(n_layer=8, n_embd=256, seq_len=512)}
    kept = train(SFTConfig(**base), tmp_path / "k", tmp_path / "k.jsonl", log=lambda _l: None)
    prefetched: list[bool] = []
    real_take = offload._Offloaded.take
    monkeypatch.setattr(offload._Offloaded, "take",
                        lambda self: prefetched.append(self.fetched is not None)
                        or real_take(self))
    lines: list[str] = []
    moved = train(SFTConfig(**base, offload_activations=True), tmp_path / "o",
                  tmp_path / "o.jsonl", log=lines.append)
    assert loglines.offloaded(8) in lines
    assert len(prefetched) >= 6 * 8 and prefetched.count(False) == len(prefetched) // 8
    if mode == "default":
        assert "speed: default, each layer compiled" in lines
    assert moved.initial_loss == pytest.approx(kept.initial_loss, rel=1e-3)
    assert moved.final_loss == pytest.approx(kept.final_loss, rel=1e-2)
    assert moved.peak_mem_gib < kept.peak_mem_gib


def test_a_tiled_mlp_trains_the_same_in_less_device_memory(tmp_path):
    """tile_mlp: each layer's MLP (4 x 256 wide in GPT-2) runs on tiles of the 32 x 512 tokens
    under checkpointing: the same losses, and a lower peak (the recomputed layer's backward no
    longer holds the whole batch's MLP activations)."""
    base = {"steps": 6, "batch_size": 32, "gradient_checkpointing": True, "compile": "off",
            "shape": ModelShape(n_layer=8, n_embd=256, seq_len=512)}
    whole = train(SFTConfig(**base), tmp_path / "w", tmp_path / "w.jsonl", log=lambda _l: None)
    lines: list[str] = []
    tiled = train(SFTConfig(**base, tile_mlp=True), tmp_path / "t", tmp_path / "t.jsonl",
                  log=lines.append)
    assert loglines.tiled(8) in lines
    assert tiled.initial_loss == pytest.approx(whole.initial_loss, rel=1e-3)
    assert tiled.final_loss == pytest.approx(whole.final_loss, rel=1e-2)
    assert tiled.peak_mem_gib < whole.peak_mem_gib


def test_the_fused_lora_sum_gives_peft_gradients_on_the_gpu():
    """lora_fused's addmm under bf16 autocast on the GPU: peft's gradients within bf16
    rounding, on a GPT-2 shape with every projection LoRA-wrapped."""
    from draslice.trainer import build

    cfg = SFTConfig(bf16_weights=True, compile="off",
                    shape=ModelShape(n_layer=4, n_embd=256, seq_len=256))
    run = build.assemble(cfg, torch.device("cuda"), "bf16", log=lambda _line: None)
    run.model.train()
    ids = torch.randint(0, cfg.shape.vocab_size, (8, 256), device="cuda",
                        generator=torch.Generator("cuda").manual_seed(0))
    peft_grads, fused_grads = _peft_and_fused_grads(run, ids, b_std=0.05)
    for name, grad in peft_grads.items():
        torch.testing.assert_close(fused_grads[name], grad, rtol=5e-2, atol=5e-3, msg=name)


@pytest.mark.parametrize("head_vocab", [1024, 1000, 151936])
def test_the_loss_through_the_head_is_the_same_fused_or_chunked(head_vocab):
    """On CUDA the loss through a frozen head runs fused: Liger's fused linear cross-entropy
    where ``speed.apply_liger`` marked the head, else loss.py's chunks compiled by inductor;
    both give the eager chunks' loss and gradient (bf16 head, several chunks, an odd last one).
    At Qwen's vocabulary ``loss.liger_chunk_mem`` cuts Liger's 1,000 rows in two chunks."""
    from draslice.trainer.speed import loss

    gen = torch.Generator(device="cuda").manual_seed(0)
    head = torch.nn.Linear(256, head_vocab, bias=False, device="cuda", dtype=torch.bfloat16)
    torch.nn.init.normal_(head.weight, std=0.02, generator=gen)
    head.requires_grad_(False)
    hidden = torch.randn(1000, 256, device="cuda", dtype=torch.bfloat16, generator=gen)
    targets = torch.randint(0, head_vocab, (1000,), device="cuda", generator=gen)

    def run(fuse: bool, liger: bool) -> tuple[torch.Tensor, torch.Tensor]:
        loss.FUSED_DEVICES = ("cuda",) if fuse else ()
        setattr(head, loss.LIGER_HEAD, liger)
        h = hidden.clone().requires_grad_()
        total = loss.chunked_cross_entropy(h, head, targets, chunk=300)
        total.backward()
        return total.detach(), h.grad

    try:
        want = run(fuse=False, liger=False)
        kinds = [(True, False)] + ([(False, True)] if _liger_installed() else [])
        for fuse, liger in kinds:
            got = run(fuse, liger)
            torch.testing.assert_close(got[0], want[0], rtol=1e-4, atol=1e-2)
            torch.testing.assert_close(got[1], want[1], rtol=2e-2, atol=1e-3)
    finally:
        loss.FUSED_DEVICES = ("cuda",)


def _liger_installed() -> bool:
    from draslice.trainer import speed

    return speed.liger_available()


@pytest.mark.parametrize("bf16_base", [True, False])
def test_grouped_lora_projections_give_peft_gradients_on_the_gpu(bf16_base):
    """lora_fused's groups (q/k/v, gate/up in one call, our backward) under bf16 autocast and
    gradient checkpointing: peft's gradients within bf16 rounding, with the base matmuls inside
    the group's call (bf16 base) or before it (fp32 base, cast by autocast)."""
    from draslice.tests.trainer.grads import checkpointed_qwen2
    from draslice.trainer.speed import lora_fused

    model = checkpointed_qwen2(layers=2)
    if bf16_base:
        model.to(torch.bfloat16)
        for p in model.parameters():
            if p.requires_grad:
                p.data = p.data.float()
    model.cuda()
    ids = torch.randint(0, 64, (4, 32), device="cuda",
                        generator=torch.Generator("cuda").manual_seed(0))

    def grads() -> dict[str, torch.Tensor]:
        model.zero_grad(set_to_none=True)
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = model(input_ids=ids, labels=ids).loss
        loss.backward()
        return {n: p.grad.float().clone() for n, p in model.named_parameters()
                if p.grad is not None}

    peft_grads = grads()
    with lora_fused.fused(model) as installed:
        assert installed == 14
        fused_grads = grads()
    assert fused_grads.keys() == peft_grads.keys()
    for name, grad in peft_grads.items():
        torch.testing.assert_close(fused_grads[name], grad, rtol=5e-2, atol=5e-3, msg=name)


def test_grouped_lora_over_a_4bit_base_gives_peft_gradients_on_the_gpu(tiny_llama, demo_data):
    """QLoRA on the GPU: the NF4 base dequantised inside the groups' calls (lora_fused._Base),
    peft's gradients within bf16 rounding, as on the CPU (test_lora_cast)."""
    from draslice.trainer import build

    cfg = SFTConfig(model_dir=str(tiny_llama), data=str(demo_data["chat"]), device="cuda",
                    load_in_4bit=True, max_length=32)
    run = build.assemble(cfg, torch.device("cuda"), "bf16", log=lambda _line: None)
    run.model.train()
    ids = torch.randint(0, 200, (2, 32), device="cuda",
                        generator=torch.Generator("cuda").manual_seed(0))
    plans: list = []
    peft_grads, fused_grads = _peft_and_fused_grads(run, ids, b_std=0.1, plans=plans)
    assert plans and all(plan.bases is not None for plan in plans)
    assert fused_grads.keys() == peft_grads.keys()
    assert largest_relative_distance(fused_grads, peft_grads) < 5e-2


def _peft_and_fused_grads(run, ids: torch.Tensor, b_std: float, plans: list | None = None
                          ) -> tuple[dict[str, torch.Tensor], dict[str, torch.Tensor]]:
    """The LoRA gradients of one step with peft's forward, then with lora_fused's (B drawn
    non-zero first, so that every path has a gradient); ``plans`` gets the groups' plans."""
    from draslice.trainer.speed import lora_fused

    layers = lora_fused.lora_layers(run.model)
    for layer in layers:
        for name in layer.lora_B:
            torch.nn.init.normal_(layer.lora_B[name].weight, std=b_std)

    def grads() -> dict[str, torch.Tensor]:
        run.model.zero_grad()
        with run.autocast:
            loss = run.model(input_ids=ids, labels=ids).loss
        loss.backward()
        return {n: p.grad.float().clone() for n, p in run.model.named_parameters()
                if p.grad is not None}

    peft_grads = grads()
    with run.lora_inputs_uncast():
        fused_grads = grads()
        if plans is not None:
            plans += [plan for layer in layers for plan in layer.forward.group.plans.values()]
    return peft_grads, fused_grads

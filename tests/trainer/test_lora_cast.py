"""While the loop trains under bf16 autocast, peft's LoRA layers keep their inputs in bf16
(``build.Training.lora_inputs_uncast``): the same gradients, fewer bytes kept for backward, and
peft's cast back in place for forwards outside autocast (the reference logits)."""

from __future__ import annotations

import torch

from draslice.tests.trainer.grads import largest_relative_distance, param_grads
from draslice.trainer import build
from draslice.trainer.config import ModelShape, SFTConfig

SHAPE = ModelShape(vocab_size=64, n_layer=2, n_embd=32, n_head=2, seq_len=16)


def _cfg(**kw) -> SFTConfig:
    return SFTConfig(**{"device": "cpu", "precision": "bf16", "bf16_weights": True,
                        "shape": SHAPE, **kw})


def _step(run: build.Training, ids: torch.Tensor) -> tuple[dict[str, torch.Tensor], int]:
    """(LoRA gradients, bytes of the distinct tensors autograd kept for backward)."""
    kept: dict[int, int] = {}

    def pack(t: torch.Tensor) -> torch.Tensor:
        kept[t.untyped_storage().data_ptr()] = t.untyped_storage().nbytes()
        return t

    run.model.zero_grad()
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t), run.autocast:
        loss = run.model(input_ids=ids, labels=ids).loss
    loss.backward()
    return param_grads(run.model), sum(kept.values())


def test_uncast_inputs_give_the_same_gradients_and_keep_fewer_bytes():
    run = build.assemble(_cfg(), torch.device("cpu"), "bf16", log=lambda _line: None)
    run.model.train()
    ids = torch.randint(0, SHAPE.vocab_size, (4, SHAPE.seq_len),
                        generator=torch.Generator().manual_seed(0))
    cast_grads, cast_bytes = _step(run, ids)
    with run.lora_inputs_uncast():
        kept_grads, kept_bytes = _step(run, ids)
    assert cast_grads and cast_grads.keys() == kept_grads.keys()
    for name, grad in cast_grads.items():
        torch.testing.assert_close(kept_grads[name], grad, rtol=0, atol=0, msg=name)
    assert kept_bytes < cast_bytes


def test_peft_casts_again_after_the_loop():
    run = build.assemble(_cfg(), torch.device("cpu"), "bf16", log=lambda _line: None)
    layers = [m for m in run.model.modules() if hasattr(m, "cast_input_dtype_enabled")]
    assert layers
    with run.lora_inputs_uncast():
        assert not any(m.cast_input_dtype_enabled for m in layers)
    assert all(m.cast_input_dtype_enabled for m in layers)


def test_without_autocast_nothing_changes():
    run = build.assemble(_cfg(precision="fp32", bf16_weights=False), torch.device("cpu"),
                         "fp32", log=lambda _line: None)
    with run.lora_inputs_uncast():
        assert all(m.cast_input_dtype_enabled for m in run.model.modules()
                   if hasattr(m, "cast_input_dtype_enabled"))


def test_a_bf16_run_ends_with_its_reference_logits_outside_autocast(tmp_path):
    """The forward after the loop runs a bf16 base against fp32 LoRA weights without autocast:
    it needs peft's cast back (this failed on the GPU when the cast stayed off)."""
    from draslice.trainer.sft import train

    cfg = _cfg(steps=2, batch_size=4, gradient_checkpointing=True)
    result = train(cfg, tmp_path / "out", tmp_path / "m.jsonl", log=lambda _line: None)
    assert result.precision == "bf16"
    assert (tmp_path / "out" / "reference_logits.pt").is_file()


def test_the_fused_sum_trains_like_peft_in_fp32_and_within_bf16_rounding():
    """lora_fused: base + scaling * x A^T B^T in one addmm gives peft's gradients (fp32: to
    rounding; bf16 autocast: within bf16's), and peft's forward is back after the loop."""
    from draslice.trainer.speed import lora_fused

    for precision, tol in (("fp32", 1e-5), ("bf16", 3e-2)):
        run = build.assemble(_cfg(precision=precision, bf16_weights=precision == "bf16"),
                             torch.device("cpu"), precision, log=lambda _line: None)
        run.model.train()
        for layer in lora_fused.lora_layers(run.model):  # B starts at zero: make it count
            for name in layer.lora_B:
                torch.nn.init.normal_(layer.lora_B[name].weight, std=0.1)
        ids = torch.randint(0, SHAPE.vocab_size, (4, SHAPE.seq_len),
                            generator=torch.Generator().manual_seed(0))
        peft_grads, _ = _step(run, ids)
        with run.lora_inputs_uncast():
            fused_grads, _ = _step(run, ids)
        assert peft_grads.keys() == fused_grads.keys()
        for name, grad in peft_grads.items():
            torch.testing.assert_close(fused_grads[name], grad, rtol=tol, atol=tol, msg=name)
        if precision == "bf16":  # installed only under autocast
            assert not any("forward" in vars(m) for m in lora_fused.lora_layers(run.model))


def test_the_fused_sum_takes_qlora_layers_and_trains_like_peft(tiny_llama, demo_data):
    """On a 4-bit (NF4) base, bitsandbytes' CPU layers: peft's 4-bit LoRA layers take the fused
    sum too (the base dequantised inside the group's call, no clone of its output), with peft's
    gradients within bf16's rounding."""
    from peft.tuners.lora.bnb import Linear4bit

    from draslice.trainer.speed import lora_fused

    cfg = SFTConfig(model_dir=str(tiny_llama), data=str(demo_data["chat"]), device="cpu",
                    precision="bf16", load_in_4bit=True, max_length=32)
    run = build.assemble(cfg, torch.device("cpu"), "bf16", log=lambda _line: None)
    run.model.train()
    layers = lora_fused.lora_layers(run.model)
    assert layers and all(type(layer) is Linear4bit for layer in layers)
    for layer in layers:  # B starts at zero: make it count
        for name in layer.lora_B:
            torch.nn.init.normal_(layer.lora_B[name].weight, std=0.1)
    ids = torch.randint(0, 200, (2, 32), generator=torch.Generator().manual_seed(0))
    peft_grads, _ = _step(run, ids)
    with run.lora_inputs_uncast():
        assert all("forward" in vars(layer) for layer in layers)
        fused_grads, _ = _step(run, ids)
        # the 4-bit base matmuls ran inside the groups' calls (dequantised there)
        plans = [plan for layer in layers for plan in layer.forward.group.plans.values()]
        assert plans and all(plan.bases is not None for plan in plans)
    assert peft_grads.keys() == fused_grads.keys() and len(peft_grads) == 2 * len(layers)
    for name, grad in peft_grads.items():
        torch.testing.assert_close(fused_grads[name], grad, rtol=3e-2, atol=3e-2, msg=name)
    # and as a whole, within bf16's rounding (0.02-0.03; a base off by 5% made it 0.15)
    assert largest_relative_distance(fused_grads, peft_grads) < 5e-2

"""lora_fused's groups: q/k/v and gate/up computed in one call with a backward of our own give
peft's outputs and gradients, whatever order or input the members are called with, and the
weights' casts follow every optimizer step; each with the update added in the matmul's
epilogue and with the inner dimension stacked (``lora_fused._stacked``), whichever a call's
size picks."""

from __future__ import annotations

import pytest
import torch

from draslice.tests.trainer.grads import checkpointed_qwen2, param_grads
from draslice.trainer.speed import lora_fused

IDS = torch.randint(0, 64, (2, 16), generator=torch.Generator().manual_seed(0))


@pytest.fixture(params=["epilogue", "stacked"])
def stacking(request, monkeypatch):
    """Every call of the test stacks the inner dimension, or none does; checked after it."""
    stacked = request.param == "stacked"
    monkeypatch.setattr(lora_fused, "STACK_MIN_ELEMENTS", 0 if stacked else 1 << 62)
    monkeypatch.setattr(lora_fused, "STACK_MIN_WIDTH_RATIO", 0.0)
    calls = []
    real = lora_fused._stacked
    monkeypatch.setattr(lora_fused, "_stacked", lambda *a: calls.append(1) or real(*a))
    yield
    assert bool(calls) == stacked, f"{request.param}: {len(calls)} stacked weights built"


def _lm_step(model: torch.nn.Module) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    model.zero_grad(set_to_none=True)
    loss = model(input_ids=IDS, labels=IDS).loss
    loss.backward()
    return loss.detach(), param_grads(model)


def test_siblings_form_groups_and_the_rest_stand_alone():
    model = checkpointed_qwen2(layers=2)
    groups = lora_fused.groups(model)
    names = sorted(tuple(type_name(model, m) for m in g.layers) for g in groups)
    assert names == sorted(2 * [("q_proj", "k_proj", "v_proj"), ("gate_proj", "up_proj"),
                                ("o_proj",), ("down_proj",)])
    assert all(len(g.layers) == 1 for g in lora_fused.groups(model, group=False))
    assert len(lora_fused.groups(model, group=False)) == 14


def type_name(model: torch.nn.Module, module: torch.nn.Module) -> str:
    return next(n for n, m in model.named_modules() if m is module).rsplit(".", 1)[-1]


@pytest.mark.parametrize("group", [True, False])
@pytest.mark.usefixtures("stacking")
def test_grouped_and_single_calls_give_peft_gradients_in_fp32(group):
    """Gradient checkpointing on, so the groups also run in the recompute; the first layer's
    input (the frozen embeddings' output) needs no gradient, the others' do."""
    model = checkpointed_qwen2(layers=2)
    peft_loss, peft_grads = _lm_step(model)
    with lora_fused.fused(model, group=group) as installed:
        assert installed == 14
        loss, grads = _lm_step(model)
    torch.testing.assert_close(loss, peft_loss, rtol=1e-6, atol=1e-6)
    assert grads.keys() == peft_grads.keys() and len(grads) == 28
    for name, grad in peft_grads.items():
        torch.testing.assert_close(grads[name], grad, rtol=1e-5, atol=1e-6, msg=name)
    assert not any("forward" in vars(m) for m in lora_fused.lora_layers(model))


def _attention_projections(model):
    attn = model.get_base_model().model.layers[0].self_attn
    return attn.q_proj, attn.k_proj, attn.v_proj


@pytest.mark.usefixtures("stacking")
def test_a_member_called_with_another_input_or_left_uncalled_is_still_right():
    """k called with another tensor computes alone; v never called: its output's gradient is
    missing from the group's backward, and its LoRA weights get zeros."""
    model = checkpointed_qwen2(layers=1)
    q, k, v = _attention_projections(model)
    x = torch.randn(3, 32, requires_grad=True, generator=torch.Generator().manual_seed(1))
    other = torch.randn(3, 32, generator=torch.Generator().manual_seed(2))

    def run() -> dict[str, torch.Tensor]:
        model.zero_grad(set_to_none=True)
        x.grad = None
        (q(x).square().sum() + k(other).sum()).backward()
        return {**param_grads(model), "x": x.grad.clone()}

    expected = run()
    with lora_fused.fused(model):
        got = run()
    for name, grad in expected.items():
        torch.testing.assert_close(got.get(name, torch.zeros_like(grad)), grad, rtol=1e-5,
                                   atol=1e-6, msg=name)
    assert torch.count_nonzero(got[next(n for n in got if "v_proj.lora_A" in n)]) == 0
    with lora_fused.fused(model):  # the called-last member leads the next call
        torch.testing.assert_close(v(x), type(v).forward(v, x))
        torch.testing.assert_close(q(x), type(q).forward(q, x))


@pytest.mark.parametrize("fused_adamw", [True, False])
def test_the_casts_follow_every_optimizer_step(fused_adamw):
    """The bf16 copies of the LoRA weights are reused by the recompute but made again after each
    step: the fused AdamW writes the weights without bumping their version."""
    model = checkpointed_qwen2(layers=1)
    params = [p for p in model.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(params, lr=0.1, fused=fused_adamw)
    q, _, _ = _attention_projections(model)
    x = torch.randn(1, 4, 32, generator=torch.Generator().manual_seed(3))
    bf16 = torch.autocast("cpu", dtype=torch.bfloat16)  # a step a context, as the loop does
    with lora_fused.fused(model):
        for _ in range(3):
            with bf16:  # (autocast's own cache of casts lasts as long as its context)
                before = q(x)
                torch.testing.assert_close(before, type(q).forward(q, x), rtol=2e-2, atol=2e-2)
                _lm_step(model)
            optimizer.step()
            with bf16:
                assert not torch.allclose(q(x), before, rtol=1e-2, atol=1e-2)


@pytest.mark.usefixtures("stacking")
def test_siblings_of_other_ranks_stand_alone_and_train_like_peft():
    """peft's rank_pattern gives k_proj another rank: q/k/v do not group (their B weights would
    not stack) while gate/up still do, and the gradients are peft's."""
    from peft import LoraConfig, get_peft_model
    from transformers import Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(0)
    base = Qwen2ForCausalLM(Qwen2Config(
        vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=32))
    model = get_peft_model(base, LoraConfig(
        r=4, lora_alpha=8, target_modules=["q_proj", "k_proj", "v_proj", "gate_proj", "up_proj"],
        rank_pattern={"k_proj": 2}))
    for name, param in model.named_parameters():
        if "lora_B" in name:
            torch.nn.init.normal_(param, std=0.1)
    sizes = sorted(len(g.layers) for g in lora_fused.groups(model))
    assert sizes == [1, 1, 1, 2]
    peft_loss, peft_grads = _lm_step(model)
    with lora_fused.fused(model):
        loss, grads = _lm_step(model)
    torch.testing.assert_close(loss, peft_loss)
    for name, grad in peft_grads.items():
        torch.testing.assert_close(grads[name], grad, rtol=1e-5, atol=1e-6, msg=name)


def test_stacking_in_bf16_is_as_close_to_fp32_as_the_epilogue(monkeypatch):
    """Over a bf16 base under bf16 autocast (the loop's case) ``s B`` is rounded into the
    stacked weight, where the epilogue scales in the accumulator: the gradients must stay as
    close to an fp32 run's as the epilogue's are."""
    reference = checkpointed_qwen2(layers=2)
    _, exact = _lm_step(reference)
    model = checkpointed_qwen2(layers=2)
    for param in model.parameters():
        if not param.requires_grad:
            param.data = param.data.bfloat16()
    monkeypatch.setattr(lora_fused, "STACK_MIN_WIDTH_RATIO", 0.0)
    drift = {}
    for name, threshold in (("epilogue", 1 << 62), ("stacked", 0)):
        monkeypatch.setattr(lora_fused, "STACK_MIN_ELEMENTS", threshold)
        with lora_fused.fused(model), torch.autocast("cpu", dtype=torch.bfloat16):
            _, grads = _lm_step(model)
        drift[name] = max(float((grads[k] - g).norm() / g.norm()) for k, g in exact.items())
    assert drift["stacked"] < 0.1, drift
    assert drift["stacked"] <= 1.25 * drift["epilogue"], drift

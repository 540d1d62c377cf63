"""Real fine-tunes through the one loop: model dirs, eval loss, levers, export, bad input."""

from __future__ import annotations

import json
import shutil

import pytest
import torch
from safetensors.torch import load_file
from transformers import AutoModelForCausalLM, AutoTokenizer

from draslice.errors import (
    InvalidParameter,
    MissingDependency,
    ModelLoadError,
)
from draslice.trainer import budget
from draslice.trainer.config import SFTConfig
from draslice.trainer.data.examples import IGNORE
from draslice.trainer.model import LLAMA_ATTENTION_AND_MLP, ModelShape, build_base, wrap_lora
from draslice.trainer.outputs import ADAPTER_DIR, MERGED_DIR, RUN_FILE
from draslice.trainer.sft import train
from draslice.trainer.speed.loss import causal_lm_loss, to_device
from draslice.trainer.tasks.validate import check_adapter


def _quiet(_line: str) -> None:
    pass


def _cfg(model, data, **overrides) -> SFTConfig:
    base = dict(model_dir=str(model), data=str(data), device="cpu", steps=12, batch_size=8,
                learning_rate=3e-3, log_every=4, max_length=64)
    return SFTConfig(**{**base, **overrides})


@pytest.fixture(scope="module")
def llama_run(tiny_llama, demo_data, tmp_path_factory):
    out = tmp_path_factory.mktemp("llama-run")
    lines: list[str] = []
    cfg = _cfg(tiny_llama, demo_data["chat"], eval_fraction=0.25, merge=True,
               lr_schedule="cosine", warmup_steps=2)
    result = train(cfg, out, out / "metrics.jsonl", log=lines.append)
    return {"out": out, "result": result, "lines": lines, "cfg": cfg}


def test_llama_chat_run_trains_logs_eval_loss_and_saves(llama_run):
    result, out = llama_run["result"], llama_run["out"]
    assert result.lora_targets == LLAMA_ATTENTION_AND_MLP
    assert result.eval_examples == 32 and result.train_examples == 96
    assert result.final_loss < result.initial_loss
    records = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in records] == list(range(1, 13))
    evals = [r["eval_loss"] for r in records if "eval_loss" in r]
    assert len(evals) == 4  # steps 1, 4, 8, 12
    assert evals[-1] < evals[0]
    assert result.eval_loss == evals[-1]
    assert any(line.startswith("{'eval_loss'") for line in llama_run["lines"])
    assert records[0]["lr"] < records[2]["lr"]  # warmup
    run = json.loads((out / RUN_FILE).read_text())
    assert run["config"]["lora_targets"] == LLAMA_ATTENTION_AND_MLP
    assert (out / ADAPTER_DIR / "adapter_model.safetensors").is_file()
    assert not list(out.glob(".tmp-*"))


def test_adapter_reloads_onto_the_base_from_model_dir(llama_run):
    check, figures = check_adapter(llama_run["out"])
    assert check.passed, check.detail
    assert figures["adapter_effect"] > 0.01


def test_merged_export_loads_as_plain_hf_model_and_matches_the_adapter(llama_run, tiny_llama):
    from peft import PeftModel

    merged_dir = llama_run["out"] / MERGED_DIR
    assert llama_run["result"].merged_dir == str(merged_dir)
    merged = AutoModelForCausalLM.from_pretrained(merged_dir, local_files_only=True,
                                                  dtype=torch.float32).eval()
    tok = AutoTokenizer.from_pretrained(merged_dir, local_files_only=True)
    assert tok.chat_template
    assert not any("lora" in name for name, _ in merged.named_parameters())
    base = AutoModelForCausalLM.from_pretrained(tiny_llama, local_files_only=True,
                                                dtype=torch.float32)
    adapted = PeftModel.from_pretrained(base, llama_run["out"] / ADAPTER_DIR).eval()
    ids = tok("reverse: red blue\nanswer:", return_tensors="pt")["input_ids"]
    fresh = AutoModelForCausalLM.from_pretrained(tiny_llama, local_files_only=True,
                                                 dtype=torch.float32).eval()
    with torch.no_grad():
        want = adapted(input_ids=ids).logits
        got = merged(input_ids=ids).logits
        plain = fresh(input_ids=ids).logits
    assert torch.allclose(got, want, atol=1e-4), (got - want).abs().max()
    assert not torch.allclose(plain, want, atol=1e-3)  # the merge did change the base


def test_gpt2_prompt_completion_with_packing_and_levers(tiny_gpt2, demo_data, tmp_path):
    cfg = _cfg(tiny_gpt2, demo_data["prompt-completion"], pack=True, gradient_checkpointing=True,
               bf16_weights=True, steps=3, batch_size=2, learning_rate=1e-2)
    result = train(cfg, tmp_path, tmp_path / "m.jsonl", log=_quiet)
    assert result.lora_targets == "c_attn,c_proj,c_fc"
    assert result.final_loss < result.initial_loss
    # Packed rows are max_length wide: the tokens per step are batch x max_length.
    assert result.train_tokens == 3 * 2 * 64
    weights = load_file(tmp_path / ADAPTER_DIR / "adapter_model.safetensors")
    assert all(w.dtype == torch.float32 for w in weights.values())
    check, _ = check_adapter(tmp_path)  # reloads the base in bf16, as it was trained
    assert check.passed, check.detail


def test_saved_dataset_dir_trains(tiny_gpt2, demo_data, tmp_path):
    result = train(_cfg(tiny_gpt2, demo_data["datasets"], steps=2), tmp_path,
                   tmp_path / "m.jsonl", log=_quiet)
    assert result.steps == 2 and result.train_examples == 128


def test_chunked_loss_equals_full_logits_loss_and_gradients(monkeypatch):
    import draslice.trainer.speed.loss as loss_mod

    model = wrap_lora(build_base(ModelShape(), 0), 8, 16, 0.0, "auto")
    torch.manual_seed(0)
    for p in model.parameters():
        if p.requires_grad:
            torch.nn.init.normal_(p, std=0.02)
    ids = torch.randint(0, 512, (3, 40))
    labels = ids.clone()
    labels[:, :7] = IGNORE
    want = model(input_ids=ids, labels=labels).loss
    want.backward()
    want_grads = [p.grad.clone() for p in model.parameters() if p.requires_grad]
    model.zero_grad()
    monkeypatch.setattr(loss_mod, "chunk_tokens", lambda _vocab: 16)  # several chunks
    batch = to_device({"input_ids": ids, "labels": labels}, torch.device("cpu"))
    got = causal_lm_loss(model, batch)
    got.backward()
    assert batch.count == 3 * (40 - 7) and batch.tokens == 3 * 40
    assert torch.allclose(got, want, atol=1e-6)
    for g, w in zip((p.grad for p in model.parameters() if p.requires_grad), want_grads,
                    strict=True):
        assert torch.allclose(g, w, atol=1e-6)


def test_chunked_loss_pads_an_odd_vocabulary_without_changing_the_loss(monkeypatch):
    """GPT-2's 50,257 rows are padded to a multiple of 64 for the matmuls: the padded logits
    must not leak into the softmax or the gradient."""
    import draslice.trainer.speed.loss as loss_mod

    model = wrap_lora(build_base(ModelShape(vocab_size=509), 0), 8, 16, 0.0, "auto")
    torch.manual_seed(1)
    for p in model.parameters():
        if p.requires_grad:
            torch.nn.init.normal_(p, std=0.02)
    ids = torch.randint(0, 509, (2, 24))
    want = model(input_ids=ids, labels=ids).loss
    want.backward()
    want_grads = [p.grad.clone() for p in model.parameters() if p.requires_grad]
    model.zero_grad()
    monkeypatch.setattr(loss_mod, "chunk_tokens", lambda _vocab: 10)
    got = causal_lm_loss(model, to_device({"input_ids": ids, "labels": ids}, torch.device("cpu")))
    got.backward()
    assert torch.allclose(got, want, atol=1e-6)
    for g, w in zip((p.grad for p in model.parameters() if p.requires_grad), want_grads,
                    strict=True):
        assert torch.allclose(g, w, atol=1e-6)


# -- bad input ------------------------------------------------------------------------------

def test_hub_id_and_missing_dirs_fail_clearly(demo_data, tmp_path):
    with pytest.raises(ModelLoadError, match="looks like a Hugging Face hub id: nothing is "
                                             "downloaded"):
        train(_cfg("Qwen/Qwen2.5-1.5B", demo_data["chat"]), tmp_path, tmp_path / "m",
              log=_quiet)
    with pytest.raises(ModelLoadError, match="no config.json"):
        train(_cfg(tmp_path, demo_data["chat"]), tmp_path / "o", tmp_path / "m", log=_quiet)


def test_model_dir_needs_data_and_back(tiny_gpt2):
    with pytest.raises(InvalidParameter, match="invalid data=''"):
        SFTConfig(model_dir=str(tiny_gpt2)).check()
    with pytest.raises(InvalidParameter, match="invalid model_dir=''"):
        SFTConfig(data="x.jsonl").check()


def test_tokenizer_larger_than_the_embeddings_is_refused(tiny_gpt2, demo_data, tmp_path):
    model_dir = tmp_path / "mismatch"
    shutil.copytree(tiny_gpt2, model_dir)
    config = json.loads((model_dir / "config.json").read_text())
    config["vocab_size"] = 300
    (model_dir / "config.json").write_text(json.dumps(config))
    model = AutoModelForCausalLM.from_pretrained(tiny_gpt2, local_files_only=True)
    model.resize_token_embeddings(300)
    model.save_pretrained(model_dir)
    with pytest.raises(ModelLoadError, match="tokenizer has 512 tokens but the model's "
                                             "embeddings have 300 rows"):
        train(_cfg(model_dir, demo_data["chat"]), tmp_path / "o", tmp_path / "m", log=_quiet)


def test_lora_target_not_in_the_model_names_its_projections(tiny_llama, demo_data, tmp_path):
    with pytest.raises(InvalidParameter, match=r"\['c_attn'\] not in the model; its projections "
                                               r"are \[.*'q_proj'"):
        train(_cfg(tiny_llama, demo_data["chat"], lora_targets="c_attn"), tmp_path,
              tmp_path / "m", log=_quiet)


def test_qlora_trains_a_4bit_base_on_the_cpu_and_validate_checks_its_adapter(
        tiny_llama, demo_data, tmp_path):
    """The QLoRA path end to end where CI runs (bitsandbytes' CPU 4-bit layers): the base is
    loaded in NF4, the adapter learns, and the validate step's reload onto a fresh 4-bit base
    reproduces the trained model's logits (it used to answer "not checked here")."""
    from bitsandbytes.nn import Linear4bit

    cfg = _cfg(tiny_llama, demo_data["chat"], load_in_4bit=True, steps=8)
    lines: list[str] = []
    result = train(cfg, tmp_path / "out", tmp_path / "m.jsonl", log=lines.append)
    assert result.final_loss < result.initial_loss
    run = json.loads((tmp_path / "out" / RUN_FILE).read_text())
    assert run["config"]["load_in_4bit"] is True
    check, figures = check_adapter(tmp_path / "out")
    assert check.passed, check.detail
    assert check.detail.startswith("reloaded onto a fresh base")
    assert figures["adapter_effect"] > 0.01
    from draslice.trainer.model import load_pretrained

    base = load_pretrained(tiny_llama, dtype=torch.bfloat16, load_in_4bit=True,
                           device=torch.device("cpu"))
    assert isinstance(base.model.layers[0].self_attn.q_proj, Linear4bit)


def test_qlora_without_bitsandbytes_is_a_clear_error_and_validate_says_why(
        tiny_llama, demo_data, tmp_path, monkeypatch):
    import builtins

    real_import = builtins.__import__

    def no_bitsandbytes(name, *args, **kwargs):
        if name == "bitsandbytes" or name.startswith("bitsandbytes."):
            raise ImportError("No module named 'bitsandbytes'")
        return real_import(name, *args, **kwargs)

    cfg = _cfg(tiny_llama, demo_data["chat"], load_in_4bit=True, steps=2)
    train(cfg, tmp_path / "out", tmp_path / "m.jsonl", log=_quiet)  # with bitsandbytes
    monkeypatch.setattr(builtins, "__import__", no_bitsandbytes)
    with pytest.raises(MissingDependency, match=r"load_in_4bit \(QLoRA\) needs bitsandbytes: "
                                                r"pip install 'draslice\[qlora\]'"):
        train(cfg, tmp_path / "again", tmp_path / "m2.jsonl", log=_quiet)
    assert not (tmp_path / "again" / ADAPTER_DIR).exists()
    check, _ = check_adapter(tmp_path / "out")
    assert not check.passed
    assert "cannot reload the base here" in check.detail and "bitsandbytes" in check.detail


def test_oom_advice_names_the_unused_levers(tiny_llama, demo_data):
    cfg = _cfg(tiny_llama, demo_data["chat"], max_length=64 * 2)
    text = budget.oom_advice(5.75, 5.6, budget.knobs_to_try(cfg))
    assert "the slice has 5.75 GiB" in text and "reached 5.60 GiB" in text
    for flag in ("--gradient-checkpointing", "--offload-activations", "--tile-mlp",
                 "--bf16-weights", "--batch-size 4",
                 "--load-in-4bit", "--max-length 64"):
        assert flag in text
    lean = _cfg(tiny_llama, demo_data["chat"], gradient_checkpointing=True,
                offload_activations=True, tile_mlp=True, load_in_4bit=True, batch_size=1,
                max_length=64)
    assert budget.knobs_to_try(lean) == []

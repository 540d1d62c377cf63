"""trainer/scratch.py builds loadable model directories; `draslice train` runs them."""

from __future__ import annotations

import json

import pytest
import torch
from click.testing import CliRunner
from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

from draslice.cli import main
from draslice.errors import InvalidParameter
from draslice.tests.scratch import PRESETS, model_config, save_scratch_model


@pytest.mark.parametrize("arch", ["qwen2", "mistral"])
def test_every_arch_saves_a_loadable_model_and_tokenizer(arch, tmp_path):
    out = save_scratch_model(tmp_path / arch, arch, hidden_size=32, num_layers=1, num_heads=2,
                             num_kv_heads=1, vocab_size=300, max_positions=64, seed=1)
    config = AutoConfig.from_pretrained(out, local_files_only=True)
    assert config.model_type == arch and config.vocab_size == 300
    tok = AutoTokenizer.from_pretrained(out, local_files_only=True)
    assert len(tok) <= 300 and tok.eos_token == "<|endoftext|>" and tok.chat_template
    model = AutoModelForCausalLM.from_pretrained(out, local_files_only=True)
    ids = tok("the quick brown fox", return_tensors="pt")["input_ids"]
    assert model(input_ids=ids).logits.shape[-1] == 300


def test_same_seed_same_weights(tmp_path):
    kw = dict(hidden_size=32, num_layers=1, num_heads=2, vocab_size=300, max_positions=64)
    a = save_scratch_model(tmp_path / "a", "llama", seed=3, **kw)
    b = save_scratch_model(tmp_path / "b", "llama", seed=3, **kw)
    assert (a / "model.safetensors").read_bytes() == (b / "model.safetensors").read_bytes()


def test_presets_have_the_advertised_sizes():
    sizes = {}
    for name, spec in PRESETS.items():
        spec = dict(spec)
        arch = spec.pop("arch")
        with torch.device("meta"):
            model = AutoModelForCausalLM.from_config(model_config(arch, **spec))
        sizes[name] = sum(p.numel() for p in model.parameters())
    assert 120e6 < sizes["gpt2-124m"] < 128e6
    assert 1.4e9 < sizes["llama-1.5b"] < 1.6e9
    assert 6.5e9 < sizes["llama-7b"] < 7.0e9
    assert sizes["tiny-llama"] < 1e6


def _layer_grad_norms(model_dir, ids: torch.Tensor) -> list[float]:
    """Gradient norm at each decoder layer's output after one backward of the LM loss."""
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    outs: list[torch.Tensor] = []

    def keep(_module, _inputs, out):
        hidden = out[0] if isinstance(out, tuple) else out
        hidden.retain_grad()
        outs.append(hidden)

    for layer in model.model.layers:
        layer.register_forward_hook(keep)
    model(input_ids=ids, labels=ids).loss.backward()
    return [float(o.grad.norm()) for o in outs]


def test_a_row_starting_with_the_pad_token_keeps_a_finite_backward(tmp_path):
    """HF's init zeroes the pad (= EOS) embedding row; a packed row that starts with EOS then
    has a zero residual stream at position 0 and every RMSNorm backward there multiplies by
    1/sqrt(eps): the 28-layer 1.5B preset reached inf. Scratch models give that row values."""
    model_dir = save_scratch_model(tmp_path / "m", "llama", hidden_size=256, num_layers=20,
                                   num_heads=4, num_kv_heads=2, intermediate_size=1024,
                                   vocab_size=512, max_positions=128, dtype="float32")
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModelForCausalLM.from_pretrained(model_dir)
    pad = model.get_input_embeddings().padding_idx
    assert pad == tokenizer.eos_token_id
    assert float(model.get_input_embeddings().weight[pad].abs().max()) > 0
    ids = torch.randint(0, 512, (2, 64), generator=torch.Generator().manual_seed(0))
    ids[:, 0] = tokenizer.eos_token_id
    norms = _layer_grad_norms(model_dir, ids)
    assert norms[0] / norms[-1] < 100, norms


def test_bad_shapes_are_refused(tmp_path):
    with pytest.raises(InvalidParameter, match="arch"):
        save_scratch_model(tmp_path, "bert", hidden_size=32, num_layers=1, num_heads=2,
                           vocab_size=300, max_positions=64)
    with pytest.raises(InvalidParameter, match="vocab_size"):
        save_scratch_model(tmp_path, "gpt2", hidden_size=32, num_layers=1, num_heads=2,
                           vocab_size=100, max_positions=64)


def test_train_command_prints_one_final_json_line(tiny_llama, demo_data, tmp_path):
    result = CliRunner().invoke(main, [
        "train", "--output-dir", str(tmp_path), "--model-dir", str(tiny_llama),
        "--data", str(demo_data["prompt-completion"]), "--steps", "3", "--batch-size", "4",
        "--max-length", "48", "--device", "cpu", "--pack", "--eval-fraction", "0.1", "--json",
    ])
    assert result.exit_code == 0, result.output
    summary = json.loads(result.output.strip().splitlines()[-1])
    assert summary["steps"] == 3 and summary["tokens_per_s"] > 0
    assert summary["peak_mem_gib"] > 0 and summary["eval_loss"] > 0
    assert summary["lora_targets"].startswith("q_proj")
    assert "LoRA SFT on CPU: OK" in result.output


def test_train_command_bad_data_is_one_error_line(tiny_llama, tmp_path):
    data = tmp_path / "bad.jsonl"
    data.write_text('{"prompt": "a", "completion": "b"}\n{oops\n')
    result = CliRunner().invoke(main, [
        "train", "--output-dir", str(tmp_path / "o"), "--model-dir", str(tiny_llama),
        "--data", str(data), "--device", "cpu",
    ])
    assert result.exit_code == 2
    assert f"error: {data}:2: not valid JSON" in result.output
    assert "Traceback" not in result.output

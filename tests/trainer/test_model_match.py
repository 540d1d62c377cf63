"""Issue 37, 1: a model folder whose config.json does not describe its weights is refused
before the weights load (one line, exit 2, how many tensors and two names), by transformers'
own loader run on the headers; folders transformers loads whole pass.

Each bad folder is a real one with one real file changed as users change them: another
model's config.json copied in, a config edited by hand (layers, width, tying).
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from draslice.errors import ModelLoadError
from draslice.tests.trainer.test_bad_input import _cli, _one_error_line
from draslice.trainer.model import load_pretrained
from draslice.trainer.model import match as model_match


def _copy(model: Path, tmp_path: Path, name: str = "model") -> Path:
    copy = tmp_path / name
    shutil.copytree(model, copy)
    return copy


def _edit_config(model: Path, **changes) -> None:
    config = json.loads((model / "config.json").read_text())
    config.update(changes)
    (model / "config.json").write_text(json.dumps(config))


def test_a_gpt2_config_beside_llama_weights_is_refused_before_the_load(
        tiny_gpt2, tiny_llama, demo_data, tmp_path, no_model_load):
    model = _copy(tiny_llama, tmp_path)
    shutil.copy(Path(tiny_gpt2) / "config.json", model / "config.json")
    out = tmp_path / "out"
    line = _one_error_line(
        _cli(out, model, demo_data["prompt-completion"]),
        f"{model}: config.json does not describe the weights beside it",
        "27 tensor(s) the config needs are not in the weights (transformer.h.0.attn.c_attn.bias, "
        "transformer.h.0.attn.c_attn.weight, ...)",
        "20 tensor(s) in the weights have no place in the model it describes "
        "(model.embed_tokens.weight, model.layers.0.input_layernorm.weight, ...)",
        "start those at random", "put the config.json saved with these weights")
    assert "shape" not in line
    assert not out.exists()


def test_a_config_with_fewer_layers_than_the_weights_is_refused(tiny_llama, demo_data,
                                                                tmp_path, no_model_load):
    model = _copy(tiny_llama, tmp_path)
    _edit_config(model, num_hidden_layers=1)
    _one_error_line(_cli(tmp_path / "out", model, demo_data["prompt-completion"]),
                    "9 tensor(s) in the weights have no place in the model it describes "
                    "(model.layers.1.input_layernorm.weight, model.layers.1.mlp.down_proj.weight",
                    "transformers would drop them")


def test_a_config_of_another_width_names_the_shapes(tiny_gpt2, demo_data, tmp_path,
                                                    no_model_load):
    model = _copy(tiny_gpt2, tmp_path)
    _edit_config(model, n_embd=128)
    _one_error_line(_cli(tmp_path / "out", model, demo_data["prompt-completion"]),
                    "28 tensor(s) have another shape (transformer.h.0.attn.c_attn.bias: "
                    "weights (192,), config (384,), transformer.h.0.attn.c_attn.weight: "
                    "weights (64, 192), config (128, 384), ...)")


def test_untied_config_beside_tied_weights_misses_the_head(tiny_llama, demo_data, tmp_path,
                                                           no_model_load):
    """Tied weights save no lm_head: a config that unties them needs one the folder lacks."""
    model = _copy(tiny_llama, tmp_path)
    weights = load_file(model / "model.safetensors")
    del weights["lm_head.weight"]
    save_file(weights, model / "model.safetensors", metadata={"format": "pt"})
    _one_error_line(_cli(tmp_path / "out", model, demo_data["prompt-completion"]),
                    "1 tensor(s) the config needs are not in the weights (lm_head.weight)")
    _edit_config(model, tie_word_embeddings=True)  # the config that goes with such weights
    assert model_match.check_matches(model) is not None


def test_the_load_itself_reads_its_report_too(tiny_gpt2, tiny_llama, tmp_path):
    """What the header check cannot read ahead is judged on the real load's own report."""
    model = _copy(tiny_llama, tmp_path)
    shutil.copy(Path(tiny_gpt2) / "config.json", model / "config.json")
    with pytest.raises(ModelLoadError, match="27 tensor.s. the config needs are not in the "
                                             "weights"):
        load_pretrained(model)


@pytest.mark.parametrize("fixture", ["tiny_gpt2", "tiny_llama"])
def test_folders_as_saved_pass_and_give_the_model_on_meta(fixture, request):
    meta = model_match.check_matches(request.getfixturevalue(fixture))
    assert meta is not None and {p.device.type for p in meta.parameters()} == {"meta"}


def test_old_gpt2_names_and_buffers_pass_as_transformers_loads_them(tiny_gpt2, tmp_path):
    """GPT-2 checkpoints from before the base-model prefix, with their attention-mask
    buffers: transformers renames and ignores them, so the check does too."""
    model = _copy(tiny_gpt2, tmp_path)
    weights = {k.removeprefix("transformer."): v
               for k, v in load_file(model / "model.safetensors").items()}
    for layer in range(2):
        weights[f"h.{layer}.attn.bias"] = torch.ones(1, 1, 512, 512)
    save_file(weights, model / "model.safetensors", metadata={"format": "pt"})
    assert model_match.check_matches(model) is not None


def test_only_the_files_transformers_loads_are_compared(tiny_llama, tmp_path):
    """A sharded folder is read through its index; a stray consolidated.safetensors in another
    format (as Mistral repositories ship) is not what transformers loads."""
    from transformers import AutoModelForCausalLM

    model = tmp_path / "sharded"
    AutoModelForCausalLM.from_pretrained(tiny_llama).save_pretrained(model, max_shard_size="100KB")
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(Path(tiny_llama) / name, model / name)
    assert len(model_match.weight_files(model)) > 1
    save_file({"tok_embeddings.weight": torch.zeros(4, 4)}, model / "consolidated.safetensors")
    assert model_match.check_matches(model) is not None

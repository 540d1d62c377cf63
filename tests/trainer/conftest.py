"""Tiny Hugging Face model directories and datasets, written by draslice.tests.scratch.

Everything a real fine-tune loads (config, safetensors, tokenizer.json, chat template) is
on disk, so the tests take the user's loading path with no download.
"""

from __future__ import annotations

import pytest

from draslice.tests.scratch import save_preset, write_demo_data


@pytest.fixture(scope="session")
def tiny_gpt2(tmp_path_factory):
    return save_preset("tiny-gpt2", tmp_path_factory.mktemp("models") / "tiny-gpt2")


@pytest.fixture(scope="session")
def tiny_llama(tmp_path_factory):
    return save_preset("tiny-llama", tmp_path_factory.mktemp("models") / "tiny-llama")


@pytest.fixture(scope="session")
def demo_data(tmp_path_factory):
    """The demo task in all three formats: {format: path}."""
    root = tmp_path_factory.mktemp("data")
    return {
        "prompt-completion": write_demo_data(root / "pc.jsonl", "prompt-completion", 128),
        "chat": write_demo_data(root / "chat.jsonl", "chat", 128),
        "datasets": write_demo_data(root / "saved", "datasets", 128),
    }


@pytest.fixture
def no_model_load(monkeypatch):
    """The model's weights must not be read: a refusal that came after them would cost a user
    the load (minutes for a 7B base). A call fails the command with exit 1, not 2."""
    from draslice.trainer import build

    def refuse(*_args, **_kwargs):
        raise AssertionError("the model was loaded before the input was refused")

    monkeypatch.setattr(build, "load_pretrained", refuse)

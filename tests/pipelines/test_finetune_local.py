"""The finetune pipeline end to end under kfp.local, on a model and data written to disk."""

from __future__ import annotations

import json

import pytest
from kfp import local

from draslice.local import kfp_fixes
from draslice.pipelines.finetune import pipeline as finetune
from draslice.tests.scratch import save_preset, write_demo_data

# The whole pipeline: five tasks, each a fresh Python process importing torch (~25 s).
pytestmark = pytest.mark.slow


def test_finetune_pipeline_passes_with_checkpoints_and_merged_model(tmp_path, monkeypatch):
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    volume = tmp_path / "volume"  # what the PVC holds; kfp.local ignores the mount itself
    model = save_preset("tiny-llama", volume / "models" / "tiny-llama")
    data = write_demo_data(volume / "data" / "chat.jsonl", "chat", 128)
    kfp_fixes.install()
    local.init(runner=local.SubprocessRunner(use_venv=False),
               pipeline_root=str(tmp_path / "runs"), raise_on_error=True)
    finetune.build()(
        model_dir=str(model), data=str(data), checkpoint_dir=str(volume / "checkpoints"),
        max_length=64, steps=20, batch_size=8, learning_rate=3e-3, bf16_weights=False,
        checkpoint_every=10, merge=True, eval_fraction=0.1, min_loss_drop=0.02, device="cpu",
    )
    summary = next((tmp_path / "runs").glob("*/validate/summary")).read_text()
    assert "PASS" in summary
    adapter = next((tmp_path / "runs").glob("*/finetune/adapter"))
    run = json.loads((adapter / "draslice_sft.json").read_text())
    assert run["result"]["eval_loss"] is not None
    assert (adapter / "merged" / "tokenizer.json").is_file()
    (run_checkpoints,) = (volume / "checkpoints").iterdir()  # one folder per run id
    assert [p.name for p in sorted(run_checkpoints.iterdir())] == ["step-00000010",
                                                                    "step-00000020"]


def test_finetune_artifact_pipeline_imports_the_base_model_and_validates(tmp_path, monkeypatch):
    """The Model-artifact variant: the base comes through dsl.importer (here a local path;
    on a cluster s3://, gs://, minio:// or oci://), data and checkpoints from the volume."""
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    model = save_preset("tiny-llama", tmp_path / "bucket" / "models" / "tiny-llama")
    volume = tmp_path / "volume"
    data = write_demo_data(volume / "data" / "chat.jsonl", "chat", 128)
    kfp_fixes.install()
    local.init(runner=local.SubprocessRunner(use_venv=False),
               pipeline_root=str(tmp_path / "runs"), raise_on_error=True)
    finetune.build(model="artifact")(
        base_model_uri=str(model), data=str(data), checkpoint_dir=str(volume / "checkpoints"),
        max_length=64, steps=12, batch_size=8, learning_rate=3e-3, bf16_weights=False,
        checkpoint_every=0, eval_fraction=0.0, min_loss_drop=0.02, device="cpu",
    )
    summary = next((tmp_path / "runs").glob("*/validate/summary")).read_text()
    assert "PASS" in summary and "reloaded onto a fresh base" in summary
    adapter = next((tmp_path / "runs").glob("*/finetune/adapter"))
    run = json.loads((adapter / "draslice_sft.json").read_text())
    assert run["config"]["model_dir"] == str(model)

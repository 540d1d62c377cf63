"""``draslice compile --kueue-queue``: GPU task pods join a Kueue queue; compiled/ stays without."""

from __future__ import annotations

import pytest
from click.testing import CliRunner
from google.protobuf import json_format

from draslice.cli import main
from draslice.pipelines.claim import CLAIM_LABEL, NATIVE_FIELD, QUEUE_LABEL, bind_claim
from draslice.pipelines.variants import GPU_EXECUTORS, VARIANTS
from draslice.tests import platform_spec
from draslice.tests.conftest import REPO
from draslice.tests.pipelines.test_claim import _task


def test_bind_claim_adds_the_queue_label_in_both_modes():
    task = bind_claim(_task(), "mig-1g-6gb", "policy", kueue_queue="gpu-slices")
    assert task.platform_config["kubernetes"]["podMetadata"]["labels"] == {
        QUEUE_LABEL: "gpu-slices", CLAIM_LABEL: "mig-1g-6gb"}
    task = bind_claim(_task(), "mig-1g-6gb", "native", kueue_queue="gpu-slices")
    config = task.platform_config["kubernetes"]
    assert config["podMetadata"]["labels"] == {QUEUE_LABEL: "gpu-slices"}
    assert config[NATIVE_FIELD] == [{"resourceClaimTemplateName": "mig-1g-6gb"}]


def _labels_by_executor(text: str, native: bool) -> dict[str, dict]:
    _, configs = platform_spec.parse_strict(text, native=native)
    return {name: json_format.MessageToDict(c).get("podMetadata", {}).get("labels", {})
            for name, c in configs.items()}


@pytest.mark.parametrize("mode", ["policy", "native"])
def test_compiled_gpu_tasks_carry_the_queue_label(tmp_path, mode):
    result = CliRunner().invoke(main, [
        "compile", "--template", "mig-2g-12gb", "--mode", mode, "--kind", "canary",
        "--kueue-queue", "gpu-slices", "--out", str(tmp_path)])
    assert result.exit_code == 0, result.output
    (path,) = tmp_path.iterdir()
    assert path.name == f"canary.{mode}.mig-2g-12gb.yaml"
    labels = _labels_by_executor(path.read_text(), native=mode == "native")
    queued = {name for name, lab in labels.items() if lab.get(QUEUE_LABEL) == "gpu-slices"}
    assert queued == set(GPU_EXECUTORS["canary"])  # preflight is not queued


def test_committed_compiled_files_have_no_queue():
    for variant in VARIANTS:
        assert QUEUE_LABEL not in (REPO / "compiled" / variant.filename).read_text()


@pytest.mark.parametrize(("args", "message"), [
    (["--kueue-queue", "gpu-slices"], "invalid out='compiled'"),
    (["--kueue-queue", "GPU Slices", "--out", "x"], "invalid kueue_queue='GPU Slices'"),
])
def test_kueue_queue_errors(args, message):
    result = CliRunner().invoke(main, ["compile", *args])
    assert result.exit_code == 2
    assert message in result.stderr

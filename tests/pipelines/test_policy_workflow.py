"""The model of what KFP 2.17.0 makes of a policy-mode pipeline (tests/kfp_workflow.py, which
the admission-policy tests on the real control plane build their pods with) says what a real
2.17.0 server's Workflow showed (issue 36, fact 11), for every policy file in compiled/."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from draslice.cluster.names import CLAIM_LABEL
from draslice.components.image import DEFAULT_TRAINER_IMAGE
from draslice.pipelines.variants import GPU_EXECUTORS
from draslice.tests import kfp_workflow

REPO = Path(__file__).resolve().parents[2]
POLICY_FILES = sorted((REPO / "compiled").glob("*.policy.*.yaml"))


@pytest.fixture(params=POLICY_FILES, ids=lambda p: p.name)
def compiled(request) -> Path:
    return request.param


def test_no_template_carries_a_literal_label(compiled):
    wf = kfp_workflow.workflow(compiled, {"steps": 60})
    labelled = {t["name"]: t["metadata"]["labels"] for t in wf["spec"]["templates"]
                if (t.get("metadata") or {}).get("labels")}
    assert labelled == {"metadata-0-1-system-container-impl": {
        "{{inputs.parameters.pod-metadata-label-key}}":
            "{{inputs.parameters.pod-metadata-label-val}}"}}
    for template in wf["spec"]["templates"]:
        if template["name"].endswith("system-container-impl"):
            assert template["container"]["image"] == kfp_workflow.PLACEHOLDER_IMAGE
        if "driver" in template["name"]:
            assert "metadata" not in template
    assert "nvidia.com/gpu" not in json.dumps(wf)


def test_the_gpu_tasks_pass_the_claim_label_as_argo_parameters(compiled):
    kind = compiled.name.split(".")[0]
    template = compiled.name.split(".")[2]
    tasks = kfp_workflow.labelled_tasks(compiled)
    assert tasks == sorted(e.removeprefix("exec-") for e in GPU_EXECUTORS[kind])
    wf = kfp_workflow.workflow(compiled)
    for task in tasks:
        step, _ = kfp_workflow.task_step(wf, task)
        arguments = {p["name"]: p["value"] for p in step["arguments"]["parameters"]}
        assert (arguments["pod-metadata-label-key"], arguments["pod-metadata-label-val"]) == (
            CLAIM_LABEL, template)
        pod = kfp_workflow.executor_pod(wf, task, "p", "ns")
        assert pod["metadata"]["labels"][CLAIM_LABEL] == template
        assert pod["spec"]["containers"][1]["image"] == DEFAULT_TRAINER_IMAGE


def test_the_trainer_image_is_only_in_the_drivers_json_and_steps_in_the_root_driver(compiled):
    wf = kfp_workflow.workflow(compiled, {"steps": 60})
    places = []
    for template in wf["spec"]["templates"]:
        assert DEFAULT_TRAINER_IMAGE not in json.dumps({k: v for k, v in template.items()
                                                        if k != "dag"})
        for step in (template.get("dag") or {}).get("tasks", []):
            for param in step.get("arguments", {}).get("parameters", []):
                if DEFAULT_TRAINER_IMAGE in param["value"]:
                    json.loads(param["value"])  # inside a JSON argument
                    places.append((step["template"], param["name"]))
                if param["name"] == "runtime-config":
                    assert json.loads(param["value"])["parameterValues"] == {"steps": 60}
    assert places and {t for t, _ in places} == {kfp_workflow.CONTAINER_DRIVER}


def test_the_model_reads_the_labels_the_compiled_file_declares(compiled):
    docs = [d for d in yaml.safe_load_all(compiled.read_text()) if d]
    executors = docs[1]["platforms"]["kubernetes"]["deploymentSpec"]["executors"]
    declared = sorted(name.removeprefix("exec-") for name, cfg in executors.items()
                      if (cfg.get("podMetadata") or {}).get("labels"))
    assert kfp_workflow.labelled_tasks(compiled) == declared

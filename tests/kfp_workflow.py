"""What KFP 2.17.0's Argo compiler makes of a compiled pipeline, and the executor pod Argo then
creates from it, as far as draslice's policy mode depends on it.

A model, not KFP's compiler: KFP's backend cannot be built here (docs/kfp.md). What it says
was observed on a real KFP 2.17.0 API server (issue 36, fact 11), for the Workflow of a policy-
mode run:

- no executor template carries a literal label. The tasks whose Kubernetes config has pod
  metadata (``smoke`` and ``finetune``: ``draslice.dev/claim-template: <template>``) pass it as
  the Argo parameters ``pod-metadata-label-key`` and ``pod-metadata-label-val`` into one
  executor template they share, ``metadata-0-1-system-container-impl`` (no annotation, one
  label), whose ``metadata.labels`` is ``{"{{inputs.parameters.pod-metadata-label-key}}":
  "{{inputs.parameters.pod-metadata-label-val}}"}``; the other tasks run
  ``system-container-impl``, which has no labels;
- every executor template's image is ``gcr.io/ml-pipeline/should-be-overridden-during-runtime``;
- driver templates carry no label, and nothing carries ``nvidia.com/gpu``;
- the trainer image appears only inside the component's JSON (the container driver's
  ``component`` argument), and the run's parameters (``steps``) in the root driver's runtime
  config.

Read from KFP's and Argo's source, not observed: the pod gets the label when Argo substitutes
the task's arguments into the template's metadata, and the image, command and arguments of its
container ``main`` from the pod spec patch the container driver writes (the template's
``podSpecPatch: {{inputs.parameters.pod-spec-patch}}``); Argo adds its ``init`` and ``wait``
containers, KFP its launcher init container.
"""

from __future__ import annotations

import copy
import json
import re
from pathlib import Path

import yaml

PLACEHOLDER_IMAGE = "gcr.io/ml-pipeline/should-be-overridden-during-runtime"
DRIVER_IMAGE = "ghcr.io/kubeflow/kfp-driver:2.17.0"
LAUNCHER_IMAGE = "ghcr.io/kubeflow/kfp-launcher:2.17.0"
ARGOEXEC_IMAGE = "quay.io/argoproj/argoexec:v3.6.7"
EXECUTOR = "system-container-impl"
CONTAINER_DRIVER = "system-container-driver"
DAG_DRIVER = "system-dag-driver"
IMPORTER = "system-importer"
KEY, VALUE = "pod-metadata-label-key", "pod-metadata-label-val"
_PARAM = re.compile(r"\{\{inputs\.parameters\.([a-z0-9-]+)\}\}")


def _documents(compiled: Path | str | list[dict]) -> tuple[dict, dict]:
    docs = compiled if isinstance(compiled, list) else [
        d for d in yaml.safe_load_all(Path(compiled).read_text()) if d]
    platform = next((d for d in docs[1:] if "platforms" in d), {})
    return docs[0], platform


def _k8s_executors(platform: dict) -> dict:
    return (platform.get("platforms", {}).get("kubernetes", {}).get("deploymentSpec", {})
            .get("executors", {}))


def _metadata_template(labels: int) -> str:
    """The shared executor template of tasks with pod metadata (0 annotations, N labels)."""
    return f"metadata-0-{labels}-{EXECUTOR}"


def _executor_template(labels: int) -> dict:
    template = {
        "name": _metadata_template(labels) if labels else EXECUTOR,
        "inputs": {"parameters": [{"name": "pod-spec-patch"}]},
        "podSpecPatch": "{{inputs.parameters.pod-spec-patch}}",
        "container": {"name": "", "image": PLACEHOLDER_IMAGE,
                      "command": ["/kfp-launcher/launch"], "args": ["--executor_input", "{{}}"]},
        "initContainers": [{"name": "kfp-launcher", "image": LAUNCHER_IMAGE,
                            "command": ["launcher-v2", "--copy", "/kfp-launcher/launch"]}],
    }
    if labels:
        suffixes = [""] if labels == 1 else [f"-{i}" for i in range(1, labels + 1)]
        template["inputs"]["parameters"] += [{"name": KEY + s} for s in suffixes] + [
            {"name": VALUE + s} for s in suffixes]
        template["metadata"] = {"labels": {
            f"{{{{inputs.parameters.{KEY}{s}}}}}": f"{{{{inputs.parameters.{VALUE}{s}}}}}"
            for s in suffixes}}
    return template


def workflow(compiled: Path | str | list[dict], parameters: dict | None = None,
             name: str = "run") -> dict:
    """The Workflow KFP 2.17.0 compiles for a run of ``compiled`` with ``parameters``."""
    spec, platform = _documents(compiled)
    k8s = _k8s_executors(platform)
    components = spec.get("components", {})
    executors = spec.get("deploymentSpec", {}).get("executors", {})
    templates: dict[str, dict] = {
        CONTAINER_DRIVER: {"name": CONTAINER_DRIVER, "inputs": {"parameters": [
            {"name": "component"}, {"name": "task"}, {"name": "container"},
            {"name": "parent-dag-id"}]},
            "container": {"image": DRIVER_IMAGE, "command": ["driver"]}},
        DAG_DRIVER: {"name": DAG_DRIVER, "inputs": {"parameters": [
            {"name": "component"}, {"name": "runtime-config", "default": ""},
            {"name": "task", "default": ""}, {"name": "parent-dag-id", "default": "0"}]},
            "container": {"image": DRIVER_IMAGE, "command": ["driver"]}},
    }

    def dag(component_name: str, tasks: dict) -> None:
        steps = []
        for task_name, task in sorted(tasks.items()):
            ref = task["componentRef"]["name"]
            component = components[ref]
            if "dag" in component:
                steps.append({"name": task_name, "template": ref})
                dag(ref, component["dag"]["tasks"])
                continue
            label = component["executorLabel"]
            if "container" not in executors[label]:  # an importer: no pod of its own code
                templates.setdefault(IMPORTER, {"name": IMPORTER, "container": {
                    "image": LAUNCHER_IMAGE, "command": ["launcher-v2"]}})
                steps.append({"name": task_name, "template": IMPORTER})
                continue
            container = executors[label]["container"]
            steps.append({"name": f"{task_name}-driver", "template": CONTAINER_DRIVER,
                          "arguments": {"parameters": [
                              {"name": "component", "value": json.dumps(component)},
                              {"name": "task", "value": json.dumps(task)},
                              {"name": "container", "value": json.dumps(container)}]}})
            labels = (k8s.get(label, {}).get("podMetadata") or {}).get("labels") or {}
            executor = _executor_template(len(labels))
            templates.setdefault(executor["name"], executor)
            patch = f"tasks.{task_name}-driver.outputs.parameters.pod-spec-patch"
            args = [{"name": "pod-spec-patch", "value": f"{{{{{patch}}}}}"}]
            suffixes = [""] if len(labels) == 1 else [f"-{i}" for i in range(1, len(labels) + 1)]
            for suffix, (key, value) in zip(suffixes, sorted(labels.items()), strict=False):
                args += [{"name": KEY + suffix, "value": key},
                         {"name": VALUE + suffix, "value": value}]
            steps.append({"name": task_name, "template": executor["name"],
                          "dependencies": [f"{task_name}-driver"],
                          "arguments": {"parameters": args}})
        templates[component_name] = {"name": component_name, "dag": {"tasks": steps}}

    dag("root", spec["root"]["dag"]["tasks"])
    runtime_config = {"parameterValues": dict(parameters or {})}
    templates["entrypoint"] = {"name": "entrypoint", "dag": {"tasks": [
        {"name": "root-driver", "template": DAG_DRIVER, "arguments": {"parameters": [
            {"name": "component", "value": json.dumps(spec["root"])},
            {"name": "runtime-config", "value": json.dumps(runtime_config)}]}},
        {"name": "root", "template": "root", "dependencies": ["root-driver"]}]}}
    return {"apiVersion": "argoproj.io/v1alpha1", "kind": "Workflow",
            "metadata": {"generateName": f"{spec['pipelineInfo']['name']}-"},
            "spec": {"entrypoint": "entrypoint", "serviceAccountName": "pipeline-runner",
                     "templates": list(templates.values())}}


def task_step(wf: dict, task_name: str) -> tuple[dict, dict]:
    """(the executor step of ``task_name``, the template it runs) in ``wf``."""
    templates = {t["name"]: t for t in wf["spec"]["templates"]}
    for template in templates.values():
        for step in (template.get("dag") or {}).get("tasks", []):
            runs = templates[step["template"]]
            if step["name"] == task_name and runs.get("container", {}).get(
                    "image") == PLACEHOLDER_IMAGE:
                return step, runs
    raise KeyError(f"no executor step {task_name!r} in the Workflow")


def _substitute(value, arguments: dict):
    if isinstance(value, str):
        return _PARAM.sub(lambda m: arguments[m.group(1)], value)
    if isinstance(value, dict):
        return {_substitute(k, arguments): _substitute(v, arguments) for k, v in value.items()}
    if isinstance(value, list):
        return [_substitute(v, arguments) for v in value]
    return value


def executor_pod(wf: dict, task_name: str, name: str, namespace: str,
                 resources: dict | None = None) -> dict:
    """The pod Argo creates for ``task_name``'s executor step of ``wf``: the shared template
    with the task's arguments substituted, and the container driver's pod spec patch applied
    (its image is the one in the component's JSON; ``resources`` stands for limits the task
    set)."""
    step, template = task_step(wf, task_name)
    driver = next(s for t in wf["spec"]["templates"] for s in (t.get("dag") or {}).get(
        "tasks", []) if s["name"] == f"{task_name}-driver")
    container = json.loads(next(p["value"] for p in driver["arguments"]["parameters"]
                                if p["name"] == "container"))
    arguments = {p["name"]: p["value"] for p in step["arguments"]["parameters"]}
    workflow_name = wf["metadata"].get("name") or wf["metadata"]["generateName"] + "abc12"
    return _pod(template, arguments, container["image"], name, namespace, workflow_name,
                f"{workflow_name}.root.{task_name}", wf["spec"]["serviceAccountName"], resources)


def argo_pod(name: str, namespace: str, labels: dict | None, image: str,
             resources: dict | None = None) -> dict:
    """The pod of an executor step whose task passes ``labels`` (any, for probes): the same
    substitution into the shared template as :func:`executor_pod`."""
    labels = labels or {}
    template = _executor_template(len(labels))
    suffixes = [""] if len(labels) == 1 else [f"-{i}" for i in range(1, len(labels) + 1)]
    arguments = {}
    for suffix, (key, value) in zip(suffixes, sorted(labels.items()), strict=False):
        arguments.update({KEY + suffix: key, VALUE + suffix: value})
    return _pod(template, arguments, image, name, namespace, "sft-abc12", "sft-abc12.root.sft",
                "pipeline-runner", resources)


def _pod(template: dict, arguments: dict, image: str, name: str, namespace: str,
         workflow_name: str, node: str, service_account: str, resources: dict | None) -> dict:
    labels = _substitute((template.get("metadata") or {}).get("labels") or {}, arguments)
    main = {"name": "main", "image": image,
            "command": ["/var/run/argo/argoexec", "emissary", "--", "/kfp-launcher/launch"],
            "volumeMounts": [{"name": "var-run-argo", "mountPath": "/var/run/argo"},
                             {"name": "kfp-launcher", "mountPath": "/kfp-launcher"}]}
    if resources:
        main["resources"] = copy.deepcopy(resources)
    argo_mounts = [{"name": "var-run-argo", "mountPath": "/var/run/argo"}]
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {
        "name": name, "namespace": namespace,
        "labels": {"pipelines.kubeflow.org/v2_component": "true",
                   "workflows.argoproj.io/completed": "false",
                   "workflows.argoproj.io/workflow": workflow_name, **labels},
        "annotations": {"pipelines.kubeflow.org/v2_pipeline": "true",
                        "pipelines.kubeflow.org/runtime-role": "launcher",
                        "workflows.argoproj.io/node-name": node}},
        "spec": {
            "serviceAccountName": service_account,
            "initContainers": [
                {"name": "init", "image": ARGOEXEC_IMAGE, "command": ["argoexec", "init"],
                 "volumeMounts": argo_mounts},
                {**template["initContainers"][0], "volumeMounts": [
                    {"name": "kfp-launcher", "mountPath": "/kfp-launcher"}]},
            ],
            "containers": [
                {"name": "wait", "image": ARGOEXEC_IMAGE, "command": ["argoexec", "wait"],
                 "volumeMounts": argo_mounts},
                main,
            ],
            "volumes": [{"name": "var-run-argo", "emptyDir": {}},
                        {"name": "kfp-launcher", "emptyDir": {}}],
            "restartPolicy": "Never",
        }}


def labelled_tasks(compiled: Path | str | list[dict]) -> list[str]:
    """The tasks of ``compiled`` that run the shared executor template with pod metadata."""
    wf = workflow(compiled)
    templates = {t["name"]: t for t in wf["spec"]["templates"]}
    return sorted(step["name"] for t in templates.values()
                  for step in (t.get("dag") or {}).get("tasks", [])
                  if (templates[step["template"]].get("metadata") or {}).get("labels"))

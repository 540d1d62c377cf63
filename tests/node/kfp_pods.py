"""The executor pods of a compiled policy-mode pipeline, built as KFP 2.17 runs them, to run on
the real node of tests/node.

What KFP's backend would do is done here with KFP's own code where the SDK has it:

- each task's executor input (its parameters, its input artifacts from upstream tasks, the files
  its outputs go to) is built by ``kfp.local.executor_input_utils``, and the placeholders of the
  compiled command (``{{$}}`` and the rest) are filled by ``kfp.local.placeholder_utils``: the
  same code kfp.local runs for ``draslice run``;
- the task's outputs are read back from its ``executor_output.json`` by
  ``kfp.local.executor_output_utils`` and wired into the next task, as the driver would.

The pod itself is the executor pod's shape as the control-plane tests model it
(tests/realcluster/test_admission_policy.py): KFP's labels and annotations, the task's
``podMetadata`` labels from the compiled platform spec (the claim label in policy mode) and the
user container ``main`` running the compiled command on the trainer image. Argo's ``init`` and
``wait`` containers and KFP's launcher are left out (their images cannot be pulled here); in their
place the artifacts live on a PersistentVolumeClaim mounted at :data:`DATA`, where the launcher
would have copied them to and from object storage. The pod meets the ``restricted`` Pod Security
level: uid 1000 (the image's user), no privilege escalation, every capability dropped, the
runtime's default seccomp profile.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml
from google.protobuf import json_format
from kfp.local import executor_input_utils, executor_output_utils, placeholder_utils
from kfp.pipeline_spec import pipeline_spec_pb2

from draslice.cluster.names import CLAIM_LABEL

DATA = "/data"  # where the executor pods mount the run's volume
CONDITION = "comp-condition-1"  # the DAG the GPU tasks run in (after preflight's decision)

RESTRICTED = {
    "runAsNonRoot": True, "runAsUser": 1000, "runAsGroup": 1000,
    "allowPrivilegeEscalation": False, "capabilities": {"drop": ["ALL"]},
    "seccompProfile": {"type": "RuntimeDefault"},
}


@dataclass
class TaskPod:
    task: str
    pod: dict
    executor_input: pipeline_spec_pb2.ExecutorInput
    component: pipeline_spec_pb2.ComponentSpec
    host_root: Path  # the task's folder on the volume, as the node's host sees it


@dataclass
class CompiledRun:
    """One run of a compiled pipeline, task by task, on a volume the host can read."""

    path: Path
    run_id: str
    host_data: Path  # the volume's folder on the node's host
    claim: str = "data"  # the PersistentVolumeClaim mounted at DATA
    overrides: dict[str, Any] = field(default_factory=dict)
    outputs: dict[str, dict] = field(default_factory=dict)

    def __post_init__(self) -> None:
        docs = [d for d in yaml.safe_load_all(self.path.read_text()) if d]
        self.spec_dict = docs[0]
        self.spec = json_format.ParseDict(docs[0], pipeline_spec_pb2.PipelineSpec())
        platform = docs[1] if len(docs) > 1 else {}
        self.executors_platform = (platform.get("platforms", {}).get("kubernetes", {})
                                   .get("deploymentSpec", {}).get("executors", {}))

    # --- what the pipeline says ---------------------------------------------------------------

    def _task(self, name: str) -> dict:
        return self.spec_dict["components"][CONDITION]["dag"]["tasks"][name]

    def _root_value(self, channel: str) -> Any:
        """A value the condition's DAG receives, resolved to the pipeline parameter behind it."""
        source = self.spec_dict["root"]["dag"]["tasks"]["condition-1"]["inputs"]["parameters"][
            channel]
        name = source["componentInputParameter"]
        if name in self.overrides:
            return self.overrides[name]
        return self.spec_dict["root"]["inputDefinitions"]["parameters"][name]["defaultValue"]

    def arguments(self, task: str) -> dict[str, Any]:
        inputs = self._task(task).get("inputs", {})
        args: dict[str, Any] = {}
        for name, source in inputs.get("parameters", {}).items():
            if "runtimeValue" in source:
                args[name] = source["runtimeValue"]["constant"]
            elif "componentInputParameter" in source:
                args[name] = self._root_value(source["componentInputParameter"])
            else:
                ref = source["taskOutputParameter"]
                args[name] = self.outputs[ref["producerTask"]][ref["outputParameterKey"]]
        for name, source in inputs.get("artifacts", {}).items():
            ref = source["taskOutputArtifact"]
            args[name] = self.outputs[ref["producerTask"]][ref["outputArtifactKey"]]
        return args

    def labels(self, task: str) -> dict[str, str]:
        executor = self._task_executor(task)
        return dict(self.executors_platform.get(executor, {}).get("podMetadata", {})
                    .get("labels", {}))

    def _task_executor(self, task: str) -> str:
        comp = self._task(task)["componentRef"]["name"]
        return self.spec_dict["components"][comp]["executorLabel"]

    # --- the pod ------------------------------------------------------------------------------

    def pod(self, task: str, namespace: str, image: str) -> TaskPod:
        comp_name = self._task(task)["componentRef"]["name"]
        component = self.spec.components[comp_name]
        executor = self.spec.deployment_spec.fields["executors"].struct_value.fields[
            self._task_executor(task)].struct_value.fields["container"].struct_value
        command = [v.string_value for v in executor.fields["command"].list_value.values]
        command += [v.string_value for v in executor.fields["args"].list_value.values]
        pipeline_name = self.spec.pipeline_info.name
        task_root = f"{DATA}/{self.run_id}/{task}"
        executor_input = executor_input_utils.construct_executor_input(
            component_spec=component, arguments=self.arguments(task), task_root=task_root,
            block_input_artifact=False)
        resolved = placeholder_utils.replace_placeholders(
            full_command=command,
            executor_input_dict=executor_input_utils.executor_input_to_dict(
                executor_input, component),
            pipeline_resource_name=f"{pipeline_name}-{self.run_id}",
            task_resource_name=task, pipeline_root=DATA, unique_pipeline_id=self.run_id)
        labels = {"pipelines.kubeflow.org/v2_component": "true",
                  "workflows.argoproj.io/completed": "false",
                  "workflows.argoproj.io/workflow": f"{pipeline_name}-{self.run_id}",
                  **self.labels(task)}
        meta = {"name": f"{task}-{self.run_id}", "namespace": namespace, "labels": labels,
                "annotations": {"pipelines.kubeflow.org/v2_pipeline": "true",
                                "pipelines.kubeflow.org/runtime-role": "launcher",
                                "workflows.argoproj.io/node-name":
                                    f"{pipeline_name}-{self.run_id}.root.{task}"}}
        pod = {"apiVersion": "v1", "kind": "Pod", "metadata": meta, "spec": {
            "restartPolicy": "Never", "terminationGracePeriodSeconds": 5,
            "automountServiceAccountToken": False,
            "securityContext": {"runAsNonRoot": True, "fsGroup": 1000,
                                "seccompProfile": {"type": "RuntimeDefault"}},
            "containers": [{"name": "main", "image": image, "imagePullPolicy": "Never",
                            "command": resolved[:1], "args": resolved[1:],
                            "env": [{"name": "DRASLICE_RUN_ID", "value": self.run_id}],
                            "securityContext": RESTRICTED,
                            "volumeMounts": [{"name": "data", "mountPath": DATA}]}],
            "volumes": [{"name": "data", "persistentVolumeClaim": {"claimName": self.claim}}],
        }}
        host_root = self.host_data / self.run_id / task
        return TaskPod(task, pod, executor_input, component, host_root)

    def collect(self, task_pod: TaskPod) -> dict:
        """The task's outputs, read from what its executor wrote, kept for the next tasks."""
        out_file = task_pod.host_root / "executor_output.json"
        executor_output = executor_output_utils.load_executor_output(str(out_file))
        outputs = executor_output_utils.get_outputs_from_executor_output(
            executor_output=executor_output, executor_input=task_pod.executor_input,
            component_spec=task_pod.component)
        self.outputs[task_pod.task] = outputs
        return outputs


def claim_label(pod: dict) -> str | None:
    return pod["metadata"]["labels"].get(CLAIM_LABEL)


def dumps(obj: Any) -> str:
    return json.dumps(obj, default=str)

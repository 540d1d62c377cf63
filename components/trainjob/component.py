"""Fine-tune as a Kubeflow Trainer v2 TrainJob: several slices or GPUs, torchrun in each pod.

The step runs without a claim: it creates the TrainJob (components/trainjob/launch.py), whose
pods claim the slices, waits for it, and copies what rank 0 wrote on the volume into the
``adapter`` Model, so the rest of a pipeline reads it as it reads the finetune step's.

No ``from __future__ import annotations``: kfp reads the signature's types.
"""

from typing import NamedTuple

from kfp import dsl
from kfp.dsl import Markdown, Model, Output

from draslice.components.image import TRAINER_IMAGE
from draslice.components.knob_docs import with_input_docs

NOT_KNOBS = {
    "claim_template": "The ResourceClaimTemplate each trainer pod claims; its TrainingRuntime "
                      "(`draslice manifests workloads --kind trainjob`) must be installed.",
    "adapter": "What the TrainJob wrote (adapter/, metrics.jsonl, run facts), copied from the "
               "volume.",
    "report": "The TrainJob, its shape and how it ended, for the KFP UI.",
    "num_nodes": "Trainer pods, each with its own claim from claim_template.",
    "num_proc_per_node": "torchrun processes per pod; 0: one per device the template gives a "
                         "pod (gpus-K: K, else 1).",
    "pvc_name": "The volume with the model, data, checkpoints and outputs, mounted on every "
                "trainer pod and on this step (ReadWriteMany when pods run on several nodes).",
    "mount_path": "Where the volume is mounted: relative model_dir, data and checkpoint_dir "
                  "are taken under it.",
    "run_id": "The pipeline run: names the TrainJob and its folders on the volume, so a "
              "retried step waits for the same TrainJob and a retried job resumes.",
    "namespace": "Namespace of the TrainJob; empty: this pod's own.",
    "kueue_queue": "Kueue LocalQueue the TrainJob joins (Kueue's queue-name label on it); "
                   "empty: none.",
    "timeout_minutes": "The TrainJob is deleted, and the step fails, when it has not ended by "
                       "then.",
}


def trainjob(
    claim_template: str,
    adapter: Output[Model],
    report: Output[Markdown],
    num_nodes: int = 1,
    num_proc_per_node: int = 0,
    pvc_name: str = "draslice-data",
    mount_path: str = "/data",
    run_id: str = "",
    namespace: str = "",
    kueue_queue: str = "",
    timeout_minutes: int = 1440,
    model_dir: str = "",
    data: str = "",
    data_format: str = "auto",
    max_length: int = 512,
    pack: bool = False,
    eval_fraction: float = 0.0,
    gradient_checkpointing: bool = False,
    offload_activations: bool = False,
    tile_mlp: bool = False,
    bf16_weights: bool = False,
    load_in_4bit: bool = False,
    lora_r: int = 8,
    lora_alpha: int = 16,
    lora_targets: str = "auto",
    batch_size: int = 8,
    steps: int = 30,
    learning_rate: float = 3e-3,
    lr_schedule: str = "constant",
    warmup_steps: int = 0,
    checkpoint_every: int = 0,
    checkpoint_dir: str = "",
    merge: bool = False,
    seed: int = 0,
    device: str = "auto",
    precision: str = "auto",
    slice_memory_gib: float = 0.0,
    compile: str = "auto",
) -> NamedTuple("TrainJobOutputs", job=str, state=str):
    """Runs the fine-tune as a Trainer v2 TrainJob of num_nodes pods and waits for it.

    Returns:
        job: The TrainJob's namespace/name.
        state: How it ended (Complete; Failed and time-outs fail the step).
    """
    inputs = dict(locals())  # first: every input by name, the knobs among them
    import os
    import shutil
    from collections import namedtuple

    from kubernetes import client

    from draslice.cluster.live import api_client, pod_namespace
    from draslice.components.trainjob.launch import RUNS_DIR, job_name, launch

    def under_mount(path: str) -> str:
        return path if not path or os.path.isabs(path) else os.path.join(mount_path, path)

    own = set(NOT_KNOBS)
    knobs = {k: v for k, v in inputs.items() if k not in own}
    name = job_name(run_id)
    knobs.update(model_dir=under_mount(model_dir), data=under_mount(data),
                 checkpoint_dir=(os.path.join(under_mount(checkpoint_dir), name)
                                 if checkpoint_dir else ""))
    out_dir = os.path.join(mount_path, RUNS_DIR, name)
    ns = namespace or pod_namespace() or "default"
    api = client.CustomObjectsApi(api_client())
    job = launch(api, claim_template, ns, run_id, knobs, num_nodes, num_proc_per_node or None,
                 (pvc_name, mount_path), timeout_minutes * 60.0, output_dir=out_dir,
                 queue=kueue_queue or None)
    shutil.copytree(out_dir, adapter.path, dirs_exist_ok=True)
    trainer = job["spec"]["trainer"]
    adapter.metadata.update({"framework": "peft", "lora_r": lora_r, "trainjob": f"{ns}/{name}",
                             "num_nodes": trainer["numNodes"],
                             "num_proc_per_node": trainer["numProcPerNode"]})
    metrics_file = os.path.join(out_dir, "metrics.jsonl")  # what `draslice train` writes
    last = ""
    if os.path.isfile(metrics_file):
        with open(metrics_file) as f:
            lines = [line for line in f.read().splitlines() if line.strip()]
        last = lines[-1] if lines else ""
    with open(report.path, "w") as f:
        f.write(f"# TrainJob {ns}/{name}: Complete\n\n"
                f"{trainer['numNodes']} pod(s) × {trainer['numProcPerNode']} process(es), "
                f"each pod claiming `{claim_template}`; outputs copied from `{out_dir}`.\n")
        if last:
            f.write(f"\nLast metrics line:\n\n```json\n{last}\n```\n")
    print(f"TrainJob {ns}/{name}: Complete; outputs in {out_dir}")
    return namedtuple("TrainJobOutputs", ["job", "state"])(f"{ns}/{name}", "Complete")


trainjob = dsl.component(base_image=TRAINER_IMAGE, install_kfp_package=False)(
    with_input_docs(trainjob, NOT_KNOBS))

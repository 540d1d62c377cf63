"""``draslice manifests``: everything a cluster admin installs, rendered as YAML.

Each subcommand prints YAML to stdout (pipe it to ``kubectl apply -f -``) or, with
``--out DIR``, writes a file there. ``draslice manifests all --out manifests`` regenerates the
committed set.
"""

from __future__ import annotations

from pathlib import Path

import click

from draslice.errors import InvalidParameter

_OUT = click.option("--out", "out_dir", default=None, type=click.Path(file_okay=False),
                    help="Write the YAML into this folder instead of printing it.")
_NS_HELP = "Namespace of the KFP runs (KFP single-user: kubeflow; multi-user: the profile)."


def _emit(out_dir: str | None, filename: str, text: str) -> None:
    if out_dir is None:
        click.echo(text, nl=False)
        return
    from draslice.cluster.manifests import yamlio

    for path in yamlio.write(out_dir, {filename: text}):
        click.echo(str(path))


@click.group("manifests")
def manifests() -> None:
    """Render the cluster objects draslice needs: claim templates, RBAC, admission policy.

    \b
    Install order (see the README's admin section):
      1. NVIDIA DRA driver and its DeviceClasses
      2. draslice preflight                      (does the cluster publish slices?)
      3. draslice manifests claim-templates ...  | kubectl apply -f -
      4. draslice manifests rbac                 | kubectl apply -f -
      5. draslice manifests admission-policy ... | kubectl apply -f -   (policy claim mode)
      6. draslice manifests kueue                (optional quota on slices)
    """


@manifests.command("claim-templates")
@click.option("--profile", "profiles", multiple=True, metavar="PROFILE",
              help="MIG profile exactly as the driver publishes it (repeatable), e.g. 1g.6gb.")
@click.option("--shared", "shared", multiple=True, metavar="timeslicing|mps",
              help="A whole GPU shared by time-slicing or MPS (repeatable).")
@click.option("--interval", default=None,
              help="Time-slice interval for --shared timeslicing: Default, Short, Medium, Long.")
@click.option("--active-thread-percentage", type=int, default=None,
              help="MPS: default active thread percentage (1-100).")
@click.option("--pinned-memory-limit", default=None,
              help="MPS: default pinned device memory limit, a quantity such as 10Gi.")
@click.option("--gpus", "gpu_counts", multiple=True, type=int, metavar="K",
              help="K whole GPUs in one pod, template gpus-K (repeatable): torchrun with K "
                   "processes in a pod.")
@click.option("--namespace", default="kubeflow", show_default=True, help=_NS_HELP)
@_OUT
def claim_templates_cmd(profiles, shared, interval, active_thread_percentage,
                        pinned_memory_limit, gpu_counts, namespace, out_dir) -> None:
    """ResourceClaimTemplates: one MIG slice per pod, a shared full GPU, or K whole GPUs.

    A MIG template is named after its profile (1g.6gb -> mig-1g-6gb) and selects devices
    with CEL on the published profile attribute; a shared template asks the NVIDIA driver for
    TimeSlicing or MPS through an opaque GpuConfig. Read the exact profile strings of your
    cluster with `draslice preflight` first.

    \b
    Examples:
      draslice manifests claim-templates --profile 1g.6gb | kubectl apply -f -
      draslice manifests claim-templates --profile 1g.6gb --profile 2g.12gb --namespace team-a
      draslice manifests claim-templates --shared timeslicing --interval Long
      draslice manifests claim-templates --gpus 2 --gpus 8
      draslice manifests claim-templates --shared mps --active-thread-percentage 50 \\
          --pinned-memory-limit 10Gi
    """
    from draslice.cluster.manifests import yamlio
    from draslice.cluster.manifests.claim_templates import claim_templates, sharing_from_options

    for mode in shared:
        if mode not in ("timeslicing", "mps"):
            raise InvalidParameter("shared", mode, "must be timeslicing or mps")
    if interval is not None and "timeslicing" not in shared:
        raise InvalidParameter("interval", interval, "needs --shared timeslicing")
    mps_opts = active_thread_percentage is not None or pinned_memory_limit is not None
    if mps_opts and "mps" not in shared:
        raise InvalidParameter(
            "shared", list(shared),
            "--active-thread-percentage and --pinned-memory-limit need --shared mps",
        )
    sharings = [
        sharing_from_options("timeslicing", interval=interval) if mode == "timeslicing"
        else sharing_from_options("mps", active_thread_percentage=active_thread_percentage,
                                  pinned_memory_limit=pinned_memory_limit)
        for mode in shared
    ]
    docs = claim_templates(profiles, sharings, namespace, gpu_counts)
    _emit(out_dir, "claim-templates.yaml", yamlio.dump(docs))


@manifests.command("rbac")
@click.option("--namespace", default="kubeflow", show_default=True, help=_NS_HELP)
@click.option("--service-account", default="pipeline-runner", show_default=True,
              help="Service account KFP runs task pods as; KFP multi-user uses default-editor.")
@click.option("--trainjobs", is_flag=True,
              help="Instead: the Role the finetune-trainjob pipelines' step needs (create, get "
                   "and delete Kubeflow Trainer TrainJobs in the namespace).")
@_OUT
def rbac_cmd(namespace: str, service_account: str, trainjobs: bool, out_dir: str | None) -> None:
    """Read-only DRA access for the KFP service account, and nothing more.

    A ClusterRole + ClusterRoleBinding for deviceclasses and resourceslices, and a Role +
    RoleBinding in the namespace for resourceclaims and resourceclaimtemplates; get, list and
    watch only (what the preflight step reads).

    \b
    Examples:
      draslice manifests rbac | kubectl apply -f -
      draslice manifests rbac --namespace team-a --service-account default-editor
      draslice manifests rbac --trainjobs | kubectl apply -f -
    """
    from draslice.cluster.manifests import rbac, yamlio

    if trainjobs:
        _emit(out_dir, "rbac-trainjob.yaml",
              yamlio.dump(rbac.trainjob_rbac(namespace, service_account)))
        return
    _emit(out_dir, "rbac.yaml", yamlio.dump(rbac.rbac(namespace, service_account)))


@manifests.command("admission-policy")
@click.option("--engine", required=True, metavar="ENGINE",
              help="map-v1 (Kubernetes 1.36+), map-v1beta1 (1.34-1.35), kyverno "
                   "(Kyverno MutatingPolicy, policies.kyverno.io/v1) or kyverno-clusterpolicy "
                   "(Kyverno ClusterPolicy, older Kyverno).")
@click.option("--namespace", default="kubeflow", show_default=True,
              help="Namespace to print the opt-in command for.")
@_OUT
def admission_policy_cmd(engine: str, namespace: str, out_dir: str | None) -> None:
    """The policy that gives labelled KFP task pods their claim (policy claim mode).

    Pods created in namespaces labelled draslice.dev/claim-injection=enabled that carry the
    label draslice.dev/claim-template=<template> and have a container `main` get
    spec.resourceClaims [{name: <template>, resourceClaimTemplateName: <template>}] and
    `main` gets resources.claims [{name: <template>}]: the pod native mode produces. CREATE
    only, idempotent, failurePolicy Fail. The opt-in command is printed on stderr.

    \b
    Examples:
      draslice manifests admission-policy --engine map-v1 | kubectl apply -f -
      kubectl label namespace kubeflow draslice.dev/claim-injection=enabled
      draslice manifests admission-policy --engine kyverno --out manifests/
    """
    from draslice.cluster.manifests import admission, yamlio
    from draslice.cluster.names import validate_dns_label

    validate_dns_label(namespace, "namespace")
    docs = admission.admission_policy(engine)
    _emit(out_dir, f"admission-policy.{engine}.yaml", yamlio.dump(docs))
    click.echo(f"# opt a namespace in: {admission.opt_in_command(namespace)}", err=True)


@manifests.command("workloads")
@click.option("--template", default="mig-1g-6gb", show_default=True,
              help="Claim template the pods claim (install it with claim-templates).")
@click.option("--namespace", default="kubeflow", show_default=True,
              help="Namespace of the pods (the claim template must be there too).")
@click.option("--image", default=None, help="Trainer image (default: the one the pipelines use).")
@click.option("--kind", "kinds", multiple=True,
              type=click.Choice(["smoke-pod", "job", "trainjob"]),
              help="Only these (repeatable); default all three.")
@click.option("--num-nodes", type=int, default=1, show_default=True,
              help="trainjob: pods, each with its own claim from --template.")
@click.option("--num-proc-per-node", type=int, default=None,
              help="trainjob: torchrun processes per pod; one per device the template gives a "
                   "pod (gpus-K: K, else 1), which is the default.")
@_OUT
def workloads_cmd(template: str, namespace: str, image: str | None, kinds, num_nodes,
                  num_proc_per_node, out_dir) -> None:
    """Run the smoke test or the SFT outside KFP on the same image and claim.

    smoke-pod: the GPU-slicing guide's smoke Pod (`draslice smoke`, label app=dra-smoke). job: a
    batch Job running `draslice train` (adapt its pod template for Volcano). trainjob: a
    Kubeflow Trainer v2 TrainingRuntime + TrainJob running `draslice train` under torchrun,
    --num-nodes pods of --num-proc-per-node processes (docs/trainjob.md).

    \b
    Examples:
      draslice manifests workloads --kind smoke-pod | kubectl create -f -
      kubectl -n kubeflow logs -l app=dra-smoke --tail=40
      draslice manifests workloads --template mig-2g-12gb --kind trainjob --namespace team-a
      draslice manifests workloads --template mig-1g-6gb --kind trainjob --num-nodes 4
      draslice manifests workloads --template gpus-2 --kind trainjob
    """
    from draslice.cluster.manifests import workloads, yamlio
    from draslice.components.image import trainer_image

    rendered = workloads.workloads(template, trainer_image(image), namespace, num_nodes,
                                   num_proc_per_node)
    chosen = [k for k in rendered if not kinds or k in kinds]
    if out_dir is None:
        click.echo(yamlio.dump([d for k in chosen for d in rendered[k]]), nl=False)
        return
    for kind in chosen:
        _emit(out_dir, f"workload.{kind}.yaml", yamlio.dump(rendered[kind]))


@manifests.command("kueue")
@click.option("--namespace", default="kubeflow", show_default=True,
              help="Namespace of the LocalQueue (where the runs are).")
@click.option("--queue", default="gpu-slices", show_default=True, help="LocalQueue name.")
@click.option("--mig-slices", type=int, default=4, show_default=True,
              help="Quota: MIG slices (mig.nvidia.com devices) admitted at once (0 to "
                   "1,000,000).")
@click.option("--shared-gpus", type=int, default=2, show_default=True,
              help="Quota: shared whole GPUs (gpu.nvidia.com devices) admitted at once (0 to "
                   "1,000,000).")
@click.option("--config", "config_only", is_flag=True,
              help="Print the deviceClassMappings fragment of Kueue's Configuration instead.")
@_OUT
def kueue_cmd(namespace, queue, mig_slices, shared_gpus, config_only, out_dir) -> None:
    """Kueue quota on slices: ResourceFlavor, ClusterQueue, LocalQueue (Kueue v0.15+).

    The ClusterQueue quotas logical resources that Kueue's Configuration maps to
    DeviceClasses (resources.deviceClassMappings, feature gate DynamicResourceAllocation);
    `--config` prints that fragment to merge into kueue-manager-config. Compile pipelines
    whose GPU tasks join the queue with `draslice compile --kueue-queue NAME --out DIR`.

    \b
    Examples:
      draslice manifests kueue --config      # merge into Kueue's Configuration
      draslice manifests kueue --namespace team-a --mig-slices 8 | kubectl apply -f -
    """
    from draslice.cluster.manifests import kueue, yamlio

    if config_only:
        _emit(out_dir, "kueue-config.yaml", yamlio.dump([kueue.configuration_fragment()]))
        return
    docs = kueue.queues(namespace, queue, mig_slices, shared_gpus)
    _emit(out_dir, "kueue.yaml", yamlio.dump(docs))


@manifests.command("all")
@click.option("--out", "out_dir", default="manifests", show_default=True,
              type=click.Path(file_okay=False), help="Folder to write the committed set into.")
@click.option("--image", default=None, help="Trainer image (default: the one the pipelines use).")
def all_cmd(out_dir: str, image: str | None) -> None:
    """Write the whole committed set (byte-for-byte reproducible) into --out.

    For KFP single-user defaults: namespace kubeflow, service account pipeline-runner,
    templates mig-1g-6gb, mig-2g-12gb, shared-gpu-timeslice, shared-gpu-mps.

    \b
    Example:
      draslice manifests all --out manifests
    """
    from draslice.cluster.manifests import committed, yamlio
    from draslice.components.image import trainer_image

    files = committed.files(trainer_image(image))
    paths = yamlio.write(out_dir, files)
    click.echo(f"wrote {len(paths)} files into {Path(out_dir)}/")
    for p in paths:
        click.echo(f"  {p}")

"""``draslice preflight``: can a slice be allocated? The scheduler's answer, before submitting."""

from __future__ import annotations

import sys

import click

from draslice.cli.error_output import JsonErrorCommand
from draslice.cluster.allocator import NEWEST, SUPPORTED
from draslice.errors import InvalidParameter


class _PreflightCommand(JsonErrorCommand):
    """Errors in JSON mode keep the report's keys (docs/preflight.md): ``decision`` is
    ``error`` and ``reason`` the message."""

    def json_error(self, payload: dict) -> dict:
        return {"decision": "error", **payload, "reason": payload["error"]}


@click.command("preflight", cls=_PreflightCommand)
@click.option("--snapshot", "snapshot_file", type=click.Path(dir_okay=False),
              help="Read a dump instead of the cluster: the output of `kubectl get deviceclasses,"
                   "resourceslices,resourceclaims,resourceclaimtemplates -A -o yaml` (or -o json, "
                   "read far faster for a big cluster; add `kubectl get nodes,ds -A -o yaml` "
                   "for the plugin diagnosis).")
@click.option("--template", "template_name",
              help="A ResourceClaimTemplate by name, read from the cluster (or the snapshot).")
@click.option("--template-file", type=click.Path(dir_okay=False),
              help="A ResourceClaimTemplate (or ResourceClaim) YAML file to evaluate.")
@click.option("--profile", help="Evaluate the template `draslice manifests` renders for this MIG "
                                "profile, e.g. 1g.10gb (exact string as published).")
@click.option("--shared", type=click.Choice(["timeslicing", "mps"]),
              help="Evaluate the shared full-GPU template (time-slicing or MPS).")
@click.option("--gpus", type=int, metavar="K",
              help="Evaluate the template for K whole GPUs in one pod (gpus-K): do K fit on "
                   "one node?")
@click.option("--pods", type=int, metavar="N",
              help="N pods, each its own claim from the template (a TrainJob's numNodes): "
                   "placed one after another, each against the allocations before it.")
@click.option("--namespace", "-n", default="", help="Namespace of --template (and of the "
              "claims, if you may not list them cluster-wide). Default: any namespace.")
@click.option("--on-missing-dra", type=click.Choice(["skip", "fail"]), default="skip",
              show_default=True,
              help="No DRA GPU at all in the cluster: exit 77 (skip) or 1 (fail).")
@click.option("--kubernetes-version", metavar="|".join(SUPPORTED),
              help="Decide with the DRA allocator of this Kubernetes release (default: the "
                   f"live cluster's own version, clamped to {SUPPORTED[0]}-{NEWEST}; for a "
                   f"snapshot, {NEWEST}).")
@click.option("--json", "as_json", is_flag=True,
              help="Print the report as JSON (docs/preflight.md); errors too, as "
                   "{\"decision\": \"error\", ...}.")
@click.option("--kubeconfig", type=click.Path(dir_okay=False),
              help="Kubeconfig file for the live read (default: $KUBECONFIG, ~/.kube/config, "
                   "or the pod's service account).")
@click.option("--context", help="Kubeconfig context for the live read.")
def preflight(snapshot_file, template_name, template_file, profile, shared, gpus, pods,
              namespace, on_missing_dra, kubernetes_version, as_json, kubeconfig,
              context) -> None:
    """Check that the cluster can allocate a GPU slice, the way the scheduler would decide.

    Reads DeviceClasses, ResourceSlices (v1, v1beta2, v1beta1, v1alpha3), ResourceClaims and
    ResourceClaimTemplates from the cluster (kubeconfig or in-cluster) or from --snapshot.
    The scheduler's own DRA allocator (k8s.io/dynamic-resource-allocation of the chosen
    Kubernetes release) decides whether the claim can be allocated now, and where. Prints the
    pools, the inventory per node (type, MIG profile, product, memory) and, for a claim
    template, how many devices match its DeviceClass and CEL selectors and how many of those
    are free. A diagnosis says what to fix.

    \b
    Exit codes:
      0   ready: a node can serve the claim now
      77  skip: no DRA GPU at all and --on-missing-dra skip
      1   fail: cannot be allocated (see the diagnosis), or the cluster cannot be read
      2   bad input (option, file, a selector that does not compile, an object
          the allocator refuses, no allocator binary)

    \b
    Examples:
      draslice preflight                                  # live cluster, inventory only
      draslice preflight --profile 1g.10gb                # a MIG slice of 1g.10gb
      draslice preflight --template mig-1g-10gb -n kubeflow
      draslice preflight --snapshot dump.yaml --shared timeslicing --json
      draslice preflight --profile 1g.6gb --pods 4      # a TrainJob of 4 pods, a slice each
      draslice preflight --gpus 4                       # 4 whole GPUs in one pod
      kubectl get deviceclasses,resourceslices,resourceclaims,resourceclaimtemplates \\
          -A -o yaml > dump.yaml
    """
    from draslice.cluster.preflight import (
        built_template,
        cluster_preflight,
        read_snapshot,
        template_from_cluster,
        template_from_file,
    )
    if kubernetes_version is not None:
        from draslice.cluster.allocator import check_version

        kubernetes_version = check_version(kubernetes_version)
    chosen = [n for n, v in (("--template", template_name), ("--template-file", template_file),
                             ("--profile", profile), ("--shared", shared), ("--gpus", gpus))
              if v is not None]
    if len(chosen) > 1:
        raise InvalidParameter("template", " ".join(chosen), "give at most one of them")
    if template_name is not None and not template_name:
        raise InvalidParameter("template", template_name, "must name a ResourceClaimTemplate")
    template = None
    if template_file is not None:
        template = template_from_file(template_file)
    elif gpus is not None:
        from draslice.cluster.templates import gpus_claim_template

        template = gpus_claim_template(gpus, namespace=namespace or None)
    elif profile is not None or shared is not None:
        template = built_template(profile, shared, namespace)
    if pods is not None:
        from draslice.cluster.pods import check_pods

        check_pods(pods)
        if template is None and not template_name:
            raise InvalidParameter("pods", pods, "needs a template: --template, "
                                   "--template-file, --profile, --shared or --gpus")
    snapshot = read_snapshot(snapshot_file or "live", namespace or None, kubeconfig, context,
                             progress=lambda line: click.echo(line, err=True))
    if template_name:
        template = template_from_cluster(snapshot, template_name, namespace or None)
    from draslice.cluster.render import to_json, to_text

    if pods is not None and template is not None:
        from draslice.cluster.pods import pods_preflight

        report = pods_preflight(snapshot, template, pods, lambda snap, t: cluster_preflight(
            snap, t, on_missing_dra, kubernetes_version))
    else:
        report = cluster_preflight(snapshot, template, on_missing_dra, kubernetes_version)
    if template_name and report.template is None:
        report.template = template_name
    click.echo(to_json(report) if as_json else to_text(report), nl=False)
    if as_json:
        click.echo("")
    sys.exit(report.exit_code)

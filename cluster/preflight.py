"""Preflight: decide ``ready`` / ``skip`` / fail before any GPU step claims a slice.

Two ways in, one decision:

- :func:`cluster_preflight` (``draslice preflight`` and the pipeline's preflight task in a pod,
  or with a snapshot file): reads the DRA objects (live or from a dump), takes the claim
  template (from the cluster, a file, or built from a profile) and evaluates it like the
  scheduler would (analysis.py);
- the local check (``source="none"``, or ``"auto"`` outside a pod): a ``kfp.local`` run makes
  no claim, so only the template name and this machine's GPU are checked.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from draslice.cluster.names import validate_template_name
from draslice.errors import DrasliceError, InvalidParameter

READY = "ready"
SKIP = "skip"
ON_MISSING_DRA = ("skip", "fail")
SHARED_STRATEGIES = {"timeslicing": "TimeSlicing", "mps": "MPS"}


class PreflightFailed(DrasliceError):
    exit_code = 1


@dataclass
class PreflightResult:
    decision: str
    reason: str
    facts: dict = field(default_factory=dict)
    details: str = ""  # the full report as text, when the cluster was read

    def text(self) -> str:
        if self.details:
            return self.details
        lines = [f"preflight: {self.decision} — {self.reason}"]
        lines += [f"  {k}: {v}" for k, v in self.facts.items()]
        return "\n".join(lines)

    def markdown(self) -> str:
        if self.details:
            return (f"# preflight: {self.decision}\n\n{self.reason}\n\n```text\n{self.details}"
                    "```\n")
        rows = "\n".join(f"| {k} | {v} |" for k, v in self.facts.items())
        return (
            f"# preflight: {self.decision}\n\n{self.reason}\n\n| check | result |\n| --- | --- |\n"
            f"{rows}\n"
        )


def in_cluster() -> bool:
    return bool(os.environ.get("KUBERNETES_SERVICE_HOST"))


def check_on_missing_dra(value: str) -> str:
    if value not in ON_MISSING_DRA:
        raise InvalidParameter("on_missing_dra", value, "must be 'skip' or 'fail'")
    return value


# --- where the objects and the template come from --------------------------------------------

def read_snapshot(source: str, namespace: str | None = None, kubeconfig: str | None = None,
                  context: str | None = None, progress: Callable[[str], None] | None = None):
    """``source``: a snapshot file path, or ``"live"`` for the cluster; ``progress`` hears how
    a long read of a file goes, or of a GET the cluster is slow to answer."""
    if source == "live":
        from draslice.cluster.live import api_client, read_cluster

        return read_cluster(api_client(kubeconfig, context), namespace, progress)
    from draslice.cluster.snapshot import load_snapshot

    return load_snapshot(source, progress)


def template_from_file(path: str | Path) -> dict:
    path = Path(path)
    try:
        docs = [d for d in yaml.safe_load_all(path.read_text()) if d]
    except OSError as exc:
        raise InvalidParameter("template_file", str(path), f"cannot read: {exc.strerror}") from None
    except yaml.YAMLError as exc:
        raise InvalidParameter("template_file", str(path), f"not valid YAML: {exc}") from None
    found = [d for d in docs if isinstance(d, dict)
             and d.get("kind") in ("ResourceClaimTemplate", "ResourceClaim")]
    if len(found) != 1:
        raise InvalidParameter(
            "template_file", str(path),
            f"must hold exactly one ResourceClaimTemplate (or ResourceClaim); found {len(found)}",
        )
    return found[0]


def built_template(profile: str | None, shared: str | None, namespace: str | None) -> dict:
    """The template ``draslice manifests`` renders for a profile or a sharing strategy."""
    from draslice.cluster.templates import Sharing, mig_claim_template, shared_gpu_claim_template

    if profile is not None:
        return mig_claim_template(profile, namespace=namespace or None)
    if shared not in SHARED_STRATEGIES:
        raise InvalidParameter("shared", shared, f"must be one of {sorted(SHARED_STRATEGIES)}")
    return shared_gpu_claim_template(Sharing(strategy=SHARED_STRATEGIES[shared]),
                                     namespace=namespace or None)


def template_from_cluster(snapshot, name: str, namespace: str | None) -> dict | None:
    """The named template, or None where the cluster has no DRA (the decision is skip/fail)."""
    validate_template_name(name)
    found = snapshot.template(name, namespace)
    if found is not None or not snapshot.dra_api:
        return found
    if not snapshot.device_classes and not snapshot.slices:
        return None  # no DRA objects at all: the analysis decides skip or fail
    where = f"namespace {namespace}" if namespace else "any namespace"
    present = sorted(
        f"{t['metadata'].get('namespace', '')}/{t['metadata']['name']}" for t in snapshot.templates
    )
    unread = "".join(f"; {n}" for n in snapshot.notes if "templates not read" in n)
    raise PreflightFailed(
        f"ResourceClaimTemplate {name} not found in {where} of {snapshot.source} "
        f"(present: {', '.join(present) or 'none'}{unread}); render and apply it with "
        "`draslice manifests`, or check it with --profile/--shared/--template-file"
    )


def kubernetes_release(snapshot, asked: str | None) -> tuple[str, str | None]:
    """The release whose allocator decides, and a note when it is not what the user expects:
    ``asked`` (``--kubernetes-version``) if given; else a live cluster's own version, clamped
    to the supported range; else the newest supported."""
    from draslice.cluster import allocator

    if asked:
        return allocator.check_version(asked), None
    if getattr(snapshot, "server_version", None):
        return allocator.clamp_version(snapshot.server_version)
    return allocator.NEWEST, None


def cluster_preflight(snapshot, template: dict | None, on_missing_dra: str = "skip",
                      kubernetes_version: str | None = None):
    """The scheduler's view: a :class:`~draslice.cluster.report.PreflightReport`, decided by
    the allocator of the chosen Kubernetes release."""
    from draslice.cluster.analysis import analyze

    check_on_missing_dra(on_missing_dra)
    version, note = kubernetes_release(snapshot, kubernetes_version)
    report = analyze(snapshot, template, on_missing_dra, version)
    if note:
        report.notes.append(note)
    return report


# --- the pipeline's preflight task -----------------------------------------------------------

def run_preflight(
    claim_template: str, on_missing_dra: str = "skip", source: str = "auto", namespace: str = ""
) -> PreflightResult:
    """The preflight task: ``source`` is ``auto`` (the cluster when in a pod, else the local
    check), ``none`` (local check only) or a snapshot file. Raises :class:`PreflightFailed`
    to fail the run; returns ``ready`` or ``skip``."""
    check_on_missing_dra(on_missing_dra)
    validate_template_name(claim_template)
    if source == "none" or (source == "auto" and not in_cluster()):
        return _local_check(claim_template)
    if source == "auto":
        from draslice.cluster.live import pod_namespace

        snapshot = read_snapshot("live", namespace or pod_namespace(),
                                 progress=lambda line: print(line, flush=True))
        namespace = namespace or pod_namespace() or ""
    else:
        if not Path(source).is_file():
            raise InvalidParameter(
                "preflight_source", source, "must be auto, none or the path of a snapshot file"
            )
        snapshot = read_snapshot(source, progress=lambda line: print(line, flush=True))
    from draslice.cluster.render import to_text

    template = template_from_cluster(snapshot, claim_template, namespace or None)
    report = cluster_preflight(snapshot, template, on_missing_dra)
    if report.template is None:
        report.template = claim_template
    text = to_text(report)
    if report.decision not in (READY, SKIP):
        raise PreflightFailed(f"preflight failed: {report.reason}\n{text}")
    return PreflightResult(decision=report.decision, reason=report.reason,
                           facts={"source": report.source}, details=text)


def _local_check(claim_template: str) -> PreflightResult:
    from draslice.trainer.device import nvidia_smi_list

    smi = nvidia_smi_list()
    facts = {
        "claim template": claim_template,
        "where": "task pod in a cluster" if in_cluster() else "local run (no cluster)",
        "nvidia-smi here": (smi.splitlines()[0] if smi else "not present"),
    }
    if in_cluster():
        reason = (
            "template name valid; the scheduler allocates the claim when the GPU steps start"
        )
    else:
        reason = "local run: the GPU steps use this machine's device, no claim is made"
    return PreflightResult(decision=READY, reason=reason, facts=facts)

"""Least-privilege RBAC for the service account KFP runs task pods as.

The preflight step reads DeviceClasses and ResourceSlices (cluster-scoped) and
ResourceClaims and ResourceClaimTemplates (in the run's namespace); that is all it needs, so
that is all it gets: get/list/watch, nothing that writes. Task pods do not create claims
themselves: the scheduler's ResourceClaim controller does that from the pod spec.

KFP single-user installs run pipelines as ``pipeline-runner`` in ``kubeflow``; multi-user
(profiles) runs them as ``default-editor`` in each profile namespace.
"""

from __future__ import annotations

import re

from draslice.cluster.names import validate_dns_label
from draslice.errors import InvalidParameter

RBAC_API = "rbac.authorization.k8s.io/v1"
RESOURCE_GROUP = "resource.k8s.io"
READ = ["get", "list", "watch"]
CLUSTER_RESOURCES = ["deviceclasses", "resourceslices"]
NAMESPACED_RESOURCES = ["resourceclaims", "resourceclaimtemplates"]
DEFAULT_NAMESPACE = "kubeflow"
DEFAULT_SERVICE_ACCOUNT = "pipeline-runner"
NAME = "draslice-dra-reader"


def _subject(namespace: str, service_account: str) -> dict:
    return {"kind": "ServiceAccount", "name": service_account, "namespace": namespace}


def rbac(
    namespace: str = DEFAULT_NAMESPACE, service_account: str = DEFAULT_SERVICE_ACCOUNT
) -> list[dict]:
    """ClusterRole + ClusterRoleBinding (cluster objects), Role + RoleBinding (namespace)."""
    validate_dns_label(namespace, "namespace")
    _check_service_account(service_account)
    # One binding per namespace and service account, so several can be installed side by side.
    binding = f"{NAME}-{namespace}-{service_account}"[:253]
    rule_cluster = {"apiGroups": [RESOURCE_GROUP], "resources": CLUSTER_RESOURCES, "verbs": READ}
    rule_ns = {"apiGroups": [RESOURCE_GROUP], "resources": NAMESPACED_RESOURCES, "verbs": READ}
    return [
        {"apiVersion": RBAC_API, "kind": "ClusterRole", "metadata": {"name": NAME},
         "rules": [rule_cluster]},
        {"apiVersion": RBAC_API, "kind": "ClusterRoleBinding", "metadata": {"name": binding},
         "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole",
                     "name": NAME},
         "subjects": [_subject(namespace, service_account)]},
        {"apiVersion": RBAC_API, "kind": "Role",
         "metadata": {"name": NAME, "namespace": namespace}, "rules": [rule_ns]},
        {"apiVersion": RBAC_API, "kind": "RoleBinding",
         "metadata": {"name": f"{NAME}-{service_account}"[:253], "namespace": namespace},
         "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": NAME},
         "subjects": [_subject(namespace, service_account)]},
    ]


TRAINJOB_NAME = "draslice-trainjob-launcher"
TRAINER_GROUP = "trainer.kubeflow.org"
# What the finetune-trainjob step does with TrainJobs (components/trainjob/launch.py): create
# one, read its status until it ends, delete it on timeout. It reads no runtime: the TrainJob
# names its runtime and the Trainer controller resolves it.
TRAINJOB_VERBS = ["create", "get", "delete"]


def trainjob_rbac(
    namespace: str = DEFAULT_NAMESPACE, service_account: str = DEFAULT_SERVICE_ACCOUNT
) -> list[dict]:
    """Role + RoleBinding: the KFP step that launches a TrainJob may create, read and delete
    TrainJobs in its own namespace, and nothing else."""
    validate_dns_label(namespace, "namespace")
    _check_service_account(service_account)
    return [
        {"apiVersion": RBAC_API, "kind": "Role",
         "metadata": {"name": TRAINJOB_NAME, "namespace": namespace},
         "rules": [{"apiGroups": [TRAINER_GROUP], "resources": ["trainjobs"],
                    "verbs": TRAINJOB_VERBS}]},
        {"apiVersion": RBAC_API, "kind": "RoleBinding",
         "metadata": {"name": f"{TRAINJOB_NAME}-{service_account}"[:253],
                      "namespace": namespace},
         "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role",
                     "name": TRAINJOB_NAME},
         "subjects": [_subject(namespace, service_account)]},
    ]


def _check_service_account(name: str) -> None:
    # A ServiceAccount name is a DNS-1123 subdomain; the common ones are labels too.
    if not isinstance(name, str) or len(name) > 253 or not re.match(
        r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$", name
    ):
        raise InvalidParameter(
            "service_account", name,
            "must be a ServiceAccount name (lower-case DNS-1123 subdomain), e.g. "
            "pipeline-runner (KFP single-user) or default-editor (KFP multi-user)",
        )

"""Kueue quota on GPU slices: ResourceFlavor, ClusterQueue, LocalQueue, and the mapping.

Kueue counts DRA devices through ``deviceClassMappings`` in its controller Configuration
(``resources.deviceClassMappings: [{name, deviceClassNames}]``): each DeviceClass a claim
requests is counted as one unit of the mapped logical resource, and a ClusterQueue quotas that
name in ``coveredResources``. It needs Kueue v0.15+ (the ``kueue.x-k8s.io/v1beta2`` API used
here) with its ``DynamicResourceAllocation`` feature gate on (alpha since v0.14; the project
notes say beta and on by default from v0.18, check your release's notes), and, for KFP task
pods, Kueue's ``pod`` integration (plain pods join a queue through the label
``kueue.x-k8s.io/queue-name``; ``draslice compile --kueue-queue NAME`` sets it on GPU tasks).
"""

from __future__ import annotations

from draslice.cluster.names import validate_dns_label
from draslice.cluster.templates import GPU_CLASS, MIG_CLASS
from draslice.errors import InvalidParameter

KUEUE_API = "kueue.x-k8s.io/v1beta2"
KUEUE_CONFIG_API = "config.kueue.x-k8s.io/v1beta2"
QUEUE_LABEL = "kueue.x-k8s.io/queue-name"
MIN_VERSION = "v0.15"
FLAVOR = "draslice-gpu-slices"
CLUSTER_QUEUE = "draslice-gpu-slices"
# Logical resource names the ClusterQueue quotas: one per DeviceClass draslice claims from.
MIG_RESOURCE = "mig-slices"
SHARED_RESOURCE = "shared-gpus"
MAPPINGS = {MIG_RESOURCE: [MIG_CLASS], SHARED_RESOURCE: [GPU_CLASS]}
# A quota above what any cluster can publish is a typo: Kubernetes supports 5,000 nodes, so
# 8 GPUs of 7 MIG slices each give at most 280,000 devices; the bound leaves room above that.
MAX_QUOTA = 1_000_000


def check_queue_name(name: str) -> str:
    """A LocalQueue name, as a label value and an object name must be."""
    return validate_dns_label(name, "kueue_queue")


def configuration_fragment() -> dict:
    """The part of Kueue's controller Configuration that maps DeviceClasses to quota names."""
    return {
        "apiVersion": KUEUE_CONFIG_API, "kind": "Configuration",
        "featureGates": {"DynamicResourceAllocation": True},
        "integrations": {"frameworks": ["pod", "batch/job"]},
        "resources": {"deviceClassMappings": [
            {"name": name, "deviceClassNames": classes} for name, classes in MAPPINGS.items()
        ]},
    }


def queues(
    namespace: str, queue: str = "gpu-slices", mig_slices: int = 4, shared_gpus: int = 2,
    cpu: str = "32", memory: str = "128Gi",
) -> list[dict]:
    """A flavor, a ClusterQueue with quota on slices, and the LocalQueue users name."""
    validate_dns_label(namespace, "namespace")
    check_queue_name(queue)
    for field, value in (("mig_slices", mig_slices), ("shared_gpus", shared_gpus)):
        if not isinstance(value, int) or isinstance(value, bool) or not 0 <= value <= MAX_QUOTA:
            raise InvalidParameter(
                field, value, f"must be a whole number from 0 to {MAX_QUOTA:,} (more devices "
                "than a 5,000-node cluster of 8 GPUs with 7 MIG slices each publishes)")
    return [
        {"apiVersion": KUEUE_API, "kind": "ResourceFlavor", "metadata": {"name": FLAVOR}},
        {"apiVersion": KUEUE_API, "kind": "ClusterQueue", "metadata": {"name": CLUSTER_QUEUE},
         "spec": {
             "namespaceSelector": {},
             "resourceGroups": [{
                 "coveredResources": ["cpu", "memory", MIG_RESOURCE, SHARED_RESOURCE],
                 "flavors": [{"name": FLAVOR, "resources": [
                     {"name": "cpu", "nominalQuota": cpu},
                     {"name": "memory", "nominalQuota": memory},
                     {"name": MIG_RESOURCE, "nominalQuota": mig_slices},
                     {"name": SHARED_RESOURCE, "nominalQuota": shared_gpus},
                 ]}],
             }],
         }},
        {"apiVersion": KUEUE_API, "kind": "LocalQueue",
         "metadata": {"name": queue, "namespace": namespace},
         "spec": {"clusterQueue": CLUSTER_QUEUE}},
    ]

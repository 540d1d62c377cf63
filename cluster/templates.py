"""The ResourceClaimTemplates draslice's GPU tasks claim: the one place that builds them.

Both ``draslice manifests`` (which renders them to YAML for an admin to apply) and
``draslice preflight --profile`` (which evaluates them against a cluster's ResourceSlices
without applying anything) build templates here, so what preflight checks is exactly what the
admin installs.

Two kinds, as in the seed guide:

- a MIG slice: DeviceClass ``mig.nvidia.com`` and a CEL selector on the published ``profile``
  attribute (``1g.6gb`` -> template ``mig-1g-6gb``);
- a shared full GPU: DeviceClass ``gpu.nvidia.com`` with an opaque ``GpuConfig`` that asks the
  NVIDIA driver for TimeSlicing (an interval) or MPS (active thread percentage, pinned memory);
- K whole GPUs in one pod (``gpus-K``): DeviceClass ``gpu.nvidia.com``, ExactCount ``K``, for
  ``torchrun --nproc-per-node K`` in that pod (docs/trainjob.md).

Several slices over several pods need no template of their own: each pod that names a
template in ``spec.resourceClaims`` gets its own ResourceClaim made from it, so N pods of a
TrainJob on ``mig-1g-6gb`` claim N slices.

Kept free of kfp imports: task pods import it at run time.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from draslice.cluster.cel import check_expressions
from draslice.cluster.names import is_mig_profile, validate_dns_label, validate_template_name
from draslice.errors import InvalidParameter

DRIVER = "gpu.nvidia.com"
MIG_CLASS = "mig.nvidia.com"
GPU_CLASS = "gpu.nvidia.com"
RESOURCE_API = "resource.k8s.io/v1"
GPU_CONFIG_API = "resource.nvidia.com/v1beta1"
REQUEST_NAME = "gpu-slice"  # the seed guide's request name
# One allocation holds at most 32 devices (k8s.io/api resource/v1 AllocationResultsMaxSize).
MAX_GPUS_PER_POD = 32
TIMESLICE_INTERVALS = ("Default", "Short", "Medium", "Long")
SHARING_STRATEGIES = ("TimeSlicing", "MPS")

def mig_template_name(profile: str) -> str:
    """``1g.6gb`` -> ``mig-1g-6gb``: a DNS-1123 label, usable as a label value too."""
    check_mig_profile(profile)
    return validate_template_name("mig-" + re.sub(r"[^a-z0-9]+", "-", profile).strip("-"))


def check_mig_profile(profile: str) -> str:
    if not is_mig_profile(profile):
        raise InvalidParameter(
            "profile", profile,
            "must be a MIG profile string as the driver publishes it, e.g. 1g.6gb, 2g.12gb, "
            "1g.10gb+me (read the exact strings with `draslice preflight`)",
        )
    return profile


def mig_selector(profile: str) -> str:
    """The CEL expression that selects MIG devices of one profile."""
    check_mig_profile(profile)
    return f'device.attributes["{DRIVER}"].profile == "{profile}"'


@dataclass(frozen=True)
class Sharing:
    """How a shared full GPU is shared between the pods that claim it."""

    strategy: str = "TimeSlicing"
    interval: str = "Default"  # TimeSlicing only
    active_thread_percentage: int | None = None  # MPS only
    pinned_memory_limit: str | None = None  # MPS only, a quantity such as "10Gi"

    def check(self) -> None:
        if self.strategy not in SHARING_STRATEGIES:
            raise InvalidParameter(
                "strategy", self.strategy, f"must be one of {SHARING_STRATEGIES}"
            )
        if self.strategy == "TimeSlicing":
            if self.interval not in TIMESLICE_INTERVALS:
                raise InvalidParameter(
                    "interval", self.interval, f"must be one of {TIMESLICE_INTERVALS}"
                )
            if self.active_thread_percentage is not None or self.pinned_memory_limit:
                raise InvalidParameter(
                    "strategy", self.strategy,
                    "active thread percentage and pinned memory limit need strategy MPS",
                )
        else:
            pct = self.active_thread_percentage
            if pct is not None and not (1 <= pct <= 100):
                raise InvalidParameter("active_thread_percentage", pct, "must be 1..100")
            if self.pinned_memory_limit is not None and not re.match(
                r"^[0-9]+(\.[0-9]+)?(Ki|Mi|Gi|Ti|k|M|G|T)?$", self.pinned_memory_limit
            ):
                raise InvalidParameter(
                    "pinned_memory_limit", self.pinned_memory_limit,
                    "must be a Kubernetes quantity such as 10Gi or 4096Mi",
                )

    def gpu_config(self) -> dict:
        """The opaque ``GpuConfig`` parameters (the driver rejects unknown fields)."""
        self.check()
        if self.strategy == "TimeSlicing":
            sharing = {"strategy": "TimeSlicing", "timeSlicingConfig": {"interval": self.interval}}
        else:
            mps: dict = {}
            if self.active_thread_percentage is not None:
                mps["defaultActiveThreadPercentage"] = self.active_thread_percentage
            if self.pinned_memory_limit is not None:
                mps["defaultPinnedDeviceMemoryLimit"] = self.pinned_memory_limit
            sharing = {"strategy": "MPS", **({"mpsConfig": mps} if mps else {})}
        return {"apiVersion": GPU_CONFIG_API, "kind": "GpuConfig", "sharing": sharing}

    def default_name(self) -> str:
        return "shared-gpu-timeslice" if self.strategy == "TimeSlicing" else "shared-gpu-mps"


def _template(name: str, namespace: str | None, request: dict, config: list[dict]) -> dict:
    """The ResourceClaimTemplate; its CEL selectors are checked here as the API server checks
    them (cluster/cel.py), so a template the server would refuse fails now, when rendered."""
    validate_template_name(name)
    check_expressions([s["cel"]["expression"] for s in request["exactly"].get("selectors", [])])
    metadata: dict = {"name": name}
    if namespace:
        validate_dns_label(namespace, "namespace")
        metadata["namespace"] = namespace
    devices: dict = {"requests": [request]}
    if config:
        devices["config"] = config
    return {
        "apiVersion": RESOURCE_API,
        "kind": "ResourceClaimTemplate",
        "metadata": metadata,
        "spec": {"spec": {"devices": devices}},
    }


def mig_claim_template(
    profile: str, namespace: str | None = None, name: str | None = None
) -> dict:
    """One MIG slice of ``profile`` per pod."""
    request = {
        "name": REQUEST_NAME,
        "exactly": {
            "deviceClassName": MIG_CLASS,
            "allocationMode": "ExactCount",
            "count": 1,
            "selectors": [{"cel": {"expression": mig_selector(profile)}}],
        },
    }
    return _template(name or mig_template_name(profile), namespace, request, [])


def shared_gpu_claim_template(
    sharing: Sharing | None = None, namespace: str | None = None, name: str | None = None
) -> dict:
    """A whole GPU shared with other pods by time-slicing or MPS."""
    sharing = sharing or Sharing()
    request = {
        "name": REQUEST_NAME,
        "exactly": {"deviceClassName": GPU_CLASS, "allocationMode": "ExactCount", "count": 1},
    }
    config = [
        {
            "requests": [REQUEST_NAME],
            "opaque": {"driver": DRIVER, "parameters": sharing.gpu_config()},
        }
    ]
    return _template(name or sharing.default_name(), namespace, request, config)


def gpus_template_name(count: int) -> str:
    """``2`` -> ``gpus-2``."""
    return f"gpus-{check_gpu_count(count)}"


def check_gpu_count(count: int) -> int:
    if isinstance(count, bool) or not isinstance(count, int) or not (
            1 <= count <= MAX_GPUS_PER_POD):
        raise InvalidParameter(
            "gpus", count, f"must be a whole number of GPUs per pod, 1..{MAX_GPUS_PER_POD}")
    return count


def gpus_claim_template(count: int, namespace: str | None = None, name: str | None = None) -> dict:
    """Exactly ``count`` whole GPUs in one pod (not shared): one device per torchrun process."""
    request = {
        "name": REQUEST_NAME,
        "exactly": {"deviceClassName": GPU_CLASS, "allocationMode": "ExactCount",
                    "count": check_gpu_count(count)},
    }
    return _template(name or gpus_template_name(count), namespace, request, [])


def devices_per_pod(template: str) -> int:
    """How many devices a pod claiming ``template`` gets, so as many torchrun processes: K for
    ``gpus-K``, else one (a MIG slice or a shared GPU: one device; CUDA gives a process one MIG
    device only)."""
    found = re.fullmatch(r"gpus-([1-9][0-9]*)", template)
    return int(found.group(1)) if found else 1

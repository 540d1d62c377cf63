"""The devices the node's DRA driver publishes: MIG slices of one NVIDIA A30, the card whose MIG
profiles are 1g.6gb, 2g.12gb and 4g.24gb, shaped as the NVIDIA DRA driver publishes them
(attribute names and kinds as in tests/fixtures/resourceslices, device names as driver v25.12+
writes them).

What Kubernetes' test driver can and cannot stand in for (docs/cluster-tests.md):
- it publishes any device, attribute and capacity it is given, so DeviceClasses, CEL selectors,
  claim templates, the scheduler's allocation and preflight see what they would see on a GPU node;
- preparing a claim, it writes a CDI spec whose only edits are environment variables; it mounts no
  device node, sets no NVIDIA_VISIBLE_DEVICES, creates no MIG instance and applies no sharing
  (time-slicing/MPS) config. Opaque configs must be string maps addressed to it: the NVIDIA
  driver's ``GpuConfig`` would fail to decode, so the shared-GPU templates are not prepared here.
"""

from __future__ import annotations

import json
from pathlib import Path

PRODUCT = "NVIDIA A30"
PARENT_UUID = "GPU-6a1c2b9e-0d3f-4e57-9a8b-1c2d3e4f5a6b"
# (profile, memory, multiprocessors) of the A30's MIG profiles
PROFILES = {"1g.6gb": ("5952Mi", 14), "2g.12gb": ("11968Mi", 28)}
# The node's slices: two 1g.6gb and one 2g.12gb (one A30 has 4 compute slices).
LAYOUT = (("1g.6gb", 0), ("1g.6gb", 1), ("2g.12gb", 2))


def mig_device(profile: str, placement: int) -> dict:
    memory, sms = PROFILES[profile]
    name = f"gpu-0-mig-{profile.replace('.', '')}-{placement}-0"
    return {
        "name": name,
        "attributes": {
            "type": {"string": "mig"},
            "profile": {"string": profile},
            "productName": {"string": PRODUCT},
            "brand": {"string": "Nvidia"},
            "architecture": {"string": "Ampere"},
            "cudaComputeCapability": {"version": "8.0.0"},
            "driverVersion": {"version": "580.105.8"},
            "cudaDriverVersion": {"version": "13.0.0"},
            "uuid": {"string": f"MIG-0a0c7c1e-55b2-5f6c-9d1e-00000000000{placement}"},
            "parentUUID": {"string": PARENT_UUID},
            "resource.kubernetes.io/pciBusID": {"string": "0000:3b:00.0"},
        },
        "capacity": {"memory": {"value": memory}, "multiprocessors": {"value": str(sms)}},
    }


def devices() -> list[dict]:
    return [mig_device(profile, placement) for profile, placement in LAYOUT]


def count(profile: str) -> int:
    return sum(1 for p, _ in LAYOUT if p == profile)


def write(path: Path) -> Path:
    """The driver's --devices file: one slice holding every device."""
    path.write_text(json.dumps([{"devices": devices()}], indent=1))
    return path

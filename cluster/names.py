"""Kubernetes naming rules draslice enforces before anything reaches a cluster.

Kept free of kfp imports: task pods import it at run time, where ``kfp.dsl`` is the slim
runtime package and ``kfp.kubernetes`` cannot be imported.
"""

from __future__ import annotations

import re

from draslice.errors import InvalidParameter

# The pod label that names a GPU task's claim template in ``policy`` mode: set by
# pipelines/claim.py, read by the admission policy (cluster/manifests/admission.py).
CLAIM_LABEL = "draslice.dev/claim-template"
# The executor platform spec's field of native claim mode (kubeflow/pipelines#14243): written by
# pipelines/claim.py, looked for by kfp_ops in a package and in a server's refusal.
NATIVE_FIELD = "podResourceClaims"
# KFP runs a task's user code in the executor pod's container of this name.
MAIN_CONTAINER = "main"

# The template name is also the pod's claim name (a DNS-1123 label: no dots) and, in policy
# mode, a label value (at most 63 characters). A label satisfies both.
MAX_TEMPLATE_NAME = 63
_DNS1123_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")


def validate_dns_label(value: str, field: str, why: str = "") -> str:
    """A DNS-1123 label (at most 63 characters), or an error naming ``field`` (and ``why``)."""
    if not isinstance(value, str) or not value:
        raise InvalidParameter(field, value, "must be a non-empty name")
    if len(value) > MAX_TEMPLATE_NAME:
        raise InvalidParameter(
            field, value,
            f"is {len(value)} characters; at most {MAX_TEMPLATE_NAME} (it is also a label value)",
        )
    if not _DNS1123_LABEL.match(value):
        raise InvalidParameter(
            field, value,
            "must be a DNS-1123 label: lower-case letters, digits and '-', starting and ending "
            "with a letter or digit" + (f" ({why})" if why else ""),
        )
    return value


def validate_template_name(name: str) -> str:
    """A ResourceClaimTemplate name that is also a pod claim name and a label value."""
    return validate_dns_label(name, "claim_template", "no dots: it names the pod's claim")


# A MIG profile as the NVIDIA DRA driver publishes it: "<compute slices>g.<memory>gb", optionally
# with extra attributes such as "+me" or "-me" ("1g.10gb+me", "1g.12gb-me", "4g.40gb"). The one
# grammar for MIG profile names: claim templates check it, sizing reads compute slices with it.
_MIG_PROFILE = r"([1-9][0-9]*)g\.[1-9][0-9]*gb(?:[+-][a-z]+)*"
_MIG_PROFILE_NAME = re.compile(f"^{_MIG_PROFILE}$")
_MIG_PROFILE_IN_TEXT = re.compile(rf"(?<![\w.]){_MIG_PROFILE}(?![\w.])", re.IGNORECASE)


def is_mig_profile(name: object) -> bool:
    """Whether ``name`` is a MIG profile string exactly as the driver publishes it."""
    return isinstance(name, str) and _MIG_PROFILE_NAME.match(name) is not None


def mig_compute_slices(text: str) -> int | None:
    """The compute slices of the MIG profile ``text`` names or contains: ``2g.20gb`` and a MIG
    device's name such as ``NVIDIA A100-SXM4-40GB MIG 2g.20gb`` give 2; None without one."""
    found = _MIG_PROFILE_IN_TEXT.search(text)
    return int(found.group(1)) if found else None


# A PersistentVolumeClaim's name is a DNS-1123 subdomain (Kubernetes' NameIsDNSSubdomain).
MAX_SUBDOMAIN = 253
_DNS1123_SUBDOMAIN = re.compile(
    r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")


def validate_dns_subdomain(value: str, field: str) -> str:
    """A DNS-1123 subdomain (object names such as a PVC's), or an error naming ``field``."""
    if not isinstance(value, str) or not value:
        raise InvalidParameter(field, value, "must be a non-empty name")
    if len(value) > MAX_SUBDOMAIN or not _DNS1123_SUBDOMAIN.match(value):
        raise InvalidParameter(
            field, value,
            f"must be a DNS-1123 subdomain: at most {MAX_SUBDOMAIN} characters, lower-case "
            "letters, digits, '-' and '.', starting and ending with a letter or digit",
        )
    return value


def validate_mount_path(value: str, field: str) -> str:
    """A container mount path: absolute, not ``/`` itself, without ``..`` (a relative or
    empty path would be resolved by the container runtime, or refused when the pod starts)."""
    if not isinstance(value, str) or not value.startswith("/") or value.rstrip("/") == "" \
            or ".." in value.split("/") or ":" in value or value != value.strip():
        raise InvalidParameter(
            field, value, "must be an absolute path inside the container, such as /data (not "
                          "/ itself, without '..' or ':')")
    return value


# The image reference grammar of the container registries (distribution/reference):
# [domain[:port]/]path-component[/path-component...][:tag][@algorithm:hex].
_ALNUM = r"[a-z0-9]+"
_PATH_COMPONENT = rf"{_ALNUM}(?:(?:[._]|__|-+){_ALNUM})*"
_DOMAIN_COMPONENT = r"(?:[a-zA-Z0-9]|[a-zA-Z0-9][a-zA-Z0-9-]*[a-zA-Z0-9])"
_DOMAIN = rf"(?:{_DOMAIN_COMPONENT}(?:\.{_DOMAIN_COMPONENT})*|\[[a-fA-F0-9:]+\])(?::[0-9]+)?"
_IMAGE_NAME = rf"(?:{_DOMAIN}/)?{_PATH_COMPONENT}(?:/{_PATH_COMPONENT})*"
_IMAGE_REF = re.compile(
    rf"(?P<name>{_IMAGE_NAME})(?::[\w][\w.-]{{0,127}})?"
    r"(?:@[A-Za-z][A-Za-z0-9]*(?:[-_+.][A-Za-z][A-Za-z0-9]*)*:[0-9a-fA-F]{32,})?"
)
MAX_IMAGE_NAME = 255


def validate_image_ref(value: str, field: str) -> str:
    """A container image reference a registry and the kubelet accept, or an error naming
    ``field`` (a bad one would surface only as the pod's ImagePullBackOff / InvalidImageName)."""
    match = _IMAGE_REF.fullmatch(value) if isinstance(value, str) else None
    if match is None or len(match.group("name")) > MAX_IMAGE_NAME:
        raise InvalidParameter(
            field, value,
            "must be an image reference [registry[:port]/]repository[:tag][@sha256:digest], "
            "e.g. registry.example.com/team/draslice-trainer:0.1.0 (repository in lower case; "
            f"at most {MAX_IMAGE_NAME} characters before the tag)",
        )
    return value

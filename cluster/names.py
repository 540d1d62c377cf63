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

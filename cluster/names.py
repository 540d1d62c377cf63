"""Kubernetes naming rules draslice enforces before anything reaches a cluster.

Kept free of kfp imports: task pods import it at run time, where ``kfp.dsl`` is the slim
runtime package and ``kfp.kubernetes`` cannot be imported.
"""

from __future__ import annotations

import re

from draslice.trainer.errors import InvalidParameter

MAX_TEMPLATE_NAME = 63  # a template name is also a label value, and those are at most 63
_DNS1123_SUBDOMAIN = re.compile(
    r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$"
)


def validate_template_name(name: str) -> str:
    """A ResourceClaimTemplate name that is also a valid label value, or a clear error."""
    if not isinstance(name, str) or not name:
        raise InvalidParameter("claim_template", name, "must be a non-empty name")
    if len(name) > MAX_TEMPLATE_NAME:
        raise InvalidParameter(
            "claim_template", name,
            f"is {len(name)} characters; at most {MAX_TEMPLATE_NAME} (it is also a label value)",
        )
    if not _DNS1123_SUBDOMAIN.match(name):
        raise InvalidParameter(
            "claim_template", name,
            "must be a DNS-1123 subdomain: lower-case letters, digits, '-' and '.', "
            "starting and ending with a letter or digit",
        )
    return name

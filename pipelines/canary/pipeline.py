"""The canary pipeline: ``preflight -> smoke``, a cheap recurring check that a slice can be
had and computes (``draslice schedule create`` runs it nightly).

No ``from __future__ import annotations``: kfp reads the pipeline signature's types.
"""

from collections.abc import Callable

from kfp import dsl

from draslice.cluster.names import validate_template_name
from draslice.pipelines.claim import ClaimMode
from draslice.pipelines.steps import DEFAULT_TEMPLATE, READY, checks, pipeline_name, smoke_test

KIND = "canary"


def build(template: str = DEFAULT_TEMPLATE, mode: str | ClaimMode = ClaimMode.POLICY,
          kueue_queue: str | None = None) -> Callable:
    validate_template_name(template)
    mode = ClaimMode.parse(mode)

    @dsl.pipeline(
        name=pipeline_name(KIND, template, mode),
        description=f"Canary for DRA GPU slices of claim template {template}: preflight, smoke.",
    )
    def canary(
        on_missing_dra: str = "skip", preflight_source: str = "auto", device: str = "auto"
    ):
        pre = checks(template, on_missing_dra, preflight_source)
        with dsl.If(pre.outputs["decision"] == READY, name="slice-available"):
            smoke_test(template, mode, device, 0.0, kueue_queue)

    return canary

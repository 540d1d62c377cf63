"""CEL selectors checked as the API server checks them, by Kubernetes' own code.

A selector is compiled by the allocator program (``cluster/allocator``), which calls
``k8s.io/dynamic-resource-allocation/cel`` the way the API server validates a new
ResourceClaimTemplate: at most 10 KiB, compiled in the environment for new expressions, and
refused when its estimated cost exceeds the limit. So a template the API server would refuse
is refused here, when it is rendered, with the API server's own words. Evaluation against
devices happens in the same program, during preflight (see analysis.py).
"""

from __future__ import annotations

from draslice.errors import InvalidParameter


class CelCompileError(InvalidParameter):
    """A selector expression that does not compile (exit 2, like any bad input)."""


def compile_error_message(detail: str) -> str:
    """The compiler's message on one line (its caret drawing dropped)."""
    return detail.strip().splitlines()[0] if detail.strip() else detail


def check_expressions(expressions: list[str], kubernetes_version: str | None = None) -> None:
    """Raise :class:`CelCompileError` for the first expression the API server would refuse."""
    from draslice.cluster import allocator

    if not expressions:
        return
    for expression in expressions:
        if not isinstance(expression, str) or not expression.strip():
            raise CelCompileError("cel.expression", expression,
                                  "must be a non-empty CEL expression")
    version = allocator.check_version(kubernetes_version)
    for expression, error in allocator.check_selectors(expressions, version).items():
        if error:
            shown = expression if len(expression) <= 200 else expression[:200] + "..."
            raise CelCompileError(
                "cel.expression", shown,
                f"does not compile (Kubernetes {version}): {compile_error_message(error)}",
            )


def check_expression(expression: str, kubernetes_version: str | None = None) -> None:
    """One selector; see :func:`check_expressions`."""
    check_expressions([expression], kubernetes_version)

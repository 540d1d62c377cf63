"""Gate: fail the run on a FAIL verdict, after validate has published its report."""

from kfp import dsl

from draslice.components.image import TRAINER_IMAGE


@dsl.component(base_image=TRAINER_IMAGE, install_kfp_package=False)
def gate(verdict: str, passed: bool):
    """Raises when the verdict failed, so the run's state (and the platform's CI) says so.

    A separate step because a failing KFP task does not upload its outputs: validate would
    lose its report exactly when it is needed.

    Args:
        verdict: validate's verdict text.
        passed: validate's boolean verdict.
    """
    from draslice.errors import ValidationFailed

    print(verdict)
    if not passed:
        raise ValidationFailed(verdict)

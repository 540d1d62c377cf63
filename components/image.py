"""The trainer image every component runs on: the one place to change it.

Built from ``trainer/Dockerfile``; it carries the whole draslice distribution and kfp. Set
``DRASLICE_TRAINER_IMAGE`` (or ``draslice compile --image REF``) when compiling to point the
pipelines at your registry's copy (the committed ``compiled/`` files use the default, which
nobody has pushed: ``draslice upload`` and ``submit`` warn when a pipeline still names it).
"""

import os

from draslice import __version__

IMAGE_ENV = "DRASLICE_TRAINER_IMAGE"
DEFAULT_TRAINER_IMAGE = f"ghcr.io/draslice/trainer:{__version__}"
TRAINER_IMAGE = os.environ.get(IMAGE_ENV, DEFAULT_TRAINER_IMAGE)


def trainer_image(image: str | None = None) -> str:
    """The image the rendered pipelines and manifests run on: ``image`` (a ``--image``
    option) when given, else ``TRAINER_IMAGE``; checked against the image reference grammar,
    so a typo is refused here instead of surfacing as the pod's InvalidImageName."""
    from draslice.cluster.names import validate_image_ref

    if image is not None:
        return validate_image_ref(image, "image")
    return validate_image_ref(TRAINER_IMAGE, IMAGE_ENV)

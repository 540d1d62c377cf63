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

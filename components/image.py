"""The trainer image every component runs on: the one place to change it.

Built from ``trainer/Dockerfile``; it carries the whole draslice distribution and kfp. Set
``DRASLICE_TRAINER_IMAGE`` when compiling to point the pipelines at your registry's copy
(the committed ``compiled/`` files use the default).
"""

import os

from draslice import __version__

DEFAULT_TRAINER_IMAGE = f"ghcr.io/draslice/trainer:{__version__}"
TRAINER_IMAGE = os.environ.get("DRASLICE_TRAINER_IMAGE", DEFAULT_TRAINER_IMAGE)

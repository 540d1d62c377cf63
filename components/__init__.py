"""One KFP component per pipeline step, each a thin ``component.py`` over the trainer library.

All components are lightweight Python components on the one trainer image
(:data:`TRAINER_IMAGE`), with ``install_kfp_package=False`` and no ``packages_to_install``:
GPU nodes are often offline, so nothing is installed at run time, and the same code runs
locally under ``kfp.local``.
"""

from draslice.components.image import TRAINER_IMAGE

__all__ = ["TRAINER_IMAGE"]

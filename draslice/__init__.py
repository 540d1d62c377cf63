"""draslice: fine-tune models on a DRA-allocated GPU slice from Kubeflow Pipelines.

The import package is assembled from the repository's top-level folders (see
``[tool.setuptools] package-dir`` in pyproject.toml):

- ``draslice.trainer``    -> ``trainer/``     code that runs inside the trainer image
- ``draslice.components`` -> ``components/``  one thin KFP component per pipeline step
- ``draslice.pipelines``  -> ``pipelines/``   pipelines, the claim binding, compile targets
- ``draslice``            -> ``draslice/``    the ``draslice`` command line
"""

__version__ = "0.1.0"

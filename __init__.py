"""draslice: fine-tune models on a DRA-allocated GPU slice from Kubeflow Pipelines.

The repository root is the import package (``[tool.setuptools] package-dir`` in
pyproject.toml maps ``draslice`` to ``.``), so a module's dotted name is its path:

- ``draslice.trainer``    -> ``trainer/``     code that runs inside the trainer image
- ``draslice.components`` -> ``components/``  one thin KFP component per pipeline step
- ``draslice.pipelines``  -> ``pipelines/``   pipelines, the claim binding, compile targets
- ``draslice.cluster``    -> ``cluster/``     preflight, claim templates, cluster manifests
- ``draslice.sizing``     -> ``sizing/``      slice profiles and ``draslice advise``
- ``draslice.kfp_ops``    -> ``kfp_ops/``     upload, submit and schedule on a KFP server
- ``draslice.cli``        -> ``cli/``         the ``draslice`` command line
- ``draslice.errors``     -> ``errors.py``    the errors every part raises, with exit codes
"""

__version__ = "0.1.0"

"""The benchmark scripts behind docs/benchmarks.md (not shipped in the wheel).

The repository root is the ``draslice`` package, so from a checkout installed with
``pip install -e .`` (``make setup``) these modules are ``draslice.benchmarks.*``: the scripts
import each other, and the model builder ``draslice.tests.scratch``, by that name, with no
``sys.path`` edit. Each runs as ``python benchmarks/NAME.py`` from any folder, or as
``python -m draslice.benchmarks.NAME``.
"""

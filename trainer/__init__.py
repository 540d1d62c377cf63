"""The code that runs inside the trainer image.

Each module owns one decision: ``device`` (what the pod sees and how to emulate a slice),
``budget`` (the slice-memory budget), ``loglines`` (every line format the seed's e2e greps),
``smoke`` (the checked matmul), ``config`` (every knob of the fine-tune, declared once),
``presets`` (named runs), ``sft`` (the training loop) with ``build``, ``measure`` and
``artifacts``, ``data``/``examples``/``model`` (what is trained), ``validate`` (the verdict)
and ``report`` (what the KFP UI shows). docs/layout.md maps every module.
"""

from draslice.trainer import libraries

libraries.settle()

"""The code that runs inside the trainer image.

Each module owns one decision: ``device`` (what the pod sees and how to emulate a slice),
``budget`` (the slice-memory budget), ``loglines`` (every line format the seed's e2e greps),
``smoke`` (the checked matmul), ``data``/``model``/``sft`` (the LoRA fine-tune), ``validate``
(the verdict) and ``report`` (what the KFP UI shows).
"""

"""What the trainer asks of the libraries it imports: no network, and no noise a user cannot act on.

Nothing is downloaded at run time (docs/finetune.md), yet importing peft imports bitsandbytes,
and bitsandbytes 0.50 on a CPU with AVX512-BF16 (the Sapphire Rapids hosts of many GPU nodes)
asks the Hugging Face Hub for an optional 4-bit CPU kernel at import, then logs a line when it
cannot have it (offline, the kernels library logs that it skipped a check): a line about a
kernel draslice never uses (a QLoRA run on a GPU uses bitsandbytes' CUDA kernels; on a CPU its
own fallback). transformers 5 also warns, through peft, that ``is_gradient_checkpointing`` is
deprecated: peft's code, not the user's. :func:`settle` drops exactly those lines and changes
nothing else. It runs where draslice's own processes start, before anything imports peft: the
``draslice`` command (``cli/__init__.py``) and the finetune and validate components' bodies.
Importing the trainer changes nothing, so a notebook keeps its own logging settings.

:func:`offline` is for processes draslice owns: the ``draslice`` command sets
``HF_HUB_OFFLINE=1`` (and the transformers and datasets equivalents) unless the environment sets
them, as the trainer image does, so the lookup above is not a network attempt at every start
and a run on a laptop behaves as in the cluster. Neither function imports a library
(``draslice --help`` stays light).
"""

from __future__ import annotations

import logging
import os
import warnings

# The lines that lookup logs, by logger: bitsandbytes' when it has no kernel, and the kernels
# library's, offline, when it skips the publisher check for bitsandbytes' kernel repository.
DROPPED = {
    "bitsandbytes.backends.cpu.ops": "Failed to load CPU gemm_4bit_forward",
    "kernels._internals.hf_hub": "Skipping publisher trust check for "
                                 "'kernels-community/quantization-bitsandbytes'",
}


class _DropLine(logging.Filter):
    def __init__(self, prefix: str) -> None:
        super().__init__()
        self.prefix = prefix

    def filter(self, record: logging.LogRecord) -> bool:
        return not str(record.msg).startswith(self.prefix)


# What the trainer image sets (trainer/Dockerfile), for a process draslice owns.
OFFLINE = {"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1"}


def offline() -> None:
    """The Hugging Face libraries offline, unless the environment says otherwise."""
    for name, value in OFFLINE.items():
        os.environ.setdefault(name, value)


def settle() -> None:
    """The library lines above dropped; idempotent."""
    for name, prefix in DROPPED.items():
        logger = logging.getLogger(name)
        if not any(isinstance(f, _DropLine) for f in logger.filters):
            logger.addFilter(_DropLine(prefix))
    warnings.filterwarnings("ignore", message=r"`is_gradient_checkpointing` is deprecated",
                            category=FutureWarning)

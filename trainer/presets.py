"""Named runs of the fine-tune: which knobs a user sets for each, and their values.

The only place a default differs from the config's (``trainer/config.py``). A preset names the
knobs its pipeline exposes as parameters (and ``draslice run`` as options) and the values it
gives them; a test checks each pipeline's signature against its preset. torch-free.
"""

from dataclasses import dataclass, field
from typing import Any

from draslice.trainer.config import KNOBS


@dataclass(frozen=True)
class Preset:
    name: str
    exposed: tuple[str, ...]
    """The knobs a user sets for this run, in the order a form lists them."""
    values: dict[str, Any] = field(default_factory=dict)
    """Values that differ from the config's defaults."""

    def default(self, name: str) -> Any:
        """The value ``name`` starts from in this run: the preset's, else the config's."""
        return self.values.get(name, KNOBS[name].default)

    def defaults(self) -> dict[str, Any]:
        """Every exposed knob with the value it starts from."""
        return {name: self.default(name) for name in self.exposed}

    def fill(self, given: dict[str, Any], names: tuple[str, ...]) -> dict[str, Any]:
        """This preset's values for the knobs among ``names`` a user did not give, as
        ``draslice train`` starts from them; the values in ``given`` win.

        Two adjustments keep a partial choice coherent: the volume's layout
        (:data:`VOLUME_PATHS`) is no default outside the pipeline, and when ``steps`` is
        given its warmup stays the preset's share of them (10 of 200: 5%), so ``--steps 5``
        does not meet a warmup of 10 steps the user never chose.
        """
        filled = {k: v for k, v in self.values.items()
                  if k in names and k not in given and k not in VOLUME_PATHS}
        if "warmup_steps" in filled and "steps" in given and "steps" in self.values:
            filled["warmup_steps"] = filled["warmup_steps"] * given["steps"] // self.values["steps"]
        return filled


# Where the finetune pipelines' volume holds the inputs and the checkpoints, relative to its
# mount: no defaults for a command in a shell (there checkpoints go under --output-dir).
VOLUME_PATHS = ("model_dir", "data", "checkpoint_dir")

# `draslice run` and the `sft` pipelines: the fine-tune with the built-in model and data
# (a small GPT-2 built from a config, on learnable successor chains). The config's defaults
# are this run, so it changes none of them.
DEMO = Preset(
    name="demo",
    exposed=("device", "precision", "slice_memory_gib", "steps", "batch_size", "seq_len",
             "learning_rate", "lora_r", "lora_alpha", "lora_targets", "seed",
             "memory_headroom", "min_loss_drop"),
)

# The finetune pipelines: a pretrained model and a user's data from a volume. LoRA's usual
# rate with warmup and cosine decay, a bf16 base, a held-out eval loss, checkpoints on the
# volume; a pretrained model's loss falls less than a random one's, hence min_loss_drop.
FINETUNE = Preset(
    name="finetune",
    exposed=("model_dir", "data", "data_format", "max_length", "pack", "eval_fraction",
             "gradient_checkpointing", "offload_activations", "tile_mlp", "bf16_weights",
             "load_in_4bit", "lora_r", "lora_alpha",
             "lora_targets", "batch_size", "steps", "learning_rate", "lr_schedule",
             "warmup_steps", "checkpoint_every", "checkpoint_dir", "merge", "seed", "device",
             "precision", "slice_memory_gib", "memory_headroom", "min_loss_drop", "compile"),
    values={"model_dir": "models/base", "data": "data/train.jsonl", "eval_fraction": 0.05,
            "bf16_weights": True, "lora_r": 16, "lora_alpha": 32, "steps": 200,
            "learning_rate": 2e-4, "lr_schedule": "cosine", "warmup_steps": 10,
            "checkpoint_every": 50, "checkpoint_dir": "checkpoints", "min_loss_drop": 0.05},
)

PRESETS = {p.name: p for p in (DEMO, FINETUNE)}

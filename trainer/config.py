"""Every knob of the fine-tune, declared once: name, type, default, help, choices, valid range.

The dataclasses here are the single declaration (as peft's ``LoraConfig`` does with
``field(metadata={"help": ...})``). Everything else is derived from them or checked against
them by a test (tests/trainer/test_config.py):

- the ``draslice train``, ``advise`` and ``run`` options (``cli/knobs.py`` generates them);
- the fine-tune component's inputs (``components/finetune``), which build the config by name;
- the pipelines' parameters (``pipelines/<name>/pipeline.py``), whose defaults are a preset's
  (``trainer/presets.py``).

A value outside its range fails when the config is built (``__post_init__``), so a bad
``--lora-r 0`` is refused before any model, task or pipeline starts. This module imports
neither torch nor kfp: ``draslice --help`` and bad-input errors must stay instant.

No ``from __future__ import annotations``: a field's ``type`` is read as a real type.
"""

import math
import re
from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass, field, fields
from typing import Any

from draslice.errors import InvalidParameter

AUTO_TARGETS = "auto"
DATA_FORMATS = ("auto", "prompt-completion", "chat", "datasets")
PRECISIONS = ("auto", "bf16", "fp32")
LR_SCHEDULES = ("constant", "cosine")
# How a step is made fast (trainer/speed/ decides and applies it; docs/benchmarks.md has the
# figures). "auto": CUDA graphs of the body where every batch has one width, Liger kernels.
COMPILE_MODES = ("auto", "off", "cudagraphs", "default", "reduce-overhead")
DEVICE_PATTERN = re.compile(r"auto|cpu|cuda(:\d+)?")
DEVICE_CHOICES = "'auto', 'cpu', 'cuda' or 'cuda:N'"


_TYPE_WORDS = {int: "an integer", float: "a number", bool: "true or false", str: "a string"}


def knob(default: Any, help: str, *, choices: Iterable[str] = (), ge: float | None = None,
         gt: float | None = None, lt: float | None = None, internal: bool = False) -> Any:
    """A config field with its help, choices and range (``ge <= value``, ``gt < value``,
    ``value < lt``). ``internal``: set by draslice itself, never a user option."""
    meta = {"help": help, "choices": tuple(choices), "ge": ge, "gt": gt, "lt": lt,
            "internal": internal}
    return field(default=default, metadata=meta)


@dataclass(frozen=True)
class Knob:
    """One user-settable knob as the CLI, components and pipelines see it (flattened: the
    model shape's fields are knobs beside the fine-tune's own)."""

    name: str
    type: type
    default: Any
    help: str
    choices: tuple[str, ...] = ()
    ge: float | None = None
    gt: float | None = None
    lt: float | None = None

    @property
    def valid(self) -> str:
        """The valid values in words: what an error says and ``--help`` shows."""
        if self.choices:
            return "must be one of " + ", ".join(self.choices)
        if self.name == "device":
            return f"must be {DEVICE_CHOICES}"
        low = (f"[{self.ge:g}" if self.ge is not None
               else f"({self.gt:g}" if self.gt is not None else None)
        if low and self.lt is not None:
            return f"must be in {low}, {self.lt:g})"
        if self.ge is not None:
            return f"must be >= {self.ge:g}"
        if self.gt is not None:
            return f"must be > {self.gt:g}"
        return ""

    def check(self, value: Any) -> None:
        """Raise :class:`InvalidParameter` unless ``value`` has this knob's type and range."""
        if self.type is bool:
            ok_type = isinstance(value, bool)
        elif self.type is float:
            ok_type = isinstance(value, int | float) and not isinstance(value, bool)
        else:
            ok_type = isinstance(value, self.type) and not (
                self.type is int and isinstance(value, bool))
        if not ok_type:
            raise InvalidParameter(self.name, value, f"must be {_TYPE_WORDS[self.type]}")
        if self.type is float and not math.isfinite(value):
            raise InvalidParameter(self.name, value, "must be a finite number")
        bad = (
            (self.choices and value not in self.choices)
            or (self.name == "device" and not DEVICE_PATTERN.fullmatch(value.strip().lower()))
            or (self.ge is not None and value < self.ge)
            or (self.gt is not None and value <= self.gt)
            or (self.lt is not None and value >= self.lt)
        )
        if bad:
            raise InvalidParameter(self.name, value, self.valid)


def _knobs_of(cls: type, internal: bool = False) -> dict[str, Knob]:
    """The knobs a config dataclass declares (with ``internal``: its internal fields too)."""
    return {
        f.name: Knob(f.name, f.type, f.default, f.metadata["help"], f.metadata["choices"],
                     f.metadata["ge"], f.metadata["gt"], f.metadata["lt"])
        for f in fields(cls) if "help" in f.metadata and (internal or not f.metadata["internal"])
    }


def _check_fields(obj: object) -> None:
    """Each declared field of ``obj`` against its own type and range."""
    for name, declared in _knobs_of(type(obj), internal=True).items():
        declared.check(getattr(obj, name))


@dataclass(frozen=True)
class ModelShape:
    """The synthetic base model (a small GPT-2 built from this config; no download): the seed
    guide's example shape. Unused when a real ``model_dir`` is given."""

    vocab_size: int = knob(512, "Vocabulary size of the synthetic model.", ge=2)
    n_layer: int = knob(4, "Transformer layers of the synthetic model.", ge=1)
    n_embd: int = knob(256, "Hidden width of the synthetic model.", ge=1)
    n_head: int = knob(4, "Attention heads of the synthetic model (must divide n_embd).", ge=1)
    seq_len: int = knob(64, "Tokens per sequence of the synthetic run (a real run uses "
                            "max_length).", ge=2)

    def __post_init__(self) -> None:
        _check_fields(self)
        if self.n_embd % self.n_head:
            raise InvalidParameter("n_head", self.n_head,
                                   f"must divide n_embd={self.n_embd} evenly")

    def check(self) -> None:
        self.__post_init__()

    def to_dict(self) -> dict:
        return asdict(self)


@dataclass
class SFTConfig:
    """Every knob of the LoRA fine-tune. The defaults are the demo run: the seed guide's
    example shape, trained on learnable synthetic data (``trainer/presets.py``).

    The LoRA targets default to attention *and* MLP projections (``auto``: per architecture):
    on a random-init base the seed's attention-only choice (``c_attn``) lowers the loss by
    ~15% in 30 steps, attention+MLP by >30%.

    Without ``model_dir``/``data`` the base is the synthetic GPT-2 of ``shape`` and the data
    are successor chains (``dataset_size``, ``alphabet``); with them, ``shape`` is unused and
    ``max_length`` bounds each example (or each packed row).
    """

    shape: ModelShape = field(default_factory=ModelShape)
    # A real fine-tune: base model directory and data (both empty: the synthetic run).
    model_dir: str = knob("", "Base model: a local Hugging Face directory (config.json, "
                              "weights, tokenizer); nothing is downloaded. Empty: the "
                              "synthetic GPT-2 run.")
    data: str = knob("", "Training data: JSONL of prompt/completion or of chat messages, or "
                         "a directory saved by datasets' save_to_disk. Needs model_dir.")
    data_format: str = knob("auto", "Data format; auto reads the first record's columns.",
                            choices=DATA_FORMATS)
    max_length: int = knob(512, "Tokens per example (or per packed row); longer ones are cut.",
                           ge=2)
    pack: bool = knob(False, "Pack examples into full max_length rows.")
    eval_fraction: float = knob(0.0, "Hold out this fraction for an eval loss, logged at every "
                                     "log step.", ge=0, lt=1)
    # LoRA.
    lora_r: int = knob(8, "LoRA rank.", ge=1)
    lora_alpha: int = knob(16, "LoRA scaling numerator (the update is scaled by alpha/r).",
                           ge=1)
    lora_dropout: float = knob(0.0, "Dropout on the LoRA path.", ge=0, lt=1)
    lora_targets: str = knob(AUTO_TARGETS, "auto (GPT-2: c_attn,c_proj,c_fc; Llama/Qwen2/"
                                           "Mistral: q,k,v,o,gate,up,down projections) or "
                                           "comma-separated module names.")
    # Optimisation.
    batch_size: int = knob(8, "Examples (or packed rows) per step.", ge=1)
    steps: int = knob(30, "Optimizer steps.", ge=1)
    learning_rate: float = knob(3e-3, "AdamW learning rate. The default suits the synthetic "
                                      "run; for a pretrained model 1e-4 to 3e-4 with "
                                      "warmup_steps is the usual LoRA range.", gt=0)
    weight_decay: float = knob(0.0, "AdamW weight decay.", ge=0)
    lr_schedule: str = knob("constant", "After warmup: keep the rate (constant) or decay it "
                                        "to 0 (cosine).", choices=LR_SCHEDULES)
    warmup_steps: int = knob(0, "Raise the learning rate linearly over the first N steps "
                                "(fewer than steps).", ge=0)
    log_every: int = knob(10, "Log the loss (and eval loss) every N steps.", ge=1)
    seed: int = knob(0, "Seed of the synthetic base and data, LoRA's init, the split and the "
                        "batch order.", ge=0)
    # The synthetic data (successor chains).
    dataset_size: int = knob(256, "Sequences in the synthetic training set.", ge=1)
    alphabet: int = knob(64, "Distinct tokens of the synthetic data (at most vocab_size).",
                         ge=2)
    # Where it runs.
    device: str = knob("auto", "Where to run; auto: the first CUDA device, else the CPU.")
    precision: str = knob("auto", "Training precision; auto: bf16 where supported, else fp32.",
                          choices=PRECISIONS)
    slice_memory_gib: float = knob(0.0, "Emulate a slice of N GiB on a bigger GPU by capping "
                                        "CUDA memory (0: no cap).", ge=0)
    # Memory levers.
    gradient_checkpointing: bool = knob(False, "Recompute activations in backward: less "
                                               "memory, ~30% slower.")
    offload_activations: bool = knob(False, "With gradient_checkpointing on a GPU: each "
                                            "layer's saved input waits in pinned host memory "
                                            "until backward, so more tokens a step fit a "
                                            "small slice, for host copies beside the compute.")
    tile_mlp: bool = knob(False, "With gradient_checkpointing: each layer's MLP runs a tile of "
                                 "tokens at a time and recomputes it in backward, so its "
                                 "intermediate-size activations never exist for the whole "
                                 "batch; more tokens a step fit, for one more MLP forward.")
    bf16_weights: bool = knob(False, "Keep the frozen base in bf16 (half of fp32).")
    load_in_4bit: bool = knob(False, "QLoRA: a 4-bit NF4 base through bitsandbytes "
                                     "(pip install 'draslice[qlora]'; GPU or CPU).")
    # Checkpoints, export, speed.
    checkpoint_every: int = knob(0, "Write an atomic checkpoint every N steps (0: none).", ge=0)
    checkpoint_dir: str = knob("", "Where checkpoints go (empty: the output's checkpoints/). "
                                   "A rerun with the same folder resumes from the newest.")
    merge: bool = knob(False, "Also save the base with the adapter merged in (merged/), with "
                              "the tokenizer: it loads as a plain Hugging Face model.")
    compile: str = knob("auto", "Speed of a step. auto: on a GPU, the transformer body replayed "
                                "as a CUDA graph when every batch has one width (synthetic run, "
                                "pack), plus Liger kernels for Llama/Qwen if installed; eager "
                                "otherwise. default and reduce-overhead: torch.compile, a "
                                "one-off compile of tens of seconds that pays on long runs. "
                                "off: plain eager.", choices=COMPILE_MODES)
    fsdp: bool = knob(False, "Under torchrun with several processes, shard the base and the "
                             "LoRA weights over them (FSDP2): for a base too large for one "
                             "device. Off: each process holds the whole base (DDP). One "
                             "process: no effect.")
    pad_to_max_length: bool = knob(False, "Every batch max_length wide: the worst case, for "
                                          "advise.", internal=True)

    def __post_init__(self) -> None:
        self.check()

    @property
    def synthetic(self) -> bool:
        return not self.model_dir

    def check(self) -> None:
        """Reject bad input before any model is built: each field's range, then the rules
        that tie fields together."""
        self.shape.check()
        _check_fields(self)
        if bool(self.model_dir) != bool(self.data):
            missing = "data" if self.model_dir else "model_dir"
            raise InvalidParameter(
                missing, "", "a real fine-tune needs both model_dir (a local HF model directory) "
                "and data (JSONL or a saved dataset); give both, or neither for the synthetic run"
            )
        if self.warmup_steps >= self.steps:
            raise InvalidParameter("warmup_steps", self.warmup_steps,
                                   f"must be in [0, steps={self.steps})")
        if self.synthetic and self.batch_size > self.dataset_size:
            raise InvalidParameter(
                "batch_size", self.batch_size, f"must be in [1, dataset_size={self.dataset_size}]"
            )
        if self.offload_activations and not self.gradient_checkpointing:
            raise InvalidParameter("offload_activations", True, "needs gradient_checkpointing "
                                   "too (it moves the activations that checkpointing keeps)")
        if self.tile_mlp and not self.gradient_checkpointing:
            raise InvalidParameter("tile_mlp", True, "needs gradient_checkpointing too (a "
                                   "tile is recomputed in the checkpointed layer's backward)")
        if self.fsdp and self.load_in_4bit:
            raise InvalidParameter("fsdp", True, "must be false with load_in_4bit (FSDP2 "
                                   "cannot shard bitsandbytes' 4-bit weights)")
        if self.alphabet > self.shape.vocab_size:
            raise InvalidParameter(
                "alphabet", self.alphabet, f"must be in [2, vocab_size={self.shape.vocab_size}]"
            )

    def to_dict(self) -> dict:
        return asdict(self)

    def in_use(self) -> dict[str, Any]:
        """The knobs this run uses, flat and in ``FINETUNE_KNOBS`` order: a real run's leave
        out the synthetic model and data, the synthetic run's the model folder and data."""
        unused = REAL_ONLY if self.synthetic else SYNTHETIC_ONLY
        flat = {**self.shape.to_dict(), **self.to_dict()}
        return {k: flat[k] for k in FINETUNE_KNOBS if k not in unused}

    @classmethod
    def from_dict(cls, raw: dict) -> "SFTConfig":
        """The config a run recorded (``to_dict``: the shape nested)."""
        raw = dict(raw)
        return cls(shape=ModelShape(**raw.pop("shape", {})), **raw)

    @classmethod
    def from_params(cls, params: Mapping[str, Any]) -> "SFTConfig":
        """The config from flat knob values by name (the CLI's options, a component's
        inputs); a name that is no fine-tune knob is refused, so nothing is dropped."""
        shape_names = {f.name for f in fields(ModelShape)}
        own = {f.name for f in fields(cls)} - {"shape"}
        unknown = set(params) - shape_names - own
        if unknown:
            raise InvalidParameter(sorted(unknown)[0], params[sorted(unknown)[0]],
                                   "is not a fine-tune knob")
        shape = ModelShape(**{k: v for k, v in params.items() if k in shape_names})
        return cls(shape=shape, **{k: v for k, v in params.items() if k in own})


@dataclass(frozen=True)
class VerdictConfig:
    """The validate step's rules: when a fine-tune PASSes."""

    memory_headroom: float = knob(0.1, "Fraction of the slice kept free (CUDA context, "
                                       "workspaces): the peak must stay under the rest.",
                                  ge=0, lt=1)
    min_loss_drop: float = knob(0.3, "Fraction by which the loss must fall for a PASS.",
                                ge=0, lt=1)

    def __post_init__(self) -> None:
        _check_fields(self)


# Every user-settable knob by name, flattened (the model shape's beside the fine-tune's).
KNOBS: dict[str, Knob] = {**_knobs_of(SFTConfig), **_knobs_of(ModelShape),
                          **_knobs_of(VerdictConfig)}
FINETUNE_KNOBS = tuple(k for k in KNOBS if k not in _knobs_of(VerdictConfig))
# Knobs only one kind of run reads (SFTConfig's docstring): the synthetic model and data, and
# a real run's model folder and data.
SYNTHETIC_ONLY = (*_knobs_of(ModelShape), "dataset_size", "alphabet")
REAL_ONLY = ("model_dir", "data", "data_format", "max_length", "pack")
VERDICT_KNOBS = tuple(_knobs_of(VerdictConfig))


def check_params(params: Mapping[str, Any], base: Mapping[str, Any] | None = None) -> list[str]:
    """Check knob values against their declared types and ranges before any work starts.

    Each name in ``params`` that is a knob is checked alone (raises
    :class:`~draslice.errors.InvalidParameter`, naming it and its valid range); with
    ``base`` (a preset's values, e.g. a pipeline's defaults) the merged whole is built as a
    config too, so rules that tie knobs together (warmup below steps, batch within the
    synthetic data) are checked as well. ``base`` may be a compiled pipeline's parameter
    defaults as they stand in its YAML: KFP writes an integer default as a whole float
    (``30.0``), which counts as the integer. Returns the names that are not knobs, for the
    caller (a pipeline's own parameters such as ``on_missing_dra``).
    """
    params, base = _whole_floats_as_ints(params), _whole_floats_as_ints(base)
    for name, value in params.items():
        if name in KNOBS:
            KNOBS[name].check(value)
    if base is not None:
        merged = {**base, **params}
        SFTConfig.from_params({k: v for k, v in merged.items() if k in FINETUNE_KNOBS})
        VerdictConfig(**{k: v for k, v in merged.items() if k in VERDICT_KNOBS})
    return [name for name in params if name not in KNOBS]


def _whole_floats_as_ints(values: Mapping[str, Any] | None) -> dict[str, Any] | None:
    """An integer knob given as a whole float (KFP's protobuf numbers) as the integer."""
    if values is None:
        return None
    return {k: int(v) if (k in KNOBS and KNOBS[k].type is int and isinstance(v, float)
                          and v.is_integer()) else v
            for k, v in values.items()}


def flag(name: str) -> str:
    """The command-line spelling of a knob: ``lora_r`` -> ``--lora-r`` (the CLI's options and
    the ``draslice train`` command a TrainJob runs both spell it so)."""
    return "--" + name.replace("_", "-")

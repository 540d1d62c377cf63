"""The base model and its LoRA wrapper.

The default base is a small GPT-2-style causal LM built from a config with a fixed seed, so
a run needs no download and the validate step can rebuild the *same* base from the same
config and seed to check that the saved adapter reproduces the trained model. A real base
comes from a local Hugging Face directory (a PVC or a Model artifact) with its tokenizer,
strictly offline: a hub id fails here with a clear message instead of hanging on a download.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from pathlib import Path

import torch
from peft import LoraConfig, PeftModel, get_peft_model
from transformers import GPT2Config, GPT2LMHeadModel

from draslice.errors import (
    InvalidParameter,
    MissingDependency,
    ModelLoadError,
)

# GPT-2 names: attention qkv (c_attn), attention and MLP output (c_proj), MLP input (c_fc).
GPT2_ATTENTION_ONLY = "c_attn"  # the seed guide's choice
GPT2_ATTENTION_AND_MLP = "c_attn,c_proj,c_fc"
LLAMA_ATTENTION_AND_MLP = "q_proj,k_proj,v_proj,o_proj,gate_proj,up_proj,down_proj"
AUTO_TARGETS = "auto"
# LoRA on every attention and MLP projection, per architecture (config.model_type).
TARGETS_BY_ARCH = {
    "gpt2": GPT2_ATTENTION_AND_MLP,
    "llama": LLAMA_ATTENTION_AND_MLP,
    "qwen2": LLAMA_ATTENTION_AND_MLP,
    "mistral": LLAMA_ATTENTION_AND_MLP,
}


@dataclass(frozen=True)
class ModelShape:
    vocab_size: int = 512
    n_layer: int = 4
    n_embd: int = 256
    n_head: int = 4
    seq_len: int = 64

    def check(self) -> None:
        for name in ("vocab_size", "n_layer", "n_embd", "n_head", "seq_len"):
            if getattr(self, name) <= 0:
                raise InvalidParameter(name, getattr(self, name), "must be >= 1")
        if self.n_embd % self.n_head:
            raise InvalidParameter(
                "n_head", self.n_head, f"must divide n_embd={self.n_embd} evenly"
            )

    def to_dict(self) -> dict:
        return asdict(self)


def build_base(shape: ModelShape, seed: int) -> GPT2LMHeadModel:
    """A randomly initialised GPT-2-style model; same shape and seed give the same weights."""
    shape.check()
    config = GPT2Config(
        vocab_size=shape.vocab_size,
        n_positions=shape.seq_len,
        n_embd=shape.n_embd,
        n_layer=shape.n_layer,
        n_head=shape.n_head,
        bos_token_id=None,
        eos_token_id=None,
        resid_pdrop=0.0,
        embd_pdrop=0.0,
        attn_pdrop=0.0,
    )
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        return GPT2LMHeadModel(config)


def parse_targets(targets: str) -> list[str]:
    names = [t.strip() for t in targets.split(",") if t.strip()]
    if not names:
        raise InvalidParameter(
            "lora_targets", targets, f"must name modules, e.g. {GPT2_ATTENTION_AND_MLP!r}"
        )
    return names


def _projection_names(model: torch.nn.Module) -> list[str]:
    return sorted(
        {
            n.rsplit(".", 1)[-1]
            for n, m in model.named_modules()
            if isinstance(m, torch.nn.Linear) or type(m).__name__ in ("Conv1D", "Linear4bit")
        }
        - {"lm_head"}
    )


def resolve_targets(model: torch.nn.Module, targets: str) -> str:
    """``auto`` becomes the architecture's attention+MLP projections; a list stays."""
    if targets.strip() != AUTO_TARGETS:
        return targets
    arch = getattr(getattr(model, "config", None), "model_type", "")
    if arch not in TARGETS_BY_ARCH:
        raise InvalidParameter(
            "lora_targets", targets,
            f"has no default for architecture {arch!r} (known: {', '.join(TARGETS_BY_ARCH)}); "
            f"name the modules, e.g. from {_projection_names(model)}",
        )
    return TARGETS_BY_ARCH[arch]


def wrap_lora(
    model: torch.nn.Module, r: int, alpha: int, dropout: float, targets: str
) -> PeftModel:
    if r <= 0:
        raise InvalidParameter("lora_r", r, "must be >= 1")
    if alpha <= 0:
        raise InvalidParameter("lora_alpha", alpha, "must be >= 1")
    if not 0.0 <= dropout < 1.0:
        raise InvalidParameter("lora_dropout", dropout, "must be in [0, 1)")
    names = parse_targets(resolve_targets(model, targets))
    present = {n.rsplit(".", 1)[-1] for n, _ in model.named_modules()}
    missing = [n for n in names if n not in present]
    if missing:
        raise InvalidParameter(
            "lora_targets", targets,
            f"{missing} not in the model; its projections are {_projection_names(model)}",
        )
    config = LoraConfig(
        r=r,
        lora_alpha=alpha,
        lora_dropout=dropout,
        target_modules=names,
        # GPT-2's Conv1D stores weights transposed.
        fan_in_fan_out=getattr(model.config, "model_type", "") == "gpt2",
        task_type="CAUSAL_LM",
    )
    return get_peft_model(model, config)


def count_parameters(model: torch.nn.Module) -> tuple[int, int]:
    trainable = sum(p.numel() for p in model.parameters() if p.requires_grad)
    total = sum(p.numel() for p in model.parameters())
    return trainable, total


def _looks_like_hub_id(spec: str) -> bool:
    return not spec.startswith((".", "/", "~")) and spec.count("/") == 1


def check_model_dir(model_dir: str | Path) -> Path:
    """A local HF model directory, or a clear error (nothing is ever downloaded)."""
    path = Path(model_dir).expanduser()
    if not path.is_dir():
        hint = (
            f" {str(model_dir)!r} looks like a Hugging Face hub id: nothing is downloaded at run "
            "time (GPU nodes are often offline); put the model on a PVC or a Model artifact "
            "(huggingface-cli download ... --local-dir DIR) and pass that directory"
            if _looks_like_hub_id(str(model_dir)) else ""
        )
        raise ModelLoadError(f"model_dir {str(model_dir)!r}: no such directory.{hint}")
    if not (path / "config.json").is_file():
        raise ModelLoadError(
            f"{path}: no config.json; a model directory is what save_pretrained writes "
            "(config.json, *.safetensors, tokenizer files)"
        )
    return path


def load_tokenizer(model_dir: str | Path):
    from transformers import AutoTokenizer

    path = check_model_dir(model_dir)
    try:
        tokenizer = AutoTokenizer.from_pretrained(path, local_files_only=True)
    except (OSError, ValueError, TypeError) as err:
        raise ModelLoadError(f"{path}: cannot load the tokenizer from it ({err})") from err
    if tokenizer.pad_token_id is None:
        tokenizer.pad_token = tokenizer.eos_token
    return tokenizer


def load_pretrained(
    model_dir: str | Path,
    *,
    dtype: torch.dtype = torch.float32,
    load_in_4bit: bool = False,
    device: torch.device | None = None,
) -> torch.nn.Module:
    """The base model from ``model_dir``, offline; ``load_in_4bit`` quantises it (QLoRA)."""
    from transformers import AutoModelForCausalLM

    path = check_model_dir(model_dir)
    kwargs: dict = {"local_files_only": True, "dtype": dtype}
    if load_in_4bit:
        on_cuda = device is not None and device.type == "cuda"
        place = (device.index or 0) if on_cuda else "cpu"
        kwargs.update(quantization_config=qlora_config(), device_map={"": place})
    try:
        model = AutoModelForCausalLM.from_pretrained(path, **kwargs)
    except (OSError, ValueError, KeyError) as err:
        raise ModelLoadError(f"{path}: cannot load a causal LM from it ({err})") from err
    if hasattr(model.config, "use_cache"):
        model.config.use_cache = False  # no KV cache while training
    return model


def qlora_config():
    """4-bit NF4 with bf16 compute and double quantisation (the QLoRA paper's recipe).

    On a GPU or the CPU: bitsandbytes 0.50 (the ``qlora`` extra's floor) runs 4-bit layers on
    CPU tensors too, so a QLoRA run can be tried on a laptop and its adapter checked by the
    pipeline's CPU validate step.
    """
    try:
        import bitsandbytes  # noqa: F401
    except Exception as err:  # ImportError, or its native library failing to load
        raise MissingDependency(
            "load_in_4bit (QLoRA) needs bitsandbytes: pip install 'draslice[qlora]' "
            f"(or drop --load-in-4bit and use --bf16-weights); importing it failed: {err}"
        ) from err
    from transformers import BitsAndBytesConfig

    return BitsAndBytesConfig(
        load_in_4bit=True,
        bnb_4bit_quant_type="nf4",
        bnb_4bit_compute_dtype=torch.bfloat16,
        bnb_4bit_use_double_quant=True,
    )


def check_vocab_fits(model: torch.nn.Module, tokenizer, model_dir: str | Path) -> None:
    """Every token id the tokenizer can emit must have a row in the model's embeddings."""
    rows = model.get_input_embeddings().num_embeddings
    if len(tokenizer) > rows:
        raise ModelLoadError(
            f"{model_dir}: the tokenizer has {len(tokenizer)} tokens but the model's embeddings "
            f"have {rows} rows; ids >= {rows} would index past them. Use the tokenizer saved "
            "with this model"
        )

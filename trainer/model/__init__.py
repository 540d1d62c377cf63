"""The base model and its LoRA wrapper.

The default base is a small GPT-2-style causal LM built from a config with a fixed seed, so
a run needs no download and the validate step can rebuild the *same* base from the same
config and seed to check that the saved adapter reproduces the trained model. A real base
comes from a local Hugging Face directory (a PVC or a Model artifact) with its tokenizer,
strictly offline: a hub id fails here with a clear message instead of hanging on a download.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING

from draslice.errors import (
    InvalidParameter,
    MissingDependency,
    ModelLoadError,
)
from draslice.trainer.config import AUTO_TARGETS, ModelShape
from draslice.trainer.model import match as model_match

if TYPE_CHECKING:  # torch, transformers and peft load where a model is built, not at import:
    # the input checks above them (model folder, data) answer before seconds of imports
    import torch
    from peft import PeftModel
    from transformers import GPT2LMHeadModel

# GPT-2 names: attention qkv (c_attn), attention and MLP output (c_proj), MLP input (c_fc).
GPT2_ATTENTION_ONLY = "c_attn"  # the seed guide's choice
GPT2_ATTENTION_AND_MLP = "c_attn,c_proj,c_fc"
LLAMA_ATTENTION_AND_MLP = "q_proj,k_proj,v_proj,o_proj,gate_proj,up_proj,down_proj"
# A tokenizer's vocabulary lives in one of these (fast, SentencePiece, BPE, WordPiece, tiktoken).
TOKENIZER_FILES = ("tokenizer.json", "tokenizer.model", "vocab.json", "vocab.txt",
                   "spiece.model", "sentencepiece.bpe.model", "tokenizer.tiktoken")
# The tokenizer's JSON files: one cut short or not JSON fails only when transformers loads it,
# after the output folder was prepared; parsing them first names the file before any work.
TOKENIZER_JSON = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json",
                  "vocab.json")
TORCH_WEIGHTS = ("pytorch_model.bin", "pytorch_model.bin.index.json")
# Where configs state how many positions the model has (GPT-2: n_positions; most: the first).
POSITION_KEYS = ("max_position_embeddings", "n_positions", "n_ctx", "max_sequence_length",
                 "seq_length")
# LoRA on every attention and MLP projection, per architecture (config.model_type).
TARGETS_BY_ARCH = {
    "gpt2": GPT2_ATTENTION_AND_MLP,
    "llama": LLAMA_ATTENTION_AND_MLP,
    "qwen2": LLAMA_ATTENTION_AND_MLP,
    "mistral": LLAMA_ATTENTION_AND_MLP,
}


def build_base(shape: ModelShape, seed: int) -> GPT2LMHeadModel:
    """A randomly initialised GPT-2-style model; same shape and seed give the same weights."""
    import torch
    from transformers import GPT2Config, GPT2LMHeadModel

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
    import torch

    return sorted(
        {
            n.rsplit(".", 1)[-1]
            for n, m in model.named_modules()
            if isinstance(m, torch.nn.Linear) or type(m).__name__ in ("Conv1D", "Linear4bit")
        }
        - {"lm_head"}
    )


def auto_targets_of(model_dir: str | Path) -> str | None:
    """What ``auto`` resolves to for the model in ``model_dir`` (its config's model_type), the
    synthetic GPT-2 for an empty one, None for an architecture without a default; read from
    config.json, so it is known before the model is loaded."""
    if not model_dir:
        return TARGETS_BY_ARCH["gpt2"]
    try:
        arch = json.loads((Path(model_dir) / "config.json").read_text()).get("model_type")
    except (OSError, ValueError, AttributeError):
        return None
    return TARGETS_BY_ARCH.get(arch)


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
    names = check_lora_fits(model, r, targets)
    from peft import LoraConfig, get_peft_model

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


def check_lora_fits(model: torch.nn.Module, r: int, targets: str) -> list[str]:
    """The target module names, each present in ``model``, and a rank no larger than the
    smallest targeted matrix: a LoRA update of rank r on a d_in x d_out weight is a product of
    d_in x r and r x d_out, whose rank cannot pass min(d_in, d_out), so a larger r only adds
    parameters (``--lora-r 100000`` on a 1.5B model: 1.6e9 of them). ``model`` may be on the
    meta device (``model.match``), so this runs before any weight is loaded."""
    names = parse_targets(resolve_targets(model, targets))
    leaves: dict[str, list] = {}  # the modules under each last name, as peft matches them
    for full, module in model.named_modules():
        leaves.setdefault(full.rsplit(".", 1)[-1], []).append(module)
    missing = [n for n in names if n not in leaves]
    if missing:
        raise InvalidParameter(
            "lora_targets", targets,
            f"{missing} not in the model; its projections are {_projection_names(model)}",
        )
    # A LayerNorm's name (ln_1) is in the model too; peft refuses it only when the model is
    # wrapped, with its own ValueError.
    unwrappable = [(n, m) for n in names for m in leaves[n] if not _matrix_dims(m)]
    if unwrappable:
        name, module = unwrappable[0]
        raise InvalidParameter(
            "lora_targets", targets,
            f"{name!r} names a {type(module).__name__}, not a layer LoRA can wrap; the "
            f"model's projections are {_projection_names(model)}",
        )
    smallest: tuple[int, str] | None = None
    for full, module in model.named_modules():
        if full.rsplit(".", 1)[-1] not in names:
            continue
        dims = _matrix_dims(module)
        if dims and (smallest is None or min(dims) < smallest[0]):
            smallest = (min(dims), f"{full} is {dims[0]} x {dims[1]}")
    if smallest is not None and r > smallest[0]:
        raise InvalidParameter(
            "lora_r", r, f"must be at most {smallest[0]}, the smallest dimension of the "
            f"targeted projections ({smallest[1]}): a larger rank adds parameters, not rank")
    return names


def _matrix_dims(module: torch.nn.Module) -> tuple[int, int] | None:
    """(inputs, outputs) of a layer LoRA can wrap: a Linear (4-bit ones too, whose packed
    weight has another shape), GPT-2's Conv1D, an Embedding; None for anything else."""
    if isinstance(getattr(module, "in_features", None), int):
        return module.in_features, module.out_features
    if type(module).__name__ == "Conv1D":
        return module.nx, module.nf
    weight = getattr(module, "weight", None)
    if type(module).__name__ == "Embedding" and weight is not None:
        return tuple(weight.shape)
    return None


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


def _no_tokenizer(path: Path) -> ModelLoadError:
    return ModelLoadError(
        f"{path}: no tokenizer files (none of {', '.join(TOKENIZER_FILES)}); save the model's "
        "tokenizer into the folder (tokenizer.save_pretrained(DIR), or download the model "
        "repository whole)"
    )


def check_tokenizer_files(model_dir: str | Path) -> Path:
    """The folder holds a tokenizer's vocabulary; without one transformers builds a tokenizer
    with no vocabulary at all, and every example later 'fills max_length'."""
    path = check_model_dir(model_dir)
    if not any((path / name).is_file() for name in TOKENIZER_FILES):
        raise _no_tokenizer(path)
    for name in TOKENIZER_JSON:
        file = path / name
        if not file.is_file():
            continue
        try:
            json.loads(file.read_bytes())
        except ValueError as err:  # UnicodeDecodeError is one
            raise ModelLoadError(
                f"{file}: not valid JSON ({str(err).splitlines()[0][:120]}); copy the "
                "tokenizer files again from the model's source"
            ) from None
    return path


def check_weights(model_dir: str | Path) -> Path:
    """Every safetensors file's header parses and its tensors lie inside the file; a
    truncated or corrupt file is named (only the headers are read)."""
    from safetensors import SafetensorError, safe_open

    path = check_model_dir(model_dir)
    files = sorted(path.glob("*.safetensors"))
    index = path / "model.safetensors.index.json"
    if index.is_file():
        try:
            shards = set(json.loads(index.read_text(encoding="utf-8"))["weight_map"].values())
        except (ValueError, KeyError, TypeError, AttributeError) as err:
            raise ModelLoadError(f"{index}: not a safetensors index ({err})") from None
        missing = sorted(s for s in shards if not (path / s).is_file())
        if missing:
            raise ModelLoadError(f"{index} names shard(s) {missing} that are not in {path}; "
                                 "copy the model folder whole")
    if not files and not any((path / n).is_file() for n in TORCH_WEIGHTS):
        raise ModelLoadError(f"{path}: no weights (*.safetensors or "
                             f"{' / '.join(TORCH_WEIGHTS)}); copy the model folder whole")
    for file in files:
        try:
            # numpy, not "pt": opening reads and checks only the header, and "pt" would
            # import torch (two seconds) before a bad data file could be named
            with safe_open(str(file), "numpy"):
                pass
        except (SafetensorError, OSError) as err:
            raise ModelLoadError(
                f"{file}: not a whole safetensors file ({err}); copy it again from the model's "
                "source (a download or copy that stopped part-way leaves such a file)"
            ) from None
    return path


def position_limit(model_dir: str | Path) -> tuple[int, str] | None:
    """(positions, where it was read) for the model in ``model_dir``; None if its config
    names no limit. RoPE scaling in the config extends the trained positions by its factor."""
    config_path = check_model_dir(model_dir) / "config.json"
    try:
        config = json.loads(config_path.read_text(encoding="utf-8"))
    except (ValueError, UnicodeDecodeError) as err:
        raise ModelLoadError(f"{config_path}: not valid JSON ({err})") from None
    if not isinstance(config, dict):
        raise ModelLoadError(f"{config_path}: not a JSON object")
    for key in POSITION_KEYS:
        value = config.get(key)
        if isinstance(value, int) and not isinstance(value, bool) and value > 0:
            limit, where = value, f"{config_path} {key}"
            break
    else:
        return None
    scaling = config.get("rope_scaling")
    factor = scaling.get("factor") if isinstance(scaling, dict) else None
    if isinstance(factor, int | float) and factor > 1:
        original = scaling.get("original_max_position_embeddings")
        base = original if isinstance(original, int) and original > 0 else limit
        if int(base * factor) > limit:
            limit, where = int(base * factor), f"{where} with rope_scaling factor {factor}"
    return limit, where


def check_max_length(model_dir: str | Path, max_length: int) -> None:
    """A row longer than the model's positions fails (GPT-2's learned positions: an index
    error) or silently runs past what the model was trained on (RoPE): refuse it here."""
    found = position_limit(model_dir)
    if found is not None and max_length > found[0]:
        raise InvalidParameter(
            "max_length", max_length,
            f"must be at most the model's {found[0]} positions ({found[1]})",
        )


def load_tokenizer(model_dir: str | Path):
    from transformers import AutoTokenizer

    path = check_tokenizer_files(model_dir)
    try:
        tokenizer = AutoTokenizer.from_pretrained(path, local_files_only=True)
    except (OSError, ValueError, TypeError) as err:
        raise ModelLoadError(f"{path}: cannot load the tokenizer from it ({err})") from err
    if len(tokenizer.get_vocab()) <= len(tokenizer.all_special_ids):
        raise _no_tokenizer(path)
    if tokenizer.pad_token_id is None:
        tokenizer.pad_token = tokenizer.eos_token
    return tokenizer


def load_pretrained(
    model_dir: str | Path,
    *,
    dtype: torch.dtype | None = None,
    load_in_4bit: bool = False,
    device: torch.device | None = None,
) -> torch.nn.Module:
    """The base model from ``model_dir``, offline, in ``dtype`` (float32 when None);
    ``load_in_4bit`` quantises it (QLoRA)."""
    import torch
    from safetensors import SafetensorError
    from transformers import AutoModelForCausalLM

    path = check_weights(model_dir)
    kwargs: dict = {"local_files_only": True, "dtype": dtype or torch.float32}
    if load_in_4bit:
        on_cuda = device is not None and device.type == "cuda"
        place = (device.index or 0) if on_cuda else "cpu"
        kwargs.update(quantization_config=qlora_config(), device_map={"": place})
    try:
        model, loading = AutoModelForCausalLM.from_pretrained(path, output_loading_info=True,
                                                              **kwargs)
    except (OSError, ValueError, KeyError, SafetensorError) as err:
        raise ModelLoadError(f"{path}: cannot load a causal LM from it ({err})") from err
    model_match.check_report(path, loading)  # what the header check could not read ahead
    return model  # training forwards ask for no KV cache themselves (loss.causal_lm_loss)


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
    import torch
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

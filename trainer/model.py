"""The base model and its LoRA wrapper.

The default base is a small GPT-2-style causal LM built from a config with a fixed seed, so
a run needs no download and the validate step can rebuild the *same* base from the same
config and seed to check that the saved adapter reproduces the trained model.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

import torch
from peft import LoraConfig, PeftModel, get_peft_model
from transformers import GPT2Config, GPT2LMHeadModel

from draslice.trainer.errors import InvalidParameter

# GPT-2 names: attention qkv (c_attn), attention and MLP output (c_proj), MLP input (c_fc).
GPT2_ATTENTION_ONLY = "c_attn"  # the seed guide's choice
GPT2_ATTENTION_AND_MLP = "c_attn,c_proj,c_fc"


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


def wrap_lora(
    model: torch.nn.Module, r: int, alpha: int, dropout: float, targets: str
) -> PeftModel:
    if r <= 0:
        raise InvalidParameter("lora_r", r, "must be >= 1")
    if alpha <= 0:
        raise InvalidParameter("lora_alpha", alpha, "must be >= 1")
    if not 0.0 <= dropout < 1.0:
        raise InvalidParameter("lora_dropout", dropout, "must be in [0, 1)")
    names = parse_targets(targets)
    present = {n.rsplit(".", 1)[-1] for n, _ in model.named_modules()}
    missing = [n for n in names if n not in present]
    if missing:
        linear = sorted(
            {
                n.rsplit(".", 1)[-1]
                for n, m in model.named_modules()
                if isinstance(m, torch.nn.Linear) or type(m).__name__ == "Conv1D"
            }
        )
        raise InvalidParameter(
            "lora_targets", targets, f"{missing} not in the model; its projections are {linear}"
        )
    config = LoraConfig(
        r=r,
        lora_alpha=alpha,
        lora_dropout=dropout,
        target_modules=names,
        # GPT-2's Conv1D stores weights transposed.
        fan_in_fan_out=isinstance(model, GPT2LMHeadModel),
        task_type="CAUSAL_LM",
    )
    return get_peft_model(model, config)


def count_parameters(model: torch.nn.Module) -> tuple[int, int]:
    trainable = sum(p.numel() for p in model.parameters() if p.requires_grad)
    total = sum(p.numel() for p in model.parameters())
    return trainable, total

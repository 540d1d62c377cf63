"""Random-init Hugging Face causal-LM directories, built offline, for tests, benchmarks, demos.

A directory written here is what a user's PVC holds: ``config.json``, safetensors weights and a
*real* tokenizer (a byte-level BPE trained with the ``tokenizers`` library on a small built-in
corpus, wrapped as ``PreTrainedTokenizerFast``, with a ChatML-style chat template). So every
loading path the trainer takes on a user's model — ``AutoConfig``, ``AutoModelForCausalLM``,
``AutoTokenizer``, ``apply_chat_template`` — is exercised without a download.

The presets cover the sizes the issue measures: tiny test models, a GPT-2-124M shape, a ~1.5B
Llama/Qwen2.5-1.5B shape (fits ``1g.6gb`` with LoRA) and a ~7B Llama-2 shape (QLoRA in
``2g.12gb``).
"""

from __future__ import annotations

import json
from pathlib import Path

import torch

from draslice.errors import InvalidParameter

ARCHES = ("gpt2", "llama", "qwen2", "mistral")
EOS = "<|endoftext|>"
IM_START = "<|im_start|>"
IM_END = "<|im_end|>"
SPECIAL_TOKENS = (EOS, IM_START, IM_END)
MIN_VOCAB = 256 + len(SPECIAL_TOKENS) + 1  # the byte alphabet, the specials, one merge
MARKER_FILE = "draslice_scratch.json"

# ChatML: every turn is "<|im_start|>role\ncontent<|im_end|>\n"; a generation prompt opens
# an assistant turn. Rendering is prefix-stable, which completion-only masking relies on.
CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)

PRESETS: dict[str, dict] = {
    # Test sizes: a few hundred thousand parameters, built and trained in seconds on a CPU.
    "tiny-gpt2": dict(arch="gpt2", hidden_size=64, num_layers=2, num_heads=4,
                      vocab_size=512, max_positions=512),
    "tiny-llama": dict(arch="llama", hidden_size=64, num_layers=2, num_heads=4, num_kv_heads=2,
                       intermediate_size=128, vocab_size=512, max_positions=512),
    # GPT-2 small (124M with the 50257 vocabulary).
    "gpt2-124m": dict(arch="gpt2", hidden_size=768, num_layers=12, num_heads=12,
                      vocab_size=50257, max_positions=1024),
    # Qwen2.5-1.5B's shape on the Llama architecture: ~1.54B parameters, tied embeddings.
    "llama-1.5b": dict(arch="llama", hidden_size=1536, num_layers=28, num_heads=12,
                       num_kv_heads=2, intermediate_size=8960, vocab_size=151936,
                       max_positions=4096, tie_word_embeddings=True),
    # Llama-2-7B's shape: ~6.74B parameters.
    "llama-7b": dict(arch="llama", hidden_size=4096, num_layers=32, num_heads=32,
                     num_kv_heads=32, intermediate_size=11008, vocab_size=32000,
                     max_positions=4096),
}

# Text the tokenizer is trained on: enough English, digits and code-ish punctuation that
# common words become single tokens; the demo data (see ``demo_examples``) is in this style.
_CORPUS = """\
The quick brown fox jumps over the lazy dog. A slice of a GPU is a MIG partition or a shared
GPU handed to a pod by dynamic resource allocation. Fine-tune a language model with LoRA:
freeze the base weights and train small low-rank adapters on the attention and MLP projections.
Question: what is the capital of France? Answer: Paris. Question: add 12 and 30. Answer: 42.
user assistant system prompt completion messages role content
def train(model, data, steps): for step in range(steps): loss = model(batch); loss.backward()
{"prompt": "Translate to French: cat", "completion": "chat"} [1, 2, 3, 4, 5, 6, 7, 8, 9, 10]
Kubernetes schedules pods onto nodes; a ResourceClaim asks for devices of a DeviceClass.
0 1 2 3 4 5 6 7 8 9 10 11 12 13 14 15 16 17 18 19 20 plus minus times equals reverse sort
monday tuesday wednesday thursday friday saturday sunday january february march april may
red green blue yellow black white orange purple one two three four five six seven eight nine
"""


def _check_shape(arch: str, hidden_size: int, num_layers: int, num_heads: int,
                 num_kv_heads: int, vocab_size: int, max_positions: int) -> None:
    if arch not in ARCHES:
        raise InvalidParameter("arch", arch, f"must be one of {', '.join(ARCHES)}")
    for name, value in (("hidden_size", hidden_size), ("num_layers", num_layers),
                        ("num_heads", num_heads), ("num_kv_heads", num_kv_heads),
                        ("max_positions", max_positions)):
        if value <= 0:
            raise InvalidParameter(name, value, "must be >= 1")
    if hidden_size % num_heads:
        raise InvalidParameter("num_heads", num_heads, f"must divide hidden_size={hidden_size}")
    if num_heads % num_kv_heads:
        raise InvalidParameter("num_kv_heads", num_kv_heads, f"must divide num_heads={num_heads}")
    if vocab_size < MIN_VOCAB:
        raise InvalidParameter(
            "vocab_size", vocab_size,
            f"must be >= {MIN_VOCAB} (256 byte tokens, {len(SPECIAL_TOKENS)} special tokens)",
        )


def model_config(arch: str, *, hidden_size: int, num_layers: int, num_heads: int,
                 num_kv_heads: int | None = None, intermediate_size: int | None = None,
                 vocab_size: int, max_positions: int, tie_word_embeddings: bool | None = None,
                 eos_token_id: int = 0):
    """The transformers config for ``arch`` with the given shape."""
    from transformers import GPT2Config, LlamaConfig, MistralConfig, Qwen2Config

    kv = num_kv_heads or num_heads
    _check_shape(arch, hidden_size, num_layers, num_heads, kv, vocab_size, max_positions)
    ids = dict(bos_token_id=eos_token_id, eos_token_id=eos_token_id, pad_token_id=eos_token_id)
    if arch == "gpt2":
        return GPT2Config(
            vocab_size=vocab_size, n_positions=max_positions, n_embd=hidden_size,
            n_layer=num_layers, n_head=num_heads, n_inner=intermediate_size,
            resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0,
            tie_word_embeddings=True if tie_word_embeddings is None else tie_word_embeddings,
            **ids,
        )
    config_cls = {"llama": LlamaConfig, "qwen2": Qwen2Config, "mistral": MistralConfig}[arch]
    return config_cls(
        vocab_size=vocab_size, hidden_size=hidden_size, num_hidden_layers=num_layers,
        num_attention_heads=num_heads, num_key_value_heads=kv,
        intermediate_size=intermediate_size or 4 * hidden_size,
        max_position_embeddings=max_positions,
        tie_word_embeddings=bool(tie_word_embeddings),
        **ids,
    )


def build_tokenizer(vocab_size: int):
    """A byte-level BPE with at most ``vocab_size`` tokens, ChatML specials and template."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    if vocab_size < MIN_VOCAB:
        raise InvalidParameter("vocab_size", vocab_size, f"must be >= {MIN_VOCAB}")
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=list(SPECIAL_TOKENS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(_CORPUS.splitlines() * 4, trainer=trainer)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok, eos_token=EOS, bos_token=EOS, pad_token=EOS, unk_token=None,
        model_max_length=1_000_000,
    )
    fast.chat_template = CHAT_TEMPLATE
    return fast


def save_scratch_model(
    out_dir: str | Path,
    arch: str,
    *,
    hidden_size: int,
    num_layers: int,
    num_heads: int,
    num_kv_heads: int | None = None,
    intermediate_size: int | None = None,
    vocab_size: int,
    max_positions: int,
    seed: int = 0,
    dtype: str = "bfloat16",
    device: str = "cpu",
    tie_word_embeddings: bool | None = None,
) -> Path:
    """Write a random-init ``arch`` model and its tokenizer to ``out_dir``; return the path.

    ``device="cuda"`` initialises a big shape on the GPU (a 7B init on a CPU takes minutes).
    """
    from transformers import AutoModelForCausalLM

    if dtype not in ("bfloat16", "float16", "float32"):
        raise InvalidParameter("dtype", dtype, "must be bfloat16, float16 or float32")
    out = Path(out_dir)
    tokenizer = build_tokenizer(vocab_size)
    config = model_config(
        arch, hidden_size=hidden_size, num_layers=num_layers, num_heads=num_heads,
        num_kv_heads=num_kv_heads, intermediate_size=intermediate_size, vocab_size=vocab_size,
        max_positions=max_positions, tie_word_embeddings=tie_word_embeddings,
        eos_token_id=tokenizer.eos_token_id,
    )
    torch_dtype = getattr(torch, dtype)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        if device.startswith("cuda"):
            torch.cuda.manual_seed_all(seed)
        with torch.device(device):
            model = AutoModelForCausalLM.from_config(config, dtype=torch_dtype)
    _init_padding_rows(model, config, seed)
    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    params = sum(p.numel() for p in model.parameters())
    (out / MARKER_FILE).write_text(json.dumps(
        {"arch": arch, "parameters": params, "seed": seed, "dtype": dtype,
         "note": "random init by tests.scratch; not a pretrained model"},
        indent=2) + "\n")
    return out


def _init_padding_rows(model: torch.nn.Module, config, seed: int) -> None:
    """Give the pad token's embedding row random values like every other row.

    Hugging Face's init zeroes the ``padding_idx`` row, and here the pad token is the EOS
    token, which packing puts at the start of rows. A row starting with a zero embedding
    keeps an exactly-zero residual stream at position 0 (it attends only to itself; no biases),
    so every RMSNorm backward there multiplies by 1/sqrt(eps) = 1000. Measured on a 28-layer
    copy of the ``llama-1.5b`` shape: one such batch sent the gradient to inf by layer 5, and
    the 1.5B fit went NaN at step 3 at any learning rate (docs/benchmarks-history.md). A pretrained
    model's pad row is not zero.
    """
    std = float(getattr(config, "initializer_range", 0.02))
    gen = torch.Generator(device="cpu").manual_seed(seed + 1)
    with torch.no_grad():
        for module in model.modules():
            if isinstance(module, torch.nn.Embedding) and module.padding_idx is not None:
                row = torch.randn(module.weight.shape[1], generator=gen) * std
                module.weight[module.padding_idx] = row.to(module.weight)


def save_preset(name: str, out_dir: str | Path, device: str = "cpu", **overrides) -> Path:
    """``save_scratch_model`` with one of :data:`PRESETS` (fields can be overridden)."""
    if name not in PRESETS:
        raise InvalidParameter("preset", name, f"must be one of {', '.join(PRESETS)}")
    spec = {**PRESETS[name], **overrides}
    arch = spec.pop("arch")
    return save_scratch_model(out_dir, arch, device=device, **spec)


# -- demo data --------------------------------------------------------------------------------

_WORDS = (
    "red", "green", "blue", "yellow", "black", "white", "orange", "purple", "one", "two",
    "three", "four", "five", "six", "seven", "eight", "nine", "monday", "tuesday", "friday",
    "march", "april",
)


def demo_examples(n: int, seed: int = 0) -> list[dict]:
    """``n`` learnable prompt/completion pairs: reverse a short list of words.

    The answer is a function of the prompt, so a falling eval loss shows real learning.
    """
    import random

    rng = random.Random(seed)
    rows = []
    for _ in range(n):
        words = rng.sample(_WORDS, rng.randint(2, 5))
        rows.append({"prompt": "reverse: " + " ".join(words) + "\nanswer:",
                     "completion": " " + " ".join(reversed(words))})
    return rows


def write_demo_data(path: str | Path, fmt: str = "prompt-completion", n: int = 256,
                    seed: int = 0) -> Path:
    """Write :func:`demo_examples` as JSONL (``prompt-completion`` or ``chat``) or as a
    ``datasets`` directory (``datasets``)."""
    rows = demo_examples(n, seed)
    if fmt == "chat":
        rows = [{"messages": [{"role": "user", "content": r["prompt"]},
                              {"role": "assistant", "content": r["completion"].strip()}]}
                for r in rows]
    path = Path(path)
    if fmt == "datasets":
        from datasets import Dataset

        Dataset.from_list(rows).save_to_disk(str(path))
        return path
    if fmt not in ("prompt-completion", "chat"):
        raise InvalidParameter("format", fmt, "must be prompt-completion, chat or datasets")
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path

"""Whether a model folder's weights are the ones its ``config.json`` describes, judged by
transformers' own loader from the weights' headers alone.

A ``config.json`` of one model beside another model's weights (a GPT-2 config by Llama
safetensors, a config with fewer layers) loads without an error: transformers prints a load
report, initialises every weight it did not find at random and the run fine-tunes noise, then
reports OK. So the folder is refused when the loader would find a weight missing, a weight it
has no place for, or a weight of another shape.

No table per architecture: the config's own model class is built on the meta device and
handed a state dict of meta tensors of the headers' names and shapes (no tensor byte is read),
through ``from_pretrained`` itself. Its loading report therefore applies what the real load
applies: tied weights (an ``lm_head`` absent beside ``tie_word_embeddings``), key renames and
conversions (``base_model_prefix``, old checkpoints' names), and each model's list of keys to
ignore (GPT-2's ``attn.bias`` buffers, old ``rotary_emb.inv_freq``). The real load's report is
read the same way afterwards (``model.load_pretrained``), for weights this check cannot read
ahead (a pre-quantized folder) or a transformers whose loader refused the meta-device call.
"""

from __future__ import annotations

import json
from functools import lru_cache
from pathlib import Path
from typing import TYPE_CHECKING

from draslice.errors import ModelLoadError

if TYPE_CHECKING:
    import torch

SAFETENSORS = "model.safetensors"
SAFETENSORS_INDEX = "model.safetensors.index.json"
TORCH_BIN = "pytorch_model.bin"
TORCH_BIN_INDEX = "pytorch_model.bin.index.json"
NAMES_SHOWN = 2  # names of each kind of mismatch the message shows


def weight_files(path: Path) -> list[Path]:
    """The weight files transformers loads from ``path``, in its order of preference: the
    shards a safetensors index names, ``model.safetensors``, then the same for
    ``pytorch_model.bin``. Other ``*.safetensors`` files (a ``consolidated.safetensors`` in
    another format, as Mistral repositories ship) are not loaded, so they are not compared."""
    for index, single in ((SAFETENSORS_INDEX, SAFETENSORS), (TORCH_BIN_INDEX, TORCH_BIN)):
        if (path / index).is_file():
            shards = json.loads((path / index).read_text(encoding="utf-8"))["weight_map"]
            return [path / name for name in sorted(set(shards.values()))]
        if (path / single).is_file():
            return [path / single]
    return []


def _shapes(files: list[Path]) -> dict[str, tuple[int, ...]]:
    """{tensor name: shape} from the files' headers; no tensor is read (``.bin`` files are
    mapped onto the meta device, which reads only their pickled index)."""
    from safetensors import safe_open

    shapes: dict[str, tuple[int, ...]] = {}
    for file in files:
        if file.suffix == ".safetensors":
            with safe_open(str(file), "numpy") as handle:
                for name in handle.keys():  # noqa: SIM118 (a safe_open handle is no dict)
                    shapes[name] = tuple(handle.get_slice(name).get_shape())
        else:
            import torch

            state = torch.load(file, map_location="meta", weights_only=True, mmap=True)
            shapes.update({k: tuple(v.shape) for k, v in state.items()})
    return shapes


def loading_report(model_dir: str | Path) -> tuple[torch.nn.Module, dict] | None:
    """(the model on the meta device, transformers' loading info: ``missing_keys``,
    ``unexpected_keys``, ``mismatched_keys``) for the folder's config and weight headers;
    None where the headers cannot say (no weights transformers would load, a pre-quantized
    model whose packed shapes are the quantizer's business, or a loader that refused the
    meta-device call): the real load's own report then decides (:func:`check_report`)."""
    path = Path(model_dir).expanduser()
    return _report(str(path.resolve()), _stamp(path))


def _stamp(path: Path) -> tuple:
    return tuple((f.name, f.stat().st_size, f.stat().st_mtime_ns)
                 for f in sorted(path.iterdir()) if f.is_file())


@lru_cache(maxsize=2)
def _report(path: str, stamp: tuple) -> tuple[torch.nn.Module, dict] | None:  # noqa: ARG001
    import torch
    from transformers import MODEL_FOR_CAUSAL_LM_MAPPING, AutoConfig

    folder = Path(path)
    try:
        config = AutoConfig.from_pretrained(folder, local_files_only=True)
    except (OSError, ValueError, KeyError) as err:
        raise ModelLoadError(f"{folder}: cannot load a causal LM from it ({err})") from None
    if getattr(config, "quantization_config", None):
        return None
    try:
        model_class = MODEL_FOR_CAUSAL_LM_MAPPING[type(config)]
    except KeyError:
        raise ModelLoadError(
            f"{folder / 'config.json'}: model_type {config.model_type!r} is not a causal "
            "language model transformers knows; the fine-tune needs one (a decoder such as "
            "GPT-2, Llama, Qwen2, Mistral)") from None
    if isinstance(model_class, tuple | list):  # several classes: the one the config names
        named = [c for c in model_class if c.__name__ in (config.architectures or [])]
        model_class = (named or list(model_class))[0]
    try:
        files = weight_files(folder)
        if not files:
            return None
        state = {name: torch.empty(shape, device="meta")
                 for name, shape in _shapes(files).items()}
    except (OSError, ValueError, KeyError, TypeError, RuntimeError):
        return None  # check_weights names an unreadable file; the load names the rest
    with _quiet():
        try:
            model, info = model_class.from_pretrained(
                None, config=config, state_dict=state, device_map="meta",
                dtype=torch.float32, ignore_mismatched_sizes=True, use_kernels=False,
                output_loading_info=True)
        except (OSError, ValueError, KeyError, TypeError, RuntimeError, NotImplementedError):
            return None  # this transformers cannot build it on meta: the real load decides
    return model, info


class _quiet:
    """transformers' load report and progress bar off for the meta load (its report is
    what this module words), restored after."""

    def __enter__(self) -> None:
        from transformers.utils import logging

        self.level = logging.get_verbosity()
        self.bars = logging.is_progress_bar_enabled()
        logging.set_verbosity_error()
        logging.disable_progress_bar()

    def __exit__(self, *exc) -> None:
        from transformers.utils import logging

        logging.set_verbosity(self.level)
        if self.bars:
            logging.enable_progress_bar()


def check_matches(model_dir: str | Path) -> torch.nn.Module | None:
    """Refuse a folder whose weights are not the ones its config describes; return the
    model built on the meta device (its modules and shapes, for the LoRA checks), or None
    where the headers cannot say."""
    found = loading_report(model_dir)
    if found is None:
        return None
    model, info = found
    check_report(model_dir, info)
    return model


def check_report(model_dir: str | Path, info: dict) -> None:
    """One line naming what transformers' loading info found wrong (``missing_keys``,
    ``unexpected_keys``, ``mismatched_keys``), or nothing when the weights fit the config."""
    missing = sorted(info.get("missing_keys") or ())
    unexpected = sorted(info.get("unexpected_keys") or ())
    mismatched = sorted(info.get("mismatched_keys") or ())
    if not (missing or unexpected or mismatched):
        return
    parts = []
    if missing:
        parts.append(f"{len(missing)} tensor(s) the config needs are not in the weights "
                     f"({_some(missing)})")
    if unexpected:
        parts.append(f"{len(unexpected)} tensor(s) in the weights have no place in the "
                     f"model it describes ({_some(unexpected)})")
    if mismatched:
        shown = ", ".join(f"{name}: weights {tuple(got)}, config {tuple(want)}"
                          for name, got, want in mismatched[:NAMES_SHOWN])
        parts.append(f"{len(mismatched)} tensor(s) have another shape ({shown}"
                     f"{', ...' if len(mismatched) > NAMES_SHOWN else ''})")
    path = Path(model_dir).expanduser()
    outcome = ("transformers would start those at random and the run would fine-tune noise"
               if missing or mismatched else
               "transformers would drop them and the model would not be the one the weights hold")
    raise ModelLoadError(
        f"{path}: config.json does not describe the weights beside it: " + "; ".join(parts)
        + f". {outcome}; put the config.json saved with these weights in the folder (copy the "
        "model repository whole)")


def _some(names: list[str]) -> str:
    return ", ".join(names[:NAMES_SHOWN]) + (", ..." if len(names) > NAMES_SHOWN else "")

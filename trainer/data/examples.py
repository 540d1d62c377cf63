"""Training examples from a user's data, as token ids with completion-only labels.

Three inputs, one output. A JSONL file of ``{"prompt", "completion"}`` objects, a JSONL file of
``{"messages": [{"role", "content"}, ...]}`` chats (rendered with the tokenizer's own chat
template), or a directory written by ``datasets.Dataset.save_to_disk`` holding either shape.
Each becomes ``(input_ids, labels)`` where ``labels`` is ``-100`` on every prompt, system and
user token: the loss is taken on what the model should *say* (the completion, the assistant
turns), never on what it is told.

Every bad input names the file, the line (JSONL) and what would be valid: bytes that are not
UTF-8, a malformed JSON line, missing columns, an empty file, a chat with an unknown role or
turns out of order, a tokenizer without a chat template.
"""

from __future__ import annotations

import errno
import json
import os
import random
import stat
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from draslice.errors import DatasetError, InvalidParameter
from draslice.trainer.config import DATA_FORMATS

if TYPE_CHECKING:  # imported where a batch is made: reading and checking data needs no torch
    import torch

IGNORE = -100  # the label torch's cross-entropy skips
MAX_LINE_BYTES = 4 << 20
"""The longest JSONL line (and the most text in one saved-dataset row) a run reads: 4 MiB,
about a million tokens, eight times the 128k-token context of the longest common models.
Past it a record costs gigabytes to read and tokenize (a 54 MB line took 10 GB of memory and
two minutes) for an example that max_length cuts anyway."""
FORMATS = DATA_FORMATS  # declared with the data_format knob
PROMPT_COMPLETION = ("prompt", "completion")
CHAT = ("messages",)
ROLES = ("system", "user", "assistant")


@dataclass
class TokenRows:
    """Examples as token-id rows; ``collate`` pads a batch of them."""

    input_ids: list[list[int]]
    labels: list[list[int]]
    pad_id: int

    def __len__(self) -> int:
        return len(self.input_ids)

    def collate(self, indices, pad_to: int = 0) -> dict[str, torch.Tensor]:
        """Right-pad rows to the longest in the batch (to a multiple of 8, for tensor cores),
        or to ``pad_to`` (a worst-case batch for measuring memory)."""
        import torch

        rows = [int(i) for i in indices]
        longest = max(len(self.input_ids[i]) for i in rows)
        width = -(-longest // 8) * 8 if longest > 8 else longest
        width = max(width, pad_to)
        ids = torch.full((len(rows), width), self.pad_id, dtype=torch.long)
        labels = torch.full((len(rows), width), IGNORE, dtype=torch.long)
        mask = torch.zeros((len(rows), width), dtype=torch.long)
        for b, i in enumerate(rows):
            n = len(self.input_ids[i])
            ids[b, :n] = torch.tensor(self.input_ids[i])
            labels[b, :n] = torch.tensor(self.labels[i])
            mask[b, :n] = 1
        return {"input_ids": ids, "attention_mask": mask, "labels": labels}

    def subset(self, indices: list[int]) -> TokenRows:
        return TokenRows([self.input_ids[i] for i in indices],
                         [self.labels[i] for i in indices], self.pad_id)

    @property
    def label_tokens(self) -> int:
        return sum(sum(1 for t in row if t != IGNORE) for row in self.labels)


def from_tensor(rows: torch.Tensor, pad_id: int = 0) -> TokenRows:
    """Fixed-length rows (the synthetic data) where every token is a label."""
    ids = rows.tolist()
    return TokenRows(ids, [list(r) for r in ids], pad_id)


# -- reading ----------------------------------------------------------------------------------

def detect_format(path: Path) -> str:
    """``datasets`` for a directory; for a JSONL file, the columns of its first record."""
    if path.is_dir():
        return "datasets"
    first = next(iter(_jsonl_records(path)), None)
    if first is None:
        raise DatasetError(f"{path}: the file is empty; it needs one JSON object per line")
    return _format_of_columns(first[1].keys(), f"{path}:{first[0]}")


def _format_of_columns(columns, where: str) -> str:
    cols = set(columns)
    if "messages" in cols:
        return "chat"
    if cols >= set(PROMPT_COMPLETION):
        return "prompt-completion"
    raise DatasetError(
        f"{where}: found columns {sorted(cols)}; expected 'prompt' and 'completion' "
        "(prompt-completion) or 'messages' (chat)"
    )


def _jsonl_records(path: Path):
    """(line number, object) for each non-blank line; a bad line is named by number.

    Lines are read as bytes and decoded one by one, so a binary or non-UTF-8 file is named by
    line and byte offset instead of failing inside the text reader with no location. A line
    is read up to :data:`MAX_LINE_BYTES` and no further, so a line too long is refused after
    that many bytes, not after the whole of it is in memory (or never, from an endless one).
    """
    offset = 0
    with path.open("rb") as handle:
        number = 0
        while raw := handle.readline(MAX_LINE_BYTES + 1):
            number += 1
            if len(raw) > MAX_LINE_BYTES and not raw.endswith(b"\n"):
                raise DatasetError(
                    f"{path}:{number}: the line is longer than {MAX_LINE_BYTES >> 20} MiB, the "
                    "most one record may hold (tokenizing it would take gigabytes of memory "
                    "for an example cut to max_length anyway); split or shorten it"
                )
            try:
                line = raw.decode("utf-8-sig" if number == 1 else "utf-8")
            except UnicodeDecodeError as err:
                bad = raw[err.start]
                raise DatasetError(
                    f"{path}:{number}: not UTF-8 text (byte 0x{bad:02x} at byte offset "
                    f"{offset + err.start}); the data must be JSONL (UTF-8, one JSON object per "
                    "line) or a directory written by datasets' save_to_disk"
                ) from None
            offset += len(raw)
            if not line.strip():
                continue
            try:
                record = json.loads(line)
            except json.JSONDecodeError as err:
                raise DatasetError(
                    f"{path}:{number}: not valid JSON ({err.msg} at column {err.colno})"
                ) from err
            except RecursionError:
                raise DatasetError(
                    f"{path}:{number}: JSON nested deeper than the reader can follow (Python's "
                    f"recursion limit, {sys.getrecursionlimit()}); a record is an object of "
                    "strings and lists of messages"
                ) from None
            except ValueError as err:  # a number of more digits than Python converts
                raise DatasetError(f"{path}:{number}: not valid JSON ({err})") from None
            if not isinstance(record, dict):
                raise DatasetError(
                    f"{path}:{number}: expected a JSON object, got {type(record).__name__}"
                )
            yield number, record


def check_data_path(path: Path) -> None:
    """The data is a regular file or a folder this process can read; anything else is named:
    a named pipe (reading one waits for a writer forever), a device (``/dev/zero`` never
    ends), a socket, a symlink loop or a symlink to nothing."""
    try:
        st = os.stat(path)
    except OSError as err:
        if err.errno == errno.ELOOP:
            what = "a symlink loop (too many levels of symbolic links)"
        elif err.errno == errno.ENOENT and os.path.islink(path):
            what = f"a symlink to {os.readlink(path)!r}, which does not exist"
        elif err.errno == errno.ENOENT:
            what = "no such file or directory"
        else:
            what = f"cannot be read ({err.strerror or err})"
        raise DatasetError(f"{path}: {what} (the training data)") from None
    if stat.S_ISREG(st.st_mode) or stat.S_ISDIR(st.st_mode):
        if not os.access(path, os.R_OK | (os.X_OK if stat.S_ISDIR(st.st_mode) else 0)):
            raise DatasetError(f"{path}: this user cannot read it (Permission denied; the "
                               "training data)")
        return
    kinds = ((stat.S_ISFIFO, "a named pipe (FIFO)"), (stat.S_ISCHR, "a character device"),
             (stat.S_ISBLK, "a block device"), (stat.S_ISSOCK, "a socket"))
    what = next((words for test, words in kinds if test(st.st_mode)), "not a regular file")
    raise DatasetError(f"{path}: {what}, not a data file; the data must be a JSONL file or a "
                       "directory written by datasets' save_to_disk")


def read_records(path: str | Path, fmt: str = "auto") -> tuple[str, list[tuple[str, dict]]]:
    """The format and ``(where, record)`` pairs of a data file or saved-dataset directory."""
    if fmt not in FORMATS:
        raise InvalidParameter("data_format", fmt, f"must be one of {', '.join(FORMATS)}")
    path = Path(path)
    check_data_path(path)
    if fmt == "auto":
        fmt = detect_format(path)
    if path.is_dir():
        records = _dataset_dir_records(path)
        fmt = _format_of_columns(records[0][1].keys(), str(path)) if fmt == "datasets" else fmt
    else:
        if fmt == "datasets":
            raise DatasetError(f"{path}: a saved dataset is a directory (save_to_disk), not a file")
        records = [(f"{path}:{n}", r) for n, r in _jsonl_records(path)]
    if not records:
        raise DatasetError(f"{path}: no records; it needs one JSON object per line")
    needed = CHAT if fmt == "chat" else PROMPT_COMPLETION
    for where, record in records:
        missing = [c for c in needed if c not in record]
        if missing:
            raise DatasetError(
                f"{where}: missing column(s) {missing} for the {fmt} format; "
                f"the record has {sorted(record)}"
            )
        if fmt == "chat":
            check_messages(record["messages"], where)
        else:
            check_prompt_completion(record, where)
    return fmt, records


def _kind(value) -> str:
    """A JSON value's type in JSON's words, for an error line."""
    names = {dict: "an object", list: "a list", str: "a string", bool: "a boolean",
             int: "a number", float: "a number", type(None): "null"}
    return names.get(type(value), type(value).__name__)


def _text_bytes(value: str, field: str, where: str) -> int:
    """The UTF-8 size of a string field; a lone surrogate (half of a UTF-16 pair, which JSON
    can spell as ``"\\ud800"`` and no tokenizer can read) is named with its position."""
    try:
        return len(value.encode("utf-8"))
    except UnicodeEncodeError as err:
        raise DatasetError(
            f"{where}: {field} holds a lone surrogate ({value[err.start]!r} at character "
            f"{err.start}), half of a UTF-16 pair that is not text; write the whole pair "
            "(e.g. \\ud83d\\ude00) or the character itself"
        ) from None


def _check_size(total: int, where: str) -> None:
    """A saved-dataset row is held to a JSONL line's limit (a line is refused as it is read)."""
    if total > MAX_LINE_BYTES:
        raise DatasetError(f"{where}: the record holds {total / (1 << 20):.1f} MiB of text, more "
                           f"than the {MAX_LINE_BYTES >> 20} MiB one record may hold; split or "
                           "shorten it")


def check_prompt_completion(record: dict, where: str) -> None:
    """Both columns are strings of text and the completion is not empty (the loss is put
    on it)."""
    total = 0
    for key in PROMPT_COMPLETION:
        if not isinstance(record[key], str):
            raise DatasetError(f"{where}: '{key}' is {_kind(record[key])}; it must be a string")
        total += _text_bytes(record[key], f"'{key}'", where)
    if not record["completion"]:
        raise DatasetError(f"{where}: 'completion' is empty: there is nothing to learn")
    _check_size(total, where)


def check_messages(messages, where: str) -> None:
    """A conversation the loss can be put on: known roles, in the order chat templates expect.

    An optional first ``system`` message, then ``user`` and ``assistant`` turns alternating,
    starting with ``user``, with at least one ``assistant`` turn. Many templates raise on
    anything else, and the rest render it silently into a prompt the model never sees in use.
    """
    shape = "a list of {'role': str, 'content': str} objects"
    if not isinstance(messages, list) or not messages:
        got = "an empty list" if isinstance(messages, list) else _kind(messages)
        raise DatasetError(f"{where}: 'messages' must be {shape}, not {got}")
    for i, message in enumerate(messages):
        if not isinstance(message, dict):
            raise DatasetError(f"{where}: messages[{i}] is {_kind(message)}; 'messages' must be "
                               f"{shape}")
        for key in ("role", "content"):
            if not isinstance(message.get(key), str):
                got = "missing" if key not in message else _kind(message[key])
                valid = f"one of {', '.join(ROLES)}" if key == "role" else "a string"
                raise DatasetError(f"{where}: messages[{i}] '{key}' is {got}; it must be "
                                   f"{valid}")
    _check_size(sum(_text_bytes(m["content"], f"messages[{i}] 'content'", where)
                    for i, m in enumerate(messages)), where)
    expected = "user"
    for i, message in enumerate(messages):
        role = message["role"]
        if role not in ROLES:
            raise DatasetError(
                f"{where}: messages[{i}] has role {role!r}; valid roles: {', '.join(ROLES)}"
            )
        if role == "system" and i == 0:
            continue
        if role != expected:
            raise DatasetError(
                f"{where}: messages[{i}] is {role!r} where {expected!r} must come; valid order: "
                "an optional first 'system', then 'user' and 'assistant' alternating, "
                "starting with 'user'"
            )
        expected = "assistant" if role == "user" else "user"
    if not any(m["role"] == "assistant" for m in messages):
        raise DatasetError(f"{where}: no 'assistant' message: there is nothing to learn")


def _dataset_dir_records(path: Path) -> list[tuple[str, dict]]:
    try:
        import datasets
    except ImportError as err:  # pragma: no cover - datasets is a dependency
        raise DatasetError(f"{path}: reading a saved dataset needs `pip install datasets`") from err
    markers = (datasets.config.DATASET_STATE_JSON_FILENAME,
               datasets.config.DATASETDICT_JSON_FILENAME)
    if not any((path / name).is_file() for name in markers):
        held = sorted(p.name for p in path.iterdir())
        shown = ", ".join(held[:3]) + (", ..." if len(held) > 3 else "") if held else "nothing"
        raise DatasetError(
            f"{path}: a directory, but not one written by datasets' save_to_disk (it has "
            f"neither {' nor '.join(markers)}; it holds {shown}); pass the JSONL file itself, "
            "or save the dataset with save_to_disk")
    try:
        loaded = datasets.load_from_disk(str(path))
        if isinstance(loaded, datasets.DatasetDict):
            if "train" not in loaded:
                raise DatasetError(f"{path}: a DatasetDict needs a 'train' split; it has "
                                   f"{sorted(loaded)}")
            loaded = loaded["train"]
        return [(f"{path}[row {i}]", dict(row)) for i, row in enumerate(loaded)]
    except (OSError, ValueError) as err:  # pyarrow: ArrowInvalid, or OSError on a cut file
        raise DatasetError(
            f"{path}: not a directory written by datasets' save_to_disk, or one of its files "
            f"is damaged ({str(err).splitlines()[0][:160]}); save the dataset again"
        ) from None


# -- tokenizing -------------------------------------------------------------------------------

def tokenize_prompt_completion(tokenizer, record: dict, where: str) -> tuple[list[int], list[int]]:
    """Prompt tokens (labels ignored) then completion tokens and EOS (labels kept)."""
    check_prompt_completion(record, where)
    prompt, completion = record["prompt"], record["completion"]
    p = tokenizer(prompt, add_special_tokens=False)["input_ids"]
    c = tokenizer(completion, add_special_tokens=False)["input_ids"]
    if tokenizer.eos_token_id is not None:
        c = c + [tokenizer.eos_token_id]
    return p + c, [IGNORE] * len(p) + c


def tokenize_chat(tokenizer, record: dict, where: str) -> tuple[list[int], list[int]]:
    """The conversation through the chat template; labels only on assistant turns.

    Each assistant turn's characters are found by rendering the conversation up to it (with
    the generation prompt) and through it; the tokens starting inside those spans are labels.
    """
    check_messages(record["messages"], where)
    messages = [{"role": m["role"], "content": m["content"]} for m in record["messages"]]
    text = _render(tokenizer, messages, where)
    spans = []
    for i, message in enumerate(messages):
        if message["role"] != "assistant":
            continue
        before = _render(tokenizer, messages[:i], where, add_generation_prompt=True) if i else ""
        through = _render(tokenizer, messages[: i + 1], where)
        if not (text.startswith(before) and text.startswith(through)):
            raise DatasetError(
                f"{where}: the tokenizer's chat template renders a conversation differently "
                "from its beginning, so assistant turns cannot be located for the loss"
            )
        spans.append((len(before), len(through)))
    encoded = tokenizer(text, add_special_tokens=False, return_offsets_mapping=True)
    ids = encoded["input_ids"]
    labels = [
        tok if any(lo <= start < hi for lo, hi in spans) else IGNORE
        for tok, (start, _end) in zip(ids, encoded["offset_mapping"], strict=True)
    ]
    return ids, labels


def _render(tokenizer, messages: list[dict], where: str, add_generation_prompt: bool = False
            ) -> str:
    """The chat template's text; a template that refuses the conversation is named."""
    from jinja2 import TemplateError

    try:
        return tokenizer.apply_chat_template(messages, tokenize=False,
                                             add_generation_prompt=add_generation_prompt)
    except TemplateError as err:
        raise DatasetError(f"{where}: the tokenizer's chat template refuses this "
                           f"conversation: {err}") from err


def check_tokenizer(tokenizer, fmt: str, source: str) -> None:
    if fmt == "chat" and not getattr(tokenizer, "chat_template", None):
        raise DatasetError(
            f"{source}: the data is chat 'messages' but the tokenizer has no chat template; "
            "use a tokenizer with one (tokenizer_config.json 'chat_template' or "
            "chat_template.jinja) or prompt/completion data"
        )
    if fmt == "chat" and not getattr(tokenizer, "is_fast", False):
        raise DatasetError(f"{source}: chat data needs a fast tokenizer (tokenizer.json)")


def load_examples(path: str | Path, tokenizer, fmt: str = "auto",
                  max_length: int = 512) -> tuple[str, TokenRows]:
    """Read, check and tokenize a dataset; rows longer than ``max_length`` are cut."""
    if max_length < 2:
        raise InvalidParameter("max_length", max_length, "must be >= 2")
    fmt, records = read_records(path, fmt)
    check_tokenizer(tokenizer, fmt, str(path))
    tokenize = tokenize_chat if fmt == "chat" else tokenize_prompt_completion
    ids_rows, label_rows = [], []
    for where, record in records:
        ids, labels = tokenize(tokenizer, record, where)
        ids, labels = ids[:max_length], labels[:max_length]
        if sum(1 for t in labels[1:] if t != IGNORE) == 0:
            continue  # the prompt alone fills max_length: no completion token is left
        ids_rows.append(ids)
        label_rows.append(labels)
    if not ids_rows:
        raise DatasetError(
            f"{path}: every example's prompt fills max_length={max_length}; raise max_length"
        )
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    return fmt, TokenRows(ids_rows, label_rows, pad if pad is not None else 0)


def pack(rows: TokenRows, max_length: int) -> TokenRows:
    """Concatenate examples into rows of ``max_length`` tokens (fewer pads, steadier steps).

    Labels keep their masks, so the loss stays on completions; attention spans example
    boundaries within a row, as in TRL's default packing.
    """
    packed_ids, packed_labels = [], []
    ids_buf: list[int] = []
    labels_buf: list[int] = []
    for ids, labels in zip(rows.input_ids, rows.labels, strict=True):
        ids_buf += ids
        labels_buf += labels
        while len(ids_buf) >= max_length:
            packed_ids.append(ids_buf[:max_length])
            packed_labels.append(labels_buf[:max_length])
            ids_buf, labels_buf = ids_buf[max_length:], labels_buf[max_length:]
    if ids_buf:
        packed_ids.append(ids_buf)
        packed_labels.append(labels_buf)
    return TokenRows(packed_ids, packed_labels, rows.pad_id)


def split(rows: TokenRows, eval_fraction: float, seed: int) -> tuple[TokenRows, TokenRows | None]:
    """A seeded train/eval split; ``eval_fraction`` 0 means no eval set."""
    if not 0.0 <= eval_fraction < 1.0:
        raise InvalidParameter("eval_fraction", eval_fraction, "must be in [0, 1)")
    if eval_fraction == 0:
        return rows, None
    order = list(range(len(rows)))
    random.Random(seed).shuffle(order)
    n_eval = len(rows) - train_count(len(rows), eval_fraction)
    return rows.subset(sorted(order[n_eval:])), rows.subset(sorted(order[:n_eval]))


def train_count(examples: int, eval_fraction: float) -> int:
    """How many of ``examples`` :func:`split` keeps for training (at least one is held out
    for eval when ``eval_fraction`` > 0); none left is refused."""
    if eval_fraction == 0:
        return examples
    n_eval = max(1, round(eval_fraction * examples))
    if n_eval >= examples:
        raise InvalidParameter(
            "eval_fraction", eval_fraction,
            f"leaves no training example out of {examples}; lower it or add data",
        )
    return examples - n_eval


def check_batch_size(batch_size: int, train_examples: int) -> None:
    """A batch is drawn from the training examples without repeats within it."""
    if batch_size > train_examples:
        raise InvalidParameter("batch_size", batch_size,
                               f"must be at most the {train_examples} training examples")

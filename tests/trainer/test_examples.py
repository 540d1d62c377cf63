"""Data for real fine-tunes: the three formats, completion-only labels, packing, bad input."""

from __future__ import annotations

import json

import pytest
from transformers import AutoTokenizer

from draslice.errors import DatasetError, InvalidParameter
from draslice.trainer.data.examples import IGNORE, detect_format, load_examples, pack, split


@pytest.fixture(scope="module")
def tok(tiny_llama):
    return AutoTokenizer.from_pretrained(tiny_llama, local_files_only=True)


def _labelled(ids, labels):
    return [i for i, lab in zip(ids, labels, strict=True) if lab != IGNORE]


def test_prompt_completion_labels_are_exactly_the_completion_and_eos(tmp_path, tok):
    path = tmp_path / "d.jsonl"
    path.write_text(json.dumps({"prompt": "reverse: red blue\nanswer:",
                                "completion": " blue red"}) + "\n")
    fmt, rows = load_examples(path, tok)
    assert fmt == "prompt-completion"
    ids, labels = rows.input_ids[0], rows.labels[0]
    prompt = tok("reverse: red blue\nanswer:", add_special_tokens=False)["input_ids"]
    completion = tok(" blue red", add_special_tokens=False)["input_ids"] + [tok.eos_token_id]
    assert ids == prompt + completion
    assert labels[: len(prompt)] == [IGNORE] * len(prompt)
    assert labels[len(prompt):] == completion


def test_chat_labels_only_the_assistant_turns(tmp_path, tok):
    messages = [
        {"role": "system", "content": "be brief"},
        {"role": "user", "content": "reverse: red blue"},
        {"role": "assistant", "content": "blue red"},
        {"role": "user", "content": "again: one two"},
        {"role": "assistant", "content": "two one"},
    ]
    path = tmp_path / "c.jsonl"
    path.write_text(json.dumps({"messages": messages}) + "\n")
    fmt, rows = load_examples(path, tok)
    assert fmt == "chat"
    ids, labels = rows.input_ids[0], rows.labels[0]
    assert ids == tok(tok.apply_chat_template(messages, tokenize=False),
                      add_special_tokens=False)["input_ids"]
    learned = tok.decode(_labelled(ids, labels))
    assert learned == "blue red<|im_end|>\ntwo one<|im_end|>\n"
    assert "reverse" not in learned and "be brief" not in learned


def test_saved_dataset_dir_gives_the_same_rows_as_jsonl(demo_data, tok):
    assert detect_format(demo_data["datasets"]) == "datasets"
    _, from_dir = load_examples(demo_data["datasets"], tok)
    fmt, from_jsonl = load_examples(demo_data["prompt-completion"], tok)
    assert fmt == "prompt-completion"
    assert from_dir.input_ids == from_jsonl.input_ids
    assert from_dir.labels == from_jsonl.labels


def test_max_length_cuts_and_packing_keeps_every_token_and_label(demo_data, tok):
    _, rows = load_examples(demo_data["prompt-completion"], tok, max_length=64)
    packed = pack(rows, 64)
    assert all(len(r) == 64 for r in packed.input_ids[:-1])
    assert 0 < len(packed.input_ids[-1]) <= 64
    assert len(packed) < len(rows)
    flat = [t for r in rows.input_ids for t in r]
    assert [t for r in packed.input_ids for t in r] == flat
    assert packed.label_tokens == rows.label_tokens
    _, short = load_examples(demo_data["prompt-completion"], tok, max_length=20)
    assert max(len(r) for r in short.input_ids) == 20
    assert short.label_tokens < rows.label_tokens
    with pytest.raises(DatasetError, match="every example's prompt fills max_length=4"):
        load_examples(demo_data["prompt-completion"], tok, max_length=4)


def test_collate_pads_with_mask_and_ignored_labels(demo_data, tok):
    _, rows = load_examples(demo_data["chat"], tok)
    batch = rows.collate([0, 1, 2])
    n0 = len(rows.input_ids[0])
    assert batch["input_ids"].shape[1] % 8 == 0
    assert int(batch["attention_mask"][0].sum()) == n0
    assert (batch["labels"][0, n0:] == IGNORE).all()
    assert batch["input_ids"][0, n0:].eq(rows.pad_id).all()
    assert rows.collate([0], pad_to=256)["input_ids"].shape[1] == 256


def test_split_is_seeded_and_disjoint(demo_data, tok):
    _, rows = load_examples(demo_data["prompt-completion"], tok)
    train, held = split(rows, 0.25, seed=3)
    assert len(held) == 32 and len(train) == 96
    again, held2 = split(rows, 0.25, seed=3)
    assert held.input_ids == held2.input_ids
    with pytest.raises(InvalidParameter, match="eval_fraction"):
        split(rows, 1.0, seed=0)


@pytest.mark.parametrize(
    ("content", "message"),
    [
        ('{"prompt": "a", "completion": "b"}\n{"prompt": "c", "completion": \n',
         r"d\.jsonl:2: not valid JSON"),
        ("", r"d\.jsonl: the file is empty"),
        ("\n\n", r"d\.jsonl: the file is empty"),
        ('{"prompt": "a", "answer": "b"}\n', r"d\.jsonl:1: found columns \['answer', 'prompt'\]"),
        ('{"prompt": "a", "completion": "b"}\n{"prompt": "c"}\n',
         r"d\.jsonl:2: missing column\(s\) \['completion'\]"),
        ('[1, 2]\n', r"d\.jsonl:1: expected a JSON object, got list"),
        ('{"messages": [{"role": "user", "content": "hi"}]}\n', r"d\.jsonl:1: no 'assistant'"),
        ('{"messages": "hi"}\n', r"d\.jsonl:1: 'messages' must be a list"),
    ],
    ids=["malformed-line", "empty", "blank-lines", "unknown-columns", "missing-column",
         "not-an-object", "no-assistant", "messages-not-a-list"],
)
def test_bad_data_is_named_by_file_and_line(tmp_path, tok, content, message):
    path = tmp_path / "d.jsonl"
    path.write_text(content)
    with pytest.raises(DatasetError, match=message):
        load_examples(path, tok)


def test_chat_data_needs_a_chat_template(tmp_path, tiny_gpt2, demo_data):
    tok = AutoTokenizer.from_pretrained(tiny_gpt2, local_files_only=True)
    tok.chat_template = None
    with pytest.raises(DatasetError, match="no chat template"):
        load_examples(demo_data["chat"], tok)


def test_a_directory_that_is_not_a_saved_dataset_is_named(tmp_path, tok):
    with pytest.raises(DatasetError, match="a directory, but not one written by datasets"):
        load_examples(tmp_path, tok)
    with pytest.raises(DatasetError, match="no such file"):
        load_examples(tmp_path / "missing.jsonl", tok)

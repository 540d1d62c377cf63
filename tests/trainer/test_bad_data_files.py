"""Issue 37, 4 and 5: --data that is no regular file, and lines that break the JSON parser or
the tokenizer, are named (file, line, what it is) before the model loads; none hangs.

The special files are real ones made with the system's own calls (mkfifo, a bound Unix
socket, symlinks, /dev/zero); the bad lines are the bytes the issue's user wrote.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys

import pytest

from draslice.tests.trainer.test_bad_input import _cli, _one_error_line
from draslice.trainer.data.examples import MAX_LINE_BYTES

GOOD = json.dumps({"prompt": "a", "completion": "b"}) + "\n"


def test_a_named_pipe_is_named_without_waiting_for_a_writer(tiny_gpt2, tmp_path):
    """In a process of its own, so that a run that opened the pipe (and waited for a writer
    forever) fails the test on its timeout instead of hanging the suite."""
    fifo = tmp_path / "train.jsonl"
    os.mkfifo(fifo)
    done = subprocess.run(
        [sys.executable, "-c", "from draslice.cli import main; main()", "train",
         "--output-dir", str(tmp_path / "out"), "--model-dir", str(tiny_gpt2), "--data",
         str(fifo), "--device", "cpu"],
        capture_output=True, text=True, timeout=120, env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert done.returncode == 2, done
    errors = [line for line in done.stderr.splitlines() if line.startswith("error: ")]
    assert errors == [f"error: {fifo}: a named pipe (FIFO), not a data file; the data must be a "
                      "JSONL file or a directory written by datasets' save_to_disk"]
    assert not (tmp_path / "out").exists()


def _socket_file(tmp_path):
    path = tmp_path / "data.sock"
    server = socket.socket(socket.AF_UNIX)
    server.bind(str(path))
    return path, server


@pytest.mark.parametrize(("kind", "words"), [
    ("device", "/dev/zero: a character device, not a data file"),
    ("socket", "data.sock: a socket, not a data file"),
    ("loop", "a.jsonl: a symlink loop (too many levels of symbolic links)"),
    ("dangling", "a.jsonl: a symlink to 'gone.jsonl', which does not exist"),
    ("folder", "a directory, but not one written by datasets' save_to_disk (it has neither "
               "state.json nor dataset_dict.json; it holds part-1.jsonl, part-2.jsonl)"),
])
def test_data_that_is_no_regular_file_says_what_it_is(tiny_gpt2, tmp_path, no_model_load, kind,
                                                      words):
    server = None
    if kind == "device":
        data = "/dev/zero"  # read as JSONL it is one endless line
    elif kind == "socket":
        data, server = _socket_file(tmp_path)
    elif kind == "loop":
        data = tmp_path / "a.jsonl"
        os.symlink(tmp_path / "b.jsonl", data)
        os.symlink(data, tmp_path / "b.jsonl")
    elif kind == "dangling":
        data = tmp_path / "a.jsonl"
        os.symlink("gone.jsonl", data)
    else:
        data = tmp_path / "shards"
        data.mkdir()
        for name in ("part-1.jsonl", "part-2.jsonl"):
            (data / name).write_text(GOOD)
    try:
        extra = ["(the training data)"] if kind in ("loop", "dangling") else []
        _one_error_line(_cli(tmp_path / "out", tiny_gpt2, data), words, *extra)
    finally:
        if server is not None:
            server.close()
    assert not (tmp_path / "out").exists()


def _data(tmp_path, bad_line: str, first: str = GOOD):
    data = tmp_path / "d.jsonl"
    data.write_text(first + bad_line + "\n")
    return data


def test_deeply_nested_json_is_a_line_not_a_recursion_error(tiny_gpt2, tmp_path,
                                                            no_model_load):
    data = _data(tmp_path, "[" * 200_000)
    _one_error_line(_cli(tmp_path / "out", tiny_gpt2, data), "d.jsonl:2: JSON nested deeper "
                    "than the reader can follow (Python's recursion limit")


def test_a_number_of_more_digits_than_python_converts_is_named(tiny_gpt2, tmp_path,
                                                               no_model_load):
    data = _data(tmp_path, '{"prompt": 1' + "0" * 5000 + ', "completion": "b"}')
    _one_error_line(_cli(tmp_path / "out", tiny_gpt2, data), "d.jsonl:2: not valid JSON",
                    "4300 digits")


@pytest.mark.parametrize(("line", "first", "words"), [
    ('{"prompt": "caf\\ud800", "completion": "b"}', GOOD,
     "d.jsonl:2: 'prompt' holds a lone surrogate ('\\ud800' at character 3)"),
    ('{"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": '
     '"\\udc00yo"}]}',
     json.dumps({"messages": [{"role": "user", "content": "a"},
                              {"role": "assistant", "content": "b"}]}) + "\n",
     "d.jsonl:2: messages[1] 'content' holds a lone surrogate ('\\udc00' at character 0)"),
], ids=["prompt", "chat"])
def test_a_lone_surrogate_is_named_before_the_tokenizer_meets_it(tiny_llama, tmp_path,
                                                                 no_model_load, line, first,
                                                                 words):
    _one_error_line(_cli(tmp_path / "out", tiny_llama, _data(tmp_path, line, first)), words,
                    "half of a UTF-16 pair")


def test_a_line_past_the_limit_is_refused_without_reading_it_whole(tiny_gpt2, tmp_path,
                                                                   no_model_load):
    """The issue's 54 MB line took 10 GB to train; this one is refused after 4 MiB, and an
    endless line (no newline ever) would be too."""
    data = _data(tmp_path, json.dumps({"prompt": "x" * (MAX_LINE_BYTES + 10), "completion": "y"}))
    _one_error_line(_cli(tmp_path / "out", tiny_gpt2, data),
                    "d.jsonl:2: the line is longer than 4 MiB, the most one record may hold")
    data.write_text(GOOD + json.dumps({"prompt": "x" * (MAX_LINE_BYTES - 100),
                                       "completion": "y"}) + "\n")
    from draslice.trainer.data.examples import read_records

    assert len(read_records(data)[1]) == 2  # just under the limit is read


def test_a_saved_dataset_row_past_the_limit_is_refused(tiny_gpt2, tmp_path, no_model_load):
    import datasets

    data = tmp_path / "saved"
    datasets.Dataset.from_list([{"prompt": "a", "completion": "b"},
                                {"prompt": "x" * (MAX_LINE_BYTES + 1), "completion": "y"}]
                               ).save_to_disk(str(data))
    _one_error_line(_cli(tmp_path / "out", tiny_gpt2, data),
                    f"{data}[row 1]: the record holds 4.0 MiB of text, more than the 4 MiB")

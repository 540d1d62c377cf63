"""Issue 14's trainer-side bad input: one line, exit 2, before any work, nothing half-written.

Each case runs `draslice train` (or the function it calls) the way a user would and checks the
line, the exit code and that the output folder holds nothing new. The disk-full cases use
real writers into a per-file size limit (RLIMIT_FSIZE: the kernel refuses the bytes, and
safetensors and torch.save fail with their own errors) and, where a failure must land at one
exact moment of a write, a writer patched to raise ENOSPC half-way (a real disk cannot be
filled on demand at that moment).
"""

from __future__ import annotations

import errno
import json
import os
import resource
import shutil
import tempfile
from contextlib import contextmanager
from pathlib import Path

import pytest
import torch
from click.testing import CliRunner

from draslice.cli import main
from draslice.errors import DrasliceError, InvalidParameter, OutputWriteError
from draslice.tests.scratch import write_demo_data
from draslice.trainer import checkpoint, fingerprint, outputs
from draslice.trainer.config import FINETUNE_KNOBS, KNOBS, SFTConfig
from draslice.trainer.outputs import CHECKPOINT_DIR, REFERENCE_FILE, RUN_FILE
from draslice.trainer.presets import FINETUNE
from draslice.trainer.sft import train
from draslice.trainer.tasks.validate import check_adapter

QUIET = {"log": lambda _line: None}


def _cfg(model, data, **kw) -> SFTConfig:
    args = dict(model_dir=str(model), data=str(data), steps=4, checkpoint_every=2,
                device="cpu", batch_size=4, max_length=48, log_every=1000)
    return SFTConfig(**{**args, **kw})


def _cli(out, model, data, *extra: str):
    return CliRunner().invoke(main, [
        "train", "--output-dir", str(out), "--model-dir", str(model), "--data", str(data),
        "--device", "cpu", "--steps", "2", "--batch-size", "4", "--max-length", "48", *extra])


def _config_defaults(*passed: str) -> list[str]:
    """The flags that set what the finetune preset changes, but the knobs ``passed``, back to
    the config's defaults: the knobs ``train()`` gets here, so the command continues a run
    the function started."""
    flags = []
    for name in FINETUNE.fill({n: KNOBS[n].default for n in passed}, FINETUNE_KNOBS):
        default = KNOBS[name].default
        spelled = "--" + name.replace("_", "-")
        if isinstance(default, bool):
            flags.append(spelled if default else f"--no-{spelled[2:]}")
        else:
            flags += [spelled, str(default)]
    return flags


def _one_error_line(result, *words: str) -> str:
    """The CLI's whole stderr is one ``error:`` line holding ``words``; exit code 2."""
    assert result.exit_code == 2, (result.exit_code, result.output, result.exception)
    lines = [line for line in result.output.splitlines() if line.startswith("error: ")]
    assert len(lines) == 1, result.output
    assert "Traceback" not in result.output
    for word in words:
        assert word in lines[0], lines[0]
    return lines[0]


@pytest.fixture(scope="module")
def finished(tiny_gpt2, demo_data, tmp_path_factory):
    """A whole 4-step run with checkpoints at steps 2 and 4; tests work on copies."""
    out = tmp_path_factory.mktemp("finished") / "out"
    data = demo_data["prompt-completion"]
    train(_cfg(tiny_gpt2, data), out, out / "metrics.jsonl", **QUIET)
    return out


def _copy(finished, tmp_path) -> Path:
    out = tmp_path / "out"
    shutil.copytree(finished, out)
    return out


# -- data ---------------------------------------------------------------------------------------

def test_binary_data_names_file_line_and_byte_offset(tiny_gpt2, tmp_path):
    data = tmp_path / "d.jsonl"
    first = b'{"prompt": "a", "completion": "b"}\n'
    data.write_bytes(first + b'{"prompt": "\xff\xfe"}\n')
    out = tmp_path / "out"
    result = _cli(out, tiny_gpt2, data)
    offset = len(first) + len(b'{"prompt": "')
    _one_error_line(result, "d.jsonl:2: not UTF-8 text", f"byte 0xff at byte offset {offset}",
                    "JSONL (UTF-8")
    assert not out.exists()  # the folder made for the run is taken back


@pytest.mark.parametrize(("messages", "words"), [
    ([{"role": "human", "content": "hi"}, {"role": "assistant", "content": "yo"}],
     ["messages[0] has role 'human'", "valid roles: system, user, assistant"]),
    ([{"role": "assistant", "content": "yo"}, {"role": "user", "content": "hi"}],
     ["messages[0] is 'assistant' where 'user' must come", "alternating"]),
    ([{"role": "user", "content": "a"}, {"role": "user", "content": "b"},
      {"role": "assistant", "content": "c"}],
     ["messages[1] is 'user' where 'assistant' must come"]),
    ([{"role": "user", "content": "a"}, {"role": "system", "content": "b"},
      {"role": "assistant", "content": "c"}],
     ["messages[1] is 'system'", "an optional first 'system'"]),
], ids=["unknown-role", "assistant-first", "user-twice", "system-later"])
def test_chat_with_unknown_role_or_out_of_order_names_the_line(tiny_llama, tmp_path, messages,
                                                               words):
    data = tmp_path / "chat.jsonl"
    good = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "yo"}]
    data.write_text(json.dumps({"messages": good}) + "\n" + json.dumps({"messages": messages})
                    + "\n")
    _one_error_line(_cli(tmp_path / "out", tiny_llama, data), "chat.jsonl:2:", *words)
    assert not (tmp_path / "out").exists()


def test_a_saved_dataset_with_a_damaged_file_is_named(tiny_gpt2, demo_data, tmp_path):
    data = tmp_path / "saved"
    shutil.copytree(demo_data["datasets"], data)
    arrow = next(data.glob("*.arrow"))
    arrow.write_bytes(b"\xff" * 200)  # pyarrow raises OSError on it, not a ValueError
    _one_error_line(_cli(tmp_path / "out", tiny_gpt2, data), f"{data}: not a directory written "
                    "by datasets' save_to_disk, or one of its files is damaged",
                    "save the dataset again")
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize(("record", "words"), [
    ({"messages": [{"role": "user", "content": None}, {"role": "assistant", "content": "yo"}]},
     ["messages[0] 'content' is null", "must be a string"]),
    ({"messages": [{"content": "hi"}, {"role": "assistant", "content": "yo"}]},
     ["messages[0] 'role' is missing", "one of system, user, assistant"]),
    ({"messages": [{"role": "user", "content": "hi"}, "yo"]},
     ["messages[1] is a string", "{'role': str, 'content': str}"]),
    ({"messages": []}, ["'messages' must be a list", "not an empty list"]),
    ({"prompt": "a", "completion": 5}, ["'completion' is a number", "must be a string"]),
    ({"prompt": None, "completion": "b"}, ["'prompt' is null"]),
], ids=["content-null", "role-missing", "message-not-object", "no-messages", "completion-number",
        "prompt-null"])
def test_a_malformed_record_names_the_line_and_field_before_the_model_loads(
        tiny_llama, tmp_path, no_model_load, record, words):
    data = tmp_path / "d.jsonl"
    turns = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "yo"}]
    good = {"messages": turns} if "messages" in record else {"prompt": "a", "completion": "b"}
    data.write_text(json.dumps(good) + "\n" + json.dumps(record) + "\n")
    _one_error_line(_cli(tmp_path / "out", tiny_llama, data), "d.jsonl:2:", *words)
    assert not (tmp_path / "out").exists()


def test_batch_larger_than_the_training_records_is_refused_before_the_model_loads(
        tiny_gpt2, demo_data, tmp_path, no_model_load):
    data = demo_data["prompt-completion"]  # 128 records; a tenth held out leaves 115
    _one_error_line(_cli(tmp_path / "out", tiny_gpt2, data, "--batch-size", "116",
                         "--eval-fraction", "0.1"),
                    "invalid batch_size=116", "at most the 115 training examples")


# -- output folder ------------------------------------------------------------------------------

def test_empty_output_dir_is_refused_and_nothing_lands_in_the_cwd(tiny_gpt2, demo_data, tmp_path,
                                                                  monkeypatch):
    monkeypatch.chdir(tmp_path)
    result = _cli("", tiny_gpt2, demo_data["prompt-completion"])
    _one_error_line(result, "invalid output_dir=''", "must name a folder")
    assert list(tmp_path.iterdir()) == []


@contextmanager
def _without_write_permission():
    """Drop the effective uid to nobody when root (root writes through any mode bits), so the
    kernel, not a stub, refuses the write; restored on the way out. The command's module is
    imported first: nobody cannot read root's Python installation."""
    import draslice.cli.commands.steps_cmd  # noqa: F401

    if os.geteuid() != 0:
        yield
        return
    os.seteuid(65534)
    try:
        yield
    finally:
        os.seteuid(0)


@pytest.fixture
def shared_tmp():
    """A folder the unprivileged user can reach (pytest's own tmp tree is root-only)."""
    path = Path(tempfile.mkdtemp(prefix="draslice-test-"))
    path.chmod(0o755)
    yield path
    shutil.rmtree(path, ignore_errors=True)


def test_read_only_output_dir_is_one_line_before_loading(tiny_gpt2, demo_data, shared_tmp):
    ro = shared_tmp / "ro"
    ro.mkdir()
    ro.chmod(0o555)
    data = shared_tmp / "pc.jsonl"
    shutil.copy(demo_data["prompt-completion"], data)
    data.chmod(0o644)
    with _without_write_permission():
        into = _cli(ro, tiny_gpt2, data)
        below = _cli(ro / "run1", tiny_gpt2, data)
        unreachable = _cli(Path(tiny_gpt2).parent / "out", tiny_gpt2, data)
    _one_error_line(into, f"invalid output_dir='{ro}'", "cannot write there (Permission denied)")
    _one_error_line(below, f"invalid output_dir='{ro / 'run1'}'", "Permission denied")
    _one_error_line(unreachable, "invalid output_dir=", "Permission denied")
    assert list(ro.iterdir()) == []


# -- model folder -------------------------------------------------------------------------------

def _model_copy(model: Path, tmp_path: Path, drop: tuple[str, ...] = ()) -> Path:
    copy = tmp_path / "model"
    shutil.copytree(model, copy, ignore=shutil.ignore_patterns(*drop) if drop else None)
    return copy


@pytest.mark.parametrize("damage", ["truncated", "bad-header-length"])
def test_corrupt_safetensors_weights_are_named(tiny_gpt2, demo_data, tmp_path, damage):
    model = _model_copy(tiny_gpt2, tmp_path)
    weights = model / "model.safetensors"
    raw = weights.read_bytes()
    weights.write_bytes(raw[: len(raw) // 2] if damage == "truncated" else b"\xff" * 8 + raw[8:])
    _one_error_line(_cli(tmp_path / "out", model, demo_data["prompt-completion"]),
                    f"{weights}: not a whole safetensors file", "copy it again")
    assert not (tmp_path / "out").exists()


TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja",
                   "special_tokens_map.json")


def test_model_without_tokenizer_files_is_named_not_raise_max_length(tiny_gpt2, demo_data,
                                                                     tmp_path):
    model = _model_copy(tiny_gpt2, tmp_path, drop=TOKENIZER_FILES)
    line = _one_error_line(_cli(tmp_path / "out", model, demo_data["prompt-completion"]),
                           f"{model}: no tokenizer files", "tokenizer.json",
                           "tokenizer.save_pretrained")
    assert "max_length" not in line


def test_advise_says_the_same_about_missing_tokenizer_files(tiny_gpt2, demo_data, tmp_path):
    model = _model_copy(tiny_gpt2, tmp_path, drop=TOKENIZER_FILES)
    result = CliRunner().invoke(main, [
        "advise", "--model-dir", str(model), "--data", str(demo_data["prompt-completion"]),
        "--device", "cpu", "--max-length", "48", "--batch-size", "4"])
    line = _one_error_line(result, f"{model}: no tokenizer files")
    assert "max_length" not in line


def test_a_tokenizer_with_an_empty_vocabulary_is_refused_when_loaded(tiny_gpt2, tmp_path):
    from draslice.errors import ModelLoadError
    from draslice.trainer.model import load_tokenizer

    model = _model_copy(tiny_gpt2, tmp_path, drop=TOKENIZER_FILES)
    (model / "vocab.txt").write_text("")  # a file of the right name with nothing in it
    with pytest.raises(ModelLoadError, match="no tokenizer files"):
        load_tokenizer(model)


@pytest.mark.parametrize("name", ["tokenizer.json", "tokenizer_config.json"])
def test_a_corrupt_tokenizer_file_is_named_before_any_work(tiny_gpt2, demo_data, tmp_path, name):
    model = _model_copy(tiny_gpt2, tmp_path)
    raw = (model / name).read_bytes()
    (model / name).write_bytes(raw[: len(raw) // 2])  # a copy that stopped part-way
    _one_error_line(_cli(tmp_path / "out", model, demo_data["prompt-completion"]),
                    f"{model / name}: not valid JSON", "copy the tokenizer files again")
    assert not (tmp_path / "out").exists()


def test_chat_data_for_a_tokenizer_without_a_template_is_refused_before_the_model_loads(
        tiny_gpt2, demo_data, tmp_path, no_model_load):
    model = _model_copy(tiny_gpt2, tmp_path, drop=("chat_template.jinja",))
    config = json.loads((model / "tokenizer_config.json").read_text())
    assert "chat_template" not in config  # the template lived only in the dropped file
    _one_error_line(_cli(tmp_path / "out", model, demo_data["chat"]),
                    "the tokenizer has no chat template", "prompt/completion data")


def test_a_run_that_fails_after_the_checks_leaves_no_folder_behind(tiny_gpt2, demo_data,
                                                                   tmp_path):
    """Every prompt filling max_length is found only by tokenizing (after the model load):
    the folders the run made for itself are not left behind empty."""
    out = tmp_path / "new" / "out"
    _one_error_line(_cli(out, tiny_gpt2, demo_data["prompt-completion"], "--max-length", "3"),
                    "every example's prompt fills max_length=3")
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("arch", ["gpt2", "llama"])
def test_max_length_past_the_models_positions_is_refused(tiny_gpt2, tiny_llama, demo_data,
                                                         tmp_path, arch):
    """GPT-2 would index past its position table; a RoPE model would train past its range."""
    model = tiny_gpt2 if arch == "gpt2" else tiny_llama
    key = "n_positions" if arch == "gpt2" else "max_position_embeddings"
    result = _cli(tmp_path / "out", model, demo_data["prompt-completion"], "--max-length", "600",
                  "--pack")
    _one_error_line(result, "invalid max_length=600", "at most the model's 512 positions",
                    f"config.json {key}")


def test_rope_scaling_extends_the_position_limit(tiny_llama, tmp_path):
    from draslice.trainer.model import check_max_length, position_limit

    model = _model_copy(tiny_llama, tmp_path)
    config = json.loads((model / "config.json").read_text())
    config["rope_scaling"] = {"rope_type": "yarn", "factor": 4.0,
                              "original_max_position_embeddings": 512}
    (model / "config.json").write_text(json.dumps(config))
    assert position_limit(model)[0] == 2048
    check_max_length(model, 2048)
    with pytest.raises(InvalidParameter, match="rope_scaling factor 4.0"):
        check_max_length(model, 2049)


# -- full disk ----------------------------------------------------------------------------------

@contextmanager
def _file_size_limit(limit: int):
    """RLIMIT_FSIZE: the kernel refuses to grow any file past ``limit`` bytes (EFBIG; Python
    ignores SIGXFSZ), the closest a test gets to a disk that fills mid-write."""
    soft, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
    resource.setrlimit(resource.RLIMIT_FSIZE, (limit, hard))
    try:
        yield
    finally:
        resource.setrlimit(resource.RLIMIT_FSIZE, (soft, hard))


@pytest.mark.parametrize(("limit", "writer"), [(30_000, "safetensors"), (100_000, "torch.save")])
def test_real_writers_failing_mid_checkpoint_end_in_one_line(tiny_gpt2, demo_data, tmp_path,
                                                             limit, writer):
    """The adapter (~67 KB) fails in safetensors under 30 KB; state.pt (~200 KB) fails in
    torch.save's inline_container.cc under 100 KB. Either way: one line, no partial folder."""
    out = tmp_path / "out"
    with _file_size_limit(limit), pytest.raises(OutputWriteError) as err:
        train(_cfg(tiny_gpt2, demo_data["prompt-completion"]), out, out / "metrics.jsonl",
              **QUIET)
    message = str(err.value)
    assert "cannot write checkpoint step-00000002" in message and "MiB free there" in message
    cause = type(err.value.__cause__).__name__
    if writer == "safetensors":  # a Rust io::Error carries the errno's words
        assert cause == "SafetensorError" and "File too large" in message
    else:  # torch's stream writer says only that the write failed
        assert cause == "RuntimeError" and "could not be written whole" in message
        assert "inline_container" in str(err.value.__cause__)
    root = out / CHECKPOINT_DIR
    assert [p.name for p in root.iterdir()] == []  # no .tmp-, no step-
    assert not (out / RUN_FILE).exists()


@pytest.fixture
def small_disk(tmp_path):
    """A real 400 KiB filesystem (tmpfs), so the kernel answers ENOSPC; skipped where this
    process may not mount (it needs root with CAP_SYS_ADMIN, as on the CI machine)."""
    import subprocess

    where = tmp_path / "small"
    where.mkdir()
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=400k", "tmpfs", str(where)],
                             capture_output=True, check=False)
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {mounted.stderr.decode().strip()}")
    try:
        yield where
    finally:
        subprocess.run(["umount", "-l", str(where)], check=False)


def test_a_real_full_disk_mid_run_then_more_space_resumes(tiny_gpt2, demo_data, small_disk):
    """One 6-step run with checkpoints every 2 steps needs ~0.7 MiB; the disk has 400 KiB.
    After the disk grows, the same command resumes from the whole checkpoint and finishes."""
    import subprocess

    out = small_disk / "out"
    # LoRA r 8: the checkpoint size the 400 KiB were chosen for (the preset's r 16 is twice)
    args = ["--checkpoint-every", "2", "--steps", "6", "--log-every", "1000", "--lora-r", "8",
            "--lora-alpha", "16"]
    full = _cli(out, tiny_gpt2, demo_data["prompt-completion"], *args)
    line = _one_error_line(full, "cannot write checkpoint step-0000000", f"in {out}/checkpoints",
                           "MiB free there")
    assert "No space left on device" in line or "could not be written whole" in line
    whole = checkpoint.completed(out / CHECKPOINT_DIR)
    assert whole and all(checkpoint.whole_problem(p) is None for p in whole)
    assert not list(out.rglob(f"{outputs.TMP_PREFIX}*"))
    subprocess.run(["mount", "-o", "remount,size=4m", str(small_disk)], check=True)
    again = _cli(out, tiny_gpt2, demo_data["prompt-completion"], *args)
    assert again.exit_code == 0, again.output
    assert f"resumed at step {int(whole[-1].name.removeprefix('step-'))}" in again.output
    assert outputs.read_record(out)[1] is None


def _enospc_after(fraction: float, target: str):
    """A torch.save that writes ``fraction`` of the bytes for files named ``target``, then
    raises ENOSPC as a full disk does half-way through a write."""
    real = torch.save

    def save(obj, f, *args, **kwargs):
        if Path(f).name.endswith(target):
            real(obj, f, *args, **kwargs)
            data = Path(f).read_bytes()
            Path(f).write_bytes(data[: int(len(data) * fraction)])
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        return real(obj, f, *args, **kwargs)

    return save


def test_disk_full_at_a_checkpoint_then_the_rerun_resumes_from_the_whole_one(
        tiny_gpt2, demo_data, tmp_path, monkeypatch):
    out = tmp_path / "out"
    cfg = _cfg(tiny_gpt2, demo_data["prompt-completion"], steps=6)
    calls = {"n": 0}
    real = torch.save

    def full_on_the_second(obj, f, *args, **kwargs):
        if Path(f).name == checkpoint.STATE_FILE:
            calls["n"] += 1
            if calls["n"] == 2:
                return _enospc_after(0.5, checkpoint.STATE_FILE)(obj, f, *args, **kwargs)
        return real(obj, f, *args, **kwargs)

    monkeypatch.setattr(torch, "save", full_on_the_second)
    with pytest.raises(OutputWriteError, match=r"cannot write checkpoint step-00000004 in .*"
                                               r"No space left on device; [0-9.]+ MiB free"):
        train(cfg, out, out / "metrics.jsonl", **QUIET)
    monkeypatch.setattr(torch, "save", real)
    root = out / CHECKPOINT_DIR
    assert [p.name for p in root.iterdir()] == ["step-00000002"]
    assert checkpoint.whole_problem(root / "step-00000002") is None
    with (out / "metrics.jsonl").open("a") as metrics:
        metrics.write('{"step": 5, "lo')  # a metrics line the full disk cut short
    lines: list[str] = []
    result = train(cfg, out, out / "metrics.jsonl", log=lines.append)
    assert result.resumed_from_step == 2
    assert any("resumed at step 2" in line for line in lines)
    steps = [json.loads(x)["step"] for x in (out / "metrics.jsonl").read_text().splitlines()]
    assert steps == list(range(1, 7))


def test_disk_full_in_the_final_save_leaves_no_record_and_validate_fails(
        finished, demo_data, tiny_gpt2, tmp_path, monkeypatch):
    """A rerun into a finished folder that fills up while writing the reference logits: the
    previous record is gone, the half-written file is removed, validate says FAIL."""
    out = _copy(finished, tmp_path)
    shutil.rmtree(out / CHECKPOINT_DIR)  # a fresh run, not a resume
    monkeypatch.setattr(torch, "save", _enospc_after(0.3, REFERENCE_FILE))
    with pytest.raises(OutputWriteError, match=f"cannot write {REFERENCE_FILE}"):
        train(_cfg(tiny_gpt2, demo_data["prompt-completion"], steps=2, checkpoint_every=0),
              out, out / "metrics.jsonl", **QUIET)
    monkeypatch.undo()
    assert not (out / RUN_FILE).exists()
    assert not [p for p in out.iterdir() if p.name.startswith(outputs.TMP_PREFIX)]
    check, figures = check_adapter(out)
    assert not check.passed and figures == {}
    assert f"{RUN_FILE} is missing beside adapter" in check.detail
    assert "incomplete" in check.detail


def test_a_mixed_output_set_is_a_fail_not_a_traceback(finished, tmp_path):
    """What the issue found after a kill: new adapter, truncated reference, an older record."""
    out = _copy(finished, tmp_path)
    ref = out / REFERENCE_FILE
    ref.write_bytes(ref.read_bytes()[:1000])
    check, _ = check_adapter(out)
    assert not check.passed
    assert f"{ref} has 1000 bytes" in check.detail and "incomplete" in check.detail
    (out / RUN_FILE).write_text('{"config": {}, ')  # a record cut short
    check, _ = check_adapter(out)
    assert not check.passed and "is not a whole run record" in check.detail


@pytest.mark.parametrize(("key", "value", "words"), [
    ("steps", -3, "invalid steps=-3: must be >= 1"),
    ("no_such_knob", 1, "no_such_knob"),
])
def test_a_record_whose_config_this_draslice_cannot_read_is_a_fail(finished, tmp_path, key,
                                                                   value, words):
    """A record edited by hand, or written by another draslice version: FAIL naming it."""
    out = _copy(finished, tmp_path)
    record = json.loads((out / RUN_FILE).read_text())
    record["config"][key] = value
    (out / RUN_FILE).write_text(json.dumps(record))
    check, _ = check_adapter(out)
    assert not check.passed
    assert "its config is not one this draslice reads" in check.detail and words in check.detail


def test_a_whole_set_passes_the_record_check(finished):
    record, problem = outputs.read_record(finished)
    assert problem is None
    assert set(record[outputs.FILES_KEY]) >= {REFERENCE_FILE, "adapter/adapter_model.safetensors"}


# -- checkpoints --------------------------------------------------------------------------------

@pytest.mark.parametrize("damage", ["missing-adapter", "truncated-state"])
def test_a_damaged_checkpoint_falls_back_to_the_previous_whole_one(finished, tiny_gpt2,
                                                                   demo_data, tmp_path, damage):
    out = _copy(finished, tmp_path)
    newest = out / CHECKPOINT_DIR / "step-00000004"
    if damage == "missing-adapter":
        (newest / checkpoint.WEIGHTS).unlink()
    else:
        state = newest / checkpoint.STATE_FILE
        state.write_bytes(state.read_bytes()[:-4096])
    lines: list[str] = []
    result = train(_cfg(tiny_gpt2, demo_data["prompt-completion"]), out, out / "metrics.jsonl",
                   log=lines.append)
    assert result.resumed_from_step == 2
    assert any("step-00000004 is damaged" in line and "resuming from the one before" in line
               for line in lines), lines
    assert checkpoint.whole_problem(newest) is None  # rewritten whole at step 4
    assert outputs.read_record(out)[1] is None


def test_resume_compares_the_data_content_not_its_path(finished, tiny_gpt2, demo_data,
                                                       tmp_path):
    out = _copy(finished, tmp_path)
    moved = tmp_path / "elsewhere.jsonl"  # the same bytes at another path: resumes
    shutil.copy(demo_data["prompt-completion"], moved)
    lines: list[str] = []
    train(_cfg(tiny_gpt2, moved, steps=6), out, out / "metrics.jsonl", log=lines.append)
    assert any("resumed at step 4" in line for line in lines)
    write_demo_data(moved, "prompt-completion", 128, seed=7)  # new data under the same name
    with pytest.raises(DrasliceError, match=r"checkpoint of a different run \(the data's "
                                            r"content changed"):
        train(_cfg(tiny_gpt2, moved, steps=8), out, out / "metrics.jsonl", **QUIET)


def test_model_fingerprint_follows_content_and_ignores_hidden_files(tiny_gpt2, tmp_path):
    model = _model_copy(tiny_gpt2, tmp_path)
    before = fingerprint.content_hashes({"model_dir": str(model)})
    (model / ".cache").mkdir()
    (model / ".cache" / "x").write_text("lock")
    assert fingerprint.content_hashes({"model_dir": str(model)}) == before
    config = json.loads((model / "config.json").read_text())
    config["n_layer"] = 1
    (model / "config.json").write_text(json.dumps(config))
    assert fingerprint.content_hashes({"model_dir": str(model)}) != before


def test_fewer_steps_than_the_checkpoint_is_refused(finished, tiny_gpt2, demo_data, tmp_path):
    out = _copy(finished, tmp_path)
    result = CliRunner().invoke(main, [
        "train", "--output-dir", str(out), "--model-dir", str(tiny_gpt2),
        "--data", str(demo_data["prompt-completion"]), "--device", "cpu", "--steps", "3",
        "--checkpoint-every", "2", "--batch-size", "4", "--max-length", "48",
        "--log-every", "1000", *_config_defaults("steps", "checkpoint_every")])
    _one_error_line(result, "invalid steps=3: must be at least 4",
                    "step-00000004 is a checkpoint of this run at step 4")

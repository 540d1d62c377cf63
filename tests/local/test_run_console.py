"""What `draslice run` shows of kfp.local's stream, and how a failed task's reason and exit
code are read from its own traceback. Fed with the lines kfp.local 2.17 writes."""

from __future__ import annotations

import io
import json

from draslice.local.run_console import RunOutput, failure_of

KFP_STREAM = """\
14:00:00.001 - INFO - Running pipeline: \x1b[95m'draslice-sft-mig-1g-6gb'\x1b[0m
14:00:00.002 - INFO - Executing task \x1b[96m'smoke'\x1b[0m
14:00:00.003 - INFO - Streamed logs:

    {"inputs": {"parameterValues": {"device": "auto"}}}
    cuda_available: False
    device: cpu (no CUDA device)
    slice_total_mem_GiB: 23.54
    matmul 1024^3 float32: rel_error=1.00e-07 (tolerance 1e-03) achieved=0.10 TFLOP/s
    matmul_on_slice: OK
    I1204 some library chatter

14:00:01.000 - INFO - Task \x1b[96m'smoke'\x1b[0m finished with status \x1b[92mSUCCESS\x1b[0m
14:00:01.001 - INFO - Task 'smoke' outputs:
    tflops: 0.1
14:00:01.002 - INFO - Executing task \x1b[96m'finetune'\x1b[0m
    [slice] device=cpu total_mem=23.54 GiB
    {'loss': 6.2000, 'step': 1, 'tokens_per_s': 1000}
    Traceback (most recent call last):
      File "/x/torch/cuda.py", line 1, in alloc
        raise OutOfMemoryError("CUDA out of memory")
    torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 MiB

    The above exception was the direct cause of the following exception:

    Traceback (most recent call last):
      File "/x/ephemeral_component.py", line 9, in finetune
        raise SliceOutOfMemory(advice) from err
    draslice.errors.SliceOutOfMemory: out of memory inside the slice: the slice has 0.00 GiB

"""


def _run(stream: str, **kw) -> tuple[RunOutput, str, str]:
    log, console = io.StringIO(), io.StringIO()
    out = RunOutput(log, console, run_dir=kw.pop("run_dir", None), total_steps=30, **kw)
    for chunk in (stream[:100], stream[100:333], stream[333:]):  # lines split across writes
        out.write(chunk)
    out.close()
    return out, log.getvalue(), console.getvalue()


def test_the_console_gets_task_lines_the_grepped_lines_and_the_failure():
    out, log, console = _run(KFP_STREAM, bar=False)
    assert log == KFP_STREAM + "\n" * (not KFP_STREAM.endswith("\n"))  # everything, verbatim
    lines = console.splitlines()
    assert lines[0] == "[task] smoke: started"
    assert lines[1:6] == ["cuda_available: False", "device: cpu (no CUDA device)",
                          "slice_total_mem_GiB: 23.54",
                          "matmul 1024^3 float32: rel_error=1.00e-07 (tolerance 1e-03) "
                          "achieved=0.10 TFLOP/s", "matmul_on_slice: OK"]
    assert lines[6].startswith("[task] smoke: SUCCESS in ")
    assert lines[7:10] == ["[task] finetune: started", "[slice] device=cpu total_mem=23.54 GiB",
                           "{'loss': 6.2000, 'step': 1, 'tokens_per_s': 1000}"]
    # kfp.local raised at the failed task instead of logging its end: close() ends it.
    assert lines[10].startswith("[task] finetune: FAILURE in ")
    assert len(lines) == 11  # no executor input, no library chatter, no traceback
    (failure,) = out.failures
    assert (failure.task, failure.exit_code) == ("finetune", 3)
    assert failure.reason.startswith("out of memory inside the slice: the slice has 0.00 GiB")


def test_a_skipped_task_is_one_line():
    _out, _log, console = _run("14:00:00.001 - INFO - Skipping conditional task smoke "
                               "(condition evaluated to False)\n", bar=False)
    assert console == "[task] smoke: skipped (condition evaluated to False)\n"


def test_verbose_streams_everything_and_adds_nothing():
    _out, log, console = _run(KFP_STREAM, verbose=True)
    assert console == log


def test_the_reason_of_a_bug_keeps_the_exception_name_and_exits_1():
    lines = ["Traceback (most recent call last):", '  File "x.py", line 1, in f',
             "    1 / 0", "ZeroDivisionError: division by zero"]
    failure = failure_of("validate", lines)
    assert (failure.exit_code, failure.reason) == (1, "ZeroDivisionError: division by zero")


def test_each_documented_error_gives_its_exit_code():
    for name, code in [("TrainingDiverged", 4), ("InvalidParameter", 2), ("DatasetError", 2),
                       ("SliceOutOfMemory", 3), ("ValidationFailed", 1)]:
        failure = failure_of("t", ["Traceback (most recent call last):", "  File ...",
                                   f"draslice.errors.{name}: why"])
        assert (failure.exit_code, failure.reason) == (code, "why"), name


def test_an_error_of_another_draslice_module_gives_its_code_and_message_alone():
    """Errors defined beside their code (a snapshot's, the cluster's) are DrasliceErrors too:
    a task that ends with one is bad input (2) or a cluster that cannot be read (1), in its
    own words, not a bug named by its class."""
    for qualified, code in [("draslice.cluster.snapshot.SnapshotError", 2),
                            ("draslice.cluster.live.ClusterAccessError", 1),
                            ("draslice.cluster.preflight.PreflightFailed", 1)]:
        failure = failure_of("preflight", ["Traceback (most recent call last):", "  File ...",
                                           f"{qualified}: dump.yaml: line 2: not valid YAML"])
        assert (failure.exit_code, failure.reason) == (code, "dump.yaml: line 2: not valid "
                                                             "YAML"), qualified
    # a class of that name elsewhere, or a draslice name that is no error, is a bug's
    for qualified in ("otherpkg.SnapshotError", "draslice.cluster.snapshot.Snapshot",
                      "draslice.nosuchmodule.SnapshotError"):
        failure = failure_of("t", ["Traceback (most recent call last):", f"{qualified}: x"])
        assert (failure.exit_code, failure.reason) == (1, f"{qualified}: x"), qualified


def test_a_task_without_a_traceback_gives_its_last_words():
    assert failure_of("t", ["hello", "killed by signal 9", ""]).reason == "killed by signal 9"


def test_the_bar_follows_the_metrics_file_on_a_terminal(tmp_path):
    """On a terminal the step lines become a bar redrawn from the fine-tune's metrics file."""
    metrics = tmp_path / "draslice-sft-x-20261204" / "finetune" / "train_log"
    metrics.parent.mkdir(parents=True)
    metrics.write_text(json.dumps({"step": 15, "loss": 2.5, "tokens_per_s": 1234.0}) + "\n")
    log, console = io.StringIO(), io.StringIO()
    out = RunOutput(log, console, tmp_path, total_steps=30, bar=True)
    out.write("14:00:00.002 - INFO - Executing task 'finetune'\n")
    out.write("    {'loss': 2.5000, 'step': 15, 'tokens_per_s': 1234}\n")
    import time

    deadline = time.monotonic() + 5
    while "step 15/30" not in console.getvalue() and time.monotonic() < deadline:
        time.sleep(0.05)
    out.write("14:00:09.000 - INFO - Task 'finetune' finished with status SUCCESS\n")
    shown = console.getvalue()
    assert "finetune [############............] step 15/30  loss 2.5000  1,234 tokens/s" in shown
    assert "{'loss'" not in shown  # the bar replaced the step line
    assert shown.splitlines()[-1].startswith("[task] finetune: SUCCESS in ")

"""The command line: --help everywhere, one-line errors for bad input."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys

import click
import pytest
from click.testing import CliRunner

from draslice.cli import main
from draslice.cli.error_output import JsonErrorCommand
from draslice.tests.conftest import REPO

# benchmarks/startup.py lists every command and times the cases below; loaded by path, since
# `startup` may name this checkout's folder.
_spec = importlib.util.spec_from_file_location("startup_bench", REPO / "benchmarks" / "startup.py")
startup_bench = sys.modules["startup_bench"] = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(startup_bench)


@pytest.mark.parametrize("path", [(), *startup_bench.command_paths()],
                         ids=lambda p: " ".join(p) or "draslice")
def test_every_command_explains_itself(path):
    result = CliRunner().invoke(main, [*path, "--help"])
    assert result.exit_code == 0, result.output
    assert "Usage: " in result.output
    # A real description, not just the usage line.
    body = result.output.split("\n\n", 2)[1].strip()
    assert len(body) > 20, result.output


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["run", "--steps", "0"], "invalid steps=0: must be >= 1"),
        (["run", "--batch-size", "999"],
         "invalid batch_size=999: must be in [1, dataset_size=256]"),
        (["run", "--precision", "fp8"], "invalid precision='fp8'"),
        (["run", "--device", "tpu"], "invalid device='tpu'"),
        (["run", "--template", "Mig_1g"], "invalid claim_template='Mig_1g'"),
        (["run", "--min-loss-drop", "2"], "invalid min_loss_drop=2.0"),
        (["run", "--lora-r", "0"], "invalid lora_r=0: must be >= 1"),
        (["run", "--learning-rate", "nan"], "invalid learning_rate=nan"),
        (["run", "--lora-targets", "bogus"],
         "invalid lora_targets='bogus': ['bogus'] not in the model; its projections are "
         "['c_attn', 'c_fc', 'c_proj']"),
        (["run", "--lora-targets", "ln_1"], "'ln_1' names a LayerNorm, not a layer LoRA can wrap"),
        (["run", "--lora-r", "300"], "invalid lora_r=300: must be at most 256"),
        (["run", "--seq-len", "10000000"], "invalid seq_len=10000000: a synthetic step of"),
        (["compile", "--template", "x" * 64], "at most 63"),
    ],
)
def test_bad_input_is_one_line_and_exit_2(args, message, tmp_path):
    result = CliRunner().invoke(main, [*args, "--runs-dir", str(tmp_path)] if args[0] == "run"
                                else [*args, "--out", str(tmp_path)])
    assert result.exit_code == 2, result.output
    assert message in result.output
    assert "Traceback" not in result.output
    assert not any(tmp_path.iterdir())  # nothing started, nothing written


def _refused_before_any_task(result, *words: str) -> None:
    """``draslice run`` said one ``error:`` line holding ``words`` and exit 2, and started no
    task (kfp.local's first task would print ``[task] preflight: started``)."""
    assert result.exit_code == 2, result.output
    errors = [line for line in result.output.splitlines() if line.startswith("error: ")]
    assert len(errors) == 1, result.output
    for word in words:
        assert word in errors[0], errors[0]
    assert "Traceback" not in result.output and "[task]" not in result.output
    assert "run folder" not in result.output


@pytest.mark.parametrize(("text", "words"), [
    ("kind: [\n", ": line 2: not valid YAML: did not find expected node content"),
    ('{"kind": "List", "items": [{"metadata": {}}]}',
     ": document 1, item 1 (line 1): not a Kubernetes object (no `kind`)"),
    ("", ": empty file; expected the output of `kubectl get"),
])
def test_a_bad_snapshot_is_refused_before_the_first_task(tmp_path, text, words):
    """Issue 37, 12: the preflight task used to fail on it with exit 1 and the class name."""
    dump = tmp_path / "dump.yaml"
    dump.write_text(text)
    runs = tmp_path / "runs"
    result = CliRunner().invoke(main, ["run", "--snapshot", str(dump), "--runs-dir", str(runs)])
    _refused_before_any_task(result, f"error: {dump}{words}")
    assert not runs.exists()


def test_a_runs_dir_that_cannot_be_written_is_refused_before_the_first_task(tmp_path):
    """Issue 37, 9: a read-only folder, one below it, and a file on the way are one line
    naming the folder, exit 2 (it was an OSError traceback once the first task ran)."""
    import torch  # noqa: F401 (loaded before the effective user drops: see unwritable.py)

    from draslice.cluster import snapshot  # noqa: F401
    from draslice.tests.unwritable import read_only_folder
    from draslice.trainer import budget, input_checks  # noqa: F401
    from draslice.trainer import device as _device  # noqa: F401

    with read_only_folder() as folder:
        into = CliRunner().invoke(main, ["run", "--runs-dir", str(folder)])
        below = CliRunner().invoke(main, ["run", "--runs-dir", str(folder / "a" / "b")])
        assert list(folder.iterdir()) == []
    _refused_before_any_task(into, f"invalid runs_dir='{folder}': cannot write there "
                                   "(Permission denied)")
    _refused_before_any_task(below, f"invalid runs_dir='{folder / 'a' / 'b'}'",
                             "Permission denied")
    file = tmp_path / "a-file"
    file.write_text("x")
    past_a_file = CliRunner().invoke(main, ["run", "--runs-dir", str(file / "runs")])
    _refused_before_any_task(past_a_file, f"invalid runs_dir='{file / 'runs'}': cannot write "
                                          "there (Not a directory)")
    a_file = CliRunner().invoke(main, ["run", "--runs-dir", str(file)])
    assert a_file.exit_code == 2 and f"Directory '{file}' is a file" in a_file.output


def test_a_runs_dir_on_a_read_only_file_system_is_refused_before_the_first_task(tmp_path):
    """The issue's own case, Errno 30: a real tmpfs mounted read-only; skipped where this
    process may not mount (it needs root with CAP_SYS_ADMIN, as on the CI machine)."""
    where = tmp_path / "ro"
    where.mkdir()
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", "ro,size=64k", "tmpfs", str(where)],
                             capture_output=True, check=False)
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {mounted.stderr.decode().strip()}")
    try:
        result = CliRunner().invoke(main, ["run", "--runs-dir", str(where / "runs")])
    finally:
        subprocess.run(["umount", "-l", str(where)], check=False)
    _refused_before_any_task(result, f"invalid runs_dir='{where / 'runs'}': cannot write there "
                                     "(Read-only file system)")


def test_slice_cap_on_a_cpu_only_machine_is_refused_up_front(tmp_path):
    import torch

    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU")
    result = CliRunner().invoke(main, ["run", "--slice-memory-gib", "6", "--runs-dir",
                                       str(tmp_path)])
    assert result.exit_code == 2
    assert "needs a CUDA device" in result.output


def test_compile_one_custom_template(tmp_path):
    result = CliRunner().invoke(main, ["compile", "--template", "mig-2g-12gb", "--mode", "native",
                                       "--kind", "canary", "--out", str(tmp_path)])
    assert result.exit_code == 0, result.output
    text = (tmp_path / "canary.native.mig-2g-12gb.yaml").read_text()
    assert "resourceClaimTemplateName: mig-2g-12gb" in text


def test_run_names_the_pipelines_default_template():
    """run spells the template out (to start without importing kfp); keep it equal."""
    from draslice.cli.commands import run_cmd
    from draslice.pipelines.steps import DEFAULT_TEMPLATE

    assert run_cmd.DEFAULT_TEMPLATE == DEFAULT_TEMPLATE


# --- startup: --help and bad input load no heavy library (issue 14) ------------------------
# The cases are benchmarks/startup.py's (every --help, one bad input per command); that script
# times them, this test only checks what they import.

HEAVY = ("torch", "kfp", "kfp_server_api", "kubernetes", "transformers", "peft", "matplotlib",
         "datasets")
RECORD_IMPORTS = """
import atexit, os, sys
heavy = os.environ["DRASLICE_HEAVY"].split(",")
atexit.register(lambda: open(os.environ["DRASLICE_LOADED"], "w").write(
    ",".join(m for m in heavy if m in sys.modules)))
from draslice.cli import main
main(prog_name="draslice")
"""


@pytest.fixture(scope="module")
def bad_files(tmp_path_factory) -> str:
    """The folder of the bad-file cases (a tiny model, a broken JSONL)."""
    folder = tmp_path_factory.mktemp("startup-files")
    startup_bench.write_files(str(folder))
    return str(folder)


@pytest.mark.parametrize("case", startup_bench.cases(), ids=lambda c: " ".join(c.args))
def test_help_and_bad_input_load_no_heavy_library(case, tmp_path, request):
    loaded = tmp_path / "loaded.txt"
    env = {**os.environ, "DRASLICE_HEAVY": ",".join(HEAVY), "DRASLICE_LOADED": str(loaded)}
    args = case.argv(request.getfixturevalue("bad_files")) if case.needs_files else case.args
    done = subprocess.run([sys.executable, "-c", RECORD_IMPORTS, *args], cwd=tmp_path,
                          env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == case.exit_code, done.stderr[-2000:]
    assert "Traceback" not in done.stderr
    assert loaded.read_text() == "", f"{case.label} imported {loaded.read_text()}"


# --- --json: a JSON error object on stdout, whatever failed -----------------------------------
def _json_commands() -> list[tuple[str, ...]]:
    return [p for p in startup_bench.command_paths()
            if any("--json" in param.opts for param in _command(p).params)]


def _command(path: tuple[str, ...]) -> click.Command:
    cmd = main
    for name in path:
        cmd = cmd.get_command(click.Context(cmd), name)
    return cmd


def _json_error(args: list[str]) -> tuple[dict, int]:
    """stdout as JSON (NaN refused: it is not JSON), and the exit code."""
    result = CliRunner().invoke(main, args)

    def no_constants(name: str):
        raise ValueError(f"{name} in the JSON output: {result.stdout!r}")

    return json.loads(result.stdout, parse_constant=no_constants), result.exit_code


def test_every_json_command_uses_the_shared_error_mechanism():
    paths = _json_commands()
    assert {"advise", "preflight", "smoke", "train"} <= {p[0] for p in paths}
    for path in paths:
        assert isinstance(_command(path), JsonErrorCommand), path


@pytest.mark.parametrize("path", _json_commands(), ids=" ".join)
def test_json_mode_prints_an_error_object_for_usage_errors(path):
    out, code = _json_error([*path, "--no-such-option", "--json"])
    assert code == 2
    assert (out["exit_code"], out["field"]) == (2, "--no-such-option")
    assert "No such option" in out["error"]


@pytest.mark.parametrize("path", _json_commands(), ids=" ".join)
def test_json_mode_prints_an_error_object_for_bad_input(path, tmp_path):
    args = list(startup_bench.BAD_INPUT[path[0]])
    assert "--json" in args
    out, code = _json_error([*args, "--output-dir", str(tmp_path)] if "train" in path else args)
    assert code == out["exit_code"] == 2
    assert out["field"] and out["field"].replace("-", "_").strip("_") in out["error"]
    assert not any(tmp_path.iterdir())


def test_preflight_json_errors_keep_the_report_keys():
    out, code = _json_error(["preflight", "--on-missing-dra", "maybe", "--json"])
    assert code == 2
    assert out["decision"] == "error" and out["reason"] == out["error"]
    assert out["field"] == "--on-missing-dra"


def test_without_json_errors_stay_off_stdout():
    result = CliRunner().invoke(main, ["advise", "--peak-gib", "nan"])
    assert result.exit_code == 2 and result.stdout == ""
    assert result.stderr.strip().splitlines() == [
        "error: invalid peak_gib=nan: must be a finite number of GiB > 0, e.g. --peak-gib 5.1"]


@pytest.mark.parametrize("peak", ["nan", "inf", "-inf", "0", "-1"])
def test_advise_refuses_a_peak_that_is_not_a_positive_number(peak):
    out, code = _json_error(["advise", "--peak-gib", peak, "--json"])
    assert code == 2
    assert out["field"] == "peak_gib" and "finite number of GiB > 0" in out["error"]


def test_advise_peak_is_a_table_lookup():
    out, code = _json_error(["advise", "--peak-gib", "5.2", "--gpu", "A30-24GB", "--json"])
    assert code == 0
    assert out["peak_gib"] == 5.2 and out["measured"] is False
    assert out["chosen"]["name"] == "2g.12gb"


BLOCK_KFP = """
import sys
class Block:
    def find_spec(self, name, path=None, target=None):
        if name == "kfp" or name.startswith("kfp."):
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)
sys.meta_path.insert(0, Block())
from draslice.cli import main
main()
"""


def test_train_runs_where_kfp_is_not_installed_and_pipeline_commands_say_why_not(tmp_path):
    """The trainer needs no kfp (a bare GPU host, a slim image): commands load on first use,
    and a pipeline command without kfp is one line naming the missing package."""

    def draslice(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-c", BLOCK_KFP, *args], capture_output=True,
                              text=True, timeout=300, cwd=tmp_path)

    listing = draslice("--help")
    assert listing.returncode == 0 and "compile    (unavailable here: needs kfp)" in listing.stdout
    trained = draslice("train", "--output-dir", str(tmp_path / "out"), "--steps", "2",
                       "--device", "cpu", "--json")
    assert trained.returncode == 0, trained.stderr[-2000:]
    assert '"steps": 2' in trained.stdout.splitlines()[-1]
    refused = draslice("compile", "--out", str(tmp_path / "yaml"))
    assert refused.returncode == 2
    assert refused.stderr.strip().splitlines()[-1].startswith(
        "error: `draslice compile` needs the Python package 'kfp', which is not installed here")

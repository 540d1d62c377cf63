"""The command line: --help everywhere, one-line errors for bad input."""

from __future__ import annotations

import click
import pytest
from click.testing import CliRunner

from draslice.cli import main


def _commands(group: click.Group, prefix=()):
    ctx = click.Context(group)
    for name in group.list_commands(ctx):  # the top level loads its commands lazily
        cmd = group.get_command(ctx, name)
        yield (*prefix, name)
        if isinstance(cmd, click.Group):
            yield from _commands(cmd, (*prefix, name))


@pytest.mark.parametrize("path", [(), *_commands(main)], ids=lambda p: " ".join(p) or "draslice")
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


def test_help_does_not_import_torch():
    import subprocess
    import sys

    code = ("import sys; from click.testing import CliRunner; from draslice.cli import main; "
            "CliRunner().invoke(main, ['--help']); print('torch' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


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
    import subprocess
    import sys

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

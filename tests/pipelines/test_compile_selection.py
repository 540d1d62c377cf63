"""``draslice compile`` without ``--template``: --mode and --kind pick files of the committed
set, a choice the set does not hold is one line before any file, and a volume goes where it
can mount."""

from __future__ import annotations

import pytest
from click.testing import CliRunner

from draslice.cli import main
from draslice.pipelines.variants import VARIANTS
from draslice.tests.conftest import REPO
from draslice.tests.refusals import one_line


def compile_(*args: str):
    return CliRunner().invoke(main, ["compile", *args])




@pytest.mark.parametrize(("args", "stems"), [
    (("--mode", "native"), ("sft.native.", "finetune.native.", "finetune-artifact.native.",
                            "sweep.native.")),
    (("--kind", "canary"), ("canary.policy.",)),
    (("--kind", "finetune", "--mode", "policy"), ("finetune.policy.",)),
])
def test_mode_and_kind_pick_those_committed_files_byte_for_byte(tmp_path, args, stems):
    result = compile_(*args, "--out", str(tmp_path))
    assert result.exit_code == 0, result.output
    expected = sorted(v.filename for v in VARIANTS if v.filename.startswith(stems))
    assert sorted(p.name for p in tmp_path.iterdir()) == expected
    assert result.output.splitlines()[0] == (f"compiled {len(expected)} of {len(VARIANTS)} "
                                             f"pipelines into {tmp_path}/")
    for name in expected:
        assert (tmp_path / name).read_bytes() == (REPO / "compiled" / name).read_bytes(), name


@pytest.mark.parametrize(("args", "words"), [
    (("--mode", "native", "--kind", "canary"),
     ("invalid mode='native': compiled/ holds no native-mode canary pipeline (it holds "
      "canary.policy.mig-1g-6gb.yaml, canary.policy.shared-gpu-timeslice.yaml): add "
      "--template T to compile one",)),
    (("--kind", "finetune-trainjob", "--mode", "native"),
     ("invalid mode='native': finetune-trainjob has no claim mode", "leave --mode out")),
    (("--kind", "finetune-trainjob", "--mode", "policy", "--template", "mig-2g-12gb"),
     ("invalid mode='policy': finetune-trainjob has no claim mode",)),
    (("--kind", "sft", "--pvc", "team-llm"),
     ("invalid kind='sft': --pvc and --mount-path apply to the kinds that mount a volume "
      "(finetune, finetune-artifact, sweep, finetune-trainjob): --kind sft mounts none",)),
    (("--kind", "canary", "--mount-path", "/models", "--template", "mig-2g-12gb"),
     ("invalid kind='canary'", "--kind canary mounts none")),
])
def test_a_choice_that_selects_nothing_is_one_line_before_any_file(tmp_path, args, words):
    out = tmp_path / "out"
    one_line(compile_(*args, "--out", str(out)), *words)
    assert not out.exists()


def test_another_volume_never_goes_into_compiled(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    one_line(compile_("--pvc", "team-llm"), "invalid out='compiled'",
             "choose another folder with --out")
    assert not (tmp_path / "compiled").exists()


def test_a_volume_without_template_goes_into_every_pipeline_that_mounts_one(tmp_path):
    result = compile_("--kind", "finetune", "--mode", "native", "--pvc", "team-llm",
                      "--mount-path", "/llm", "--out", str(tmp_path))
    assert result.exit_code == 0, result.output
    files = sorted(tmp_path.iterdir())
    assert [p.name for p in files] == ["finetune.native.mig-1g-6gb.yaml",
                                       "finetune.native.shared-gpu-timeslice.yaml"]
    for path in files:
        text = path.read_text()
        assert "constant: team-llm" in text and "(mounted at /llm)" in text, path.name
        assert "draslice-data" not in text, path.name

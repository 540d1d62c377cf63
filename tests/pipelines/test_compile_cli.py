"""``draslice compile``: bad names and folders are one line before any file; --image."""

from __future__ import annotations

import pytest
import yaml
from click.testing import CliRunner

from draslice.cli import main
from draslice.components.image import DEFAULT_TRAINER_IMAGE
from draslice.tests.refusals import one_line

IMAGE = "registry.example.com/team/draslice-trainer:0.1.0"


def compile_(*args: str):
    return CliRunner().invoke(main, ["compile", *args])




@pytest.mark.parametrize(("args", "words"), [
    (("--pvc", "BAD_PVC"), "invalid pvc='BAD_PVC': must be a DNS-1123 subdomain"),
    (("--mount-path", "relative/path"), "invalid mount_path='relative/path': must be an abs"),
    (("--mount-path", ""), "invalid mount_path='': must be an absolute path"),
    (("--mount-path", "/data/../etc"), "invalid mount_path='/data/../etc'"),
    (("--image", "not an image ref!!"), "invalid image='not an image ref!!': must be an image "
                                        "reference"),
])
def test_bad_names_are_refused_before_any_file(tmp_path, args, words):
    out = tmp_path / "out"
    result = compile_("--template", "mig-1g-6gb", "--kind", "finetune", *args, "--out", str(out))
    one_line(result, words)
    assert not out.exists()


def test_another_image_never_goes_into_compiled(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    result = compile_("--image", IMAGE)
    one_line(result, "invalid out='compiled'", "choose one with --out",
              f"on {DEFAULT_TRAINER_IMAGE}")
    assert not (tmp_path / "compiled").exists()


def test_image_option_names_the_image_in_every_task(tmp_path):
    result = compile_("--template", "mig-1g-6gb", "--kind", "canary", "--image", IMAGE,
                      "--out", str(tmp_path))
    assert result.exit_code == 0, result.output
    (spec, _platform) = yaml.safe_load_all((tmp_path / "canary.policy.mig-1g-6gb.yaml")
                                           .read_text())
    images = {e["container"]["image"] for e in spec["deploymentSpec"]["executors"].values()}
    assert images == {IMAGE}
    assert [p.name for p in tmp_path.iterdir()] == ["canary.policy.mig-1g-6gb.yaml"]


def test_a_read_only_out_folder_is_one_line_naming_it():
    from draslice.tests.unwritable import read_only_folder

    with read_only_folder() as folder:
        result = compile_("--template", "mig-1g-6gb", "--kind", "canary", "--out", str(folder))
        assert list(folder.iterdir()) == []
    one_line(result, f"invalid out='{folder}': cannot write there (Permission denied)")

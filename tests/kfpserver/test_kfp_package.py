"""Packages and parameters: what upload and submit read from a compiled pipeline."""

from __future__ import annotations

import pytest

from draslice.errors import InvalidParameter
from draslice.kfp_ops import parse_params, resolve_package
from draslice.kfp_ops.package import InputParam

INPUTS = {
    "flag": InputParam("flag", "BOOLEAN"),
    "names": InputParam("names", "LIST"),
    "cfg": InputParam("cfg", "STRUCT"),
    "rate": InputParam("rate", "NUMBER_DOUBLE"),
    "text": InputParam("text", "STRING"),
}


def test_params_are_typed():
    got = parse_params(["flag=yes", 'names=["a","b"]', 'cfg={"k": 1}', "rate=1e-3",
                        "text=a=b"], INPUTS)
    assert got == {"flag": True, "names": ["a", "b"], "cfg": {"k": 1}, "rate": 0.001,
                   "text": "a=b"}


@pytest.mark.parametrize("pair", ["flag=maybe", "names={}", "cfg=[1]", "rate=fast", "novalue"])
def test_bad_params_are_refused(pair):
    with pytest.raises(InvalidParameter):
        parse_params([pair], INPUTS)


def test_variant_reads_the_committed_file_and_its_inputs(compiled):
    pkg = resolve_package("sft.policy.mig-1g-6gb", compiled)
    assert pkg.path == compiled / "sft.policy.mig-1g-6gb.yaml"
    assert pkg.pipeline_name == "draslice-sft-mig-1g-6gb" and not pkg.native_claims
    assert pkg.inputs["steps"] == InputParam("steps", "NUMBER_INTEGER", 30, True)
    assert resolve_package("sft.native.mig-1g-6gb", compiled).native_claims


def test_missing_compiled_dir_compiles_the_same_bytes(tmp_path, compiled):
    fresh = resolve_package("canary.policy.mig-1g-6gb", tmp_path / "nowhere")
    committed = resolve_package("canary.policy.mig-1g-6gb", compiled)
    assert fresh.path != committed.path
    assert fresh.digest == committed.digest and fresh.version_name == committed.version_name


def test_a_yaml_that_is_not_a_pipeline_is_refused(tmp_path):
    bad = tmp_path / "x.yaml"
    bad.write_text("apiVersion: v1\nkind: ConfigMap\n")
    with pytest.raises(InvalidParameter, match="not a compiled KFP pipeline"):
        resolve_package(str(bad))


def test_multi_user_namespace_reaches_pipeline_and_experiment(cli, fake_kfp):
    """Multi-user mode: objects live in the namespace they are created in."""
    fake_kfp.multi_user = True
    res = cli("submit", "--variant", "canary.policy.mig-1g-6gb", "--upload",
              "--namespace", "team-a", "--experiment", "canaries")
    assert res.exit_code == 0, res.output
    (pipeline,) = fake_kfp.state.pipelines.values()
    (experiment,) = fake_kfp.state.experiments.values()
    assert (pipeline.namespace, experiment.namespace) == ("team-a", "team-a")
    again = cli("submit", "--variant", "canary.policy.mig-1g-6gb", "--upload",
                "--namespace", "team-b")
    assert again.exit_code == 0, again.output
    assert sorted(p.namespace for p in fake_kfp.state.pipelines.values()) == ["team-a", "team-b"]


def test_single_user_mode_ignores_namespace(cli, fake_kfp):
    """Single-user mode (KFP 2.17.0 observed): --namespace changes nothing; the pipeline
    uploaded without it is found with it, and so are the schedules."""
    assert cli("schedule", "create", "--variant", "canary.policy.mig-1g-6gb").exit_code == 0
    res = cli("upload", "--variant", "canary.policy.mig-1g-6gb", "--namespace", "team-a")
    assert res.exit_code == 0 and "(exists)" in res.output, res.output
    assert len(fake_kfp.state.pipelines) == 1
    listed = cli("schedule", "list", "--namespace", "team-a")
    assert listed.exit_code == 0 and "draslice-canary-mig-1g-6gb-nightly" in listed.output

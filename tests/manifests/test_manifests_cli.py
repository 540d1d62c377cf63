"""``draslice manifests``: YAML on stdout or into --out, clear errors for bad input."""

from __future__ import annotations

import pytest
import yaml
from click.testing import CliRunner

from draslice.cli import main
from draslice.cluster.manifests import committed
from draslice.components.image import TRAINER_IMAGE


def run(*args: str):
    return CliRunner().invoke(main, ["manifests", *args])


def docs(result) -> list[dict]:
    assert result.exit_code == 0, result.output
    return list(yaml.safe_load_all(result.stdout))


def test_claim_templates_from_profiles_and_sharing():
    out = docs(run("claim-templates", "--profile", "1g.6gb", "--profile", "2g.12gb",
                   "--shared", "mps", "--active-thread-percentage", "50",
                   "--namespace", "team-a"))
    assert [d["metadata"]["name"] for d in out] == ["mig-1g-6gb", "mig-2g-12gb",
                                                     "shared-gpu-mps"]
    assert {d["metadata"]["namespace"] for d in out} == {"team-a"}
    sharing = out[2]["spec"]["spec"]["devices"]["config"][0]["opaque"]["parameters"]["sharing"]
    assert sharing == {"strategy": "MPS", "mpsConfig": {"defaultActiveThreadPercentage": 50}}


def test_claim_templates_for_whole_gpus():
    out = docs(run("claim-templates", "--gpus", "2", "--gpus", "8"))
    assert [d["metadata"]["name"] for d in out] == ["gpus-2", "gpus-8"]
    (request,) = out[1]["spec"]["spec"]["devices"]["requests"]
    assert request["exactly"] == {"deviceClassName": "gpu.nvidia.com",
                                  "allocationMode": "ExactCount", "count": 8}
    assert "config" not in out[1]["spec"]["spec"]["devices"]  # whole GPUs, not shared


@pytest.mark.parametrize(("args", "says"), [
    (["claim-templates", "--gpus", "0"], "gpus=0: must be a whole number of GPUs per pod, 1..32"),
    (["claim-templates", "--gpus", "33"], "gpus=33"),
    (["workloads", "--kind", "trainjob", "--num-nodes", "0"], "num_nodes=0"),
    (["workloads", "--kind", "trainjob", "--num-proc-per-node", "2"],
     "num_proc_per_node=2: must be 1: a pod claiming mig-1g-6gb gets 1 device(s)"),
    (["workloads", "--kind", "trainjob", "--template", "gpus-4", "--num-proc-per-node", "2"],
     "must be 4"),
])
def test_bad_topology_is_one_line_exit_2(args, says):
    result = run(*args)
    assert result.exit_code == 2, result.output
    assert says in result.output and "Traceback" not in result.output


def test_trainjob_over_several_pods():
    runtime, job = docs(run("workloads", "--kind", "trainjob", "--num-nodes", "4",
                            "--namespace", "team-a"))
    assert job["spec"]["trainer"] == {"numNodes": 4, "numProcPerNode": 1}
    assert job["metadata"]["name"] == "draslice-sft-run-mig-1g-6gb-4-pods"
    assert job["spec"]["runtimeRef"]["name"] == runtime["metadata"]["name"]


def test_timeslicing_interval():
    (doc,) = docs(run("claim-templates", "--shared", "timeslicing", "--interval", "Long"))
    params = doc["spec"]["spec"]["devices"]["config"][0]["opaque"]["parameters"]
    assert params["sharing"]["timeSlicingConfig"] == {"interval": "Long"}


def test_rbac_for_multi_user():
    out = docs(run("rbac", "--namespace", "team-a", "--service-account", "default-editor"))
    assert [d["kind"] for d in out] == ["ClusterRole", "ClusterRoleBinding", "Role",
                                        "RoleBinding"]
    for d in out:
        for rule in d.get("rules", []):
            assert rule["verbs"] == ["get", "list", "watch"]
        for s in d.get("subjects", []):
            assert s == {"kind": "ServiceAccount", "name": "default-editor",
                         "namespace": "team-a"}
    assert out[0]["rules"][0]["resources"] == ["deviceclasses", "resourceslices"]
    assert out[2]["rules"][0]["resources"] == ["resourceclaims", "resourceclaimtemplates"]


@pytest.mark.parametrize(("engine", "kinds"), [
    ("map-v1", ["MutatingAdmissionPolicy", "MutatingAdmissionPolicyBinding"]),
    ("map-v1beta1", ["MutatingAdmissionPolicy", "MutatingAdmissionPolicyBinding"]),
    ("kyverno", ["MutatingPolicy"]),
    ("kyverno-clusterpolicy", ["ClusterPolicy"]),
])
def test_admission_policy_engines(engine, kinds):
    result = run("admission-policy", "--engine", engine, "--namespace", "team-a")
    assert [d["kind"] for d in docs(result)] == kinds
    assert "kubectl label namespace team-a draslice.dev/claim-injection=enabled" in result.stderr


def test_workloads_choose_kind_and_image():
    out = docs(run("workloads", "--kind", "smoke-pod", "--template", "mig-2g-12gb",
                   "--image", "my/img:1"))
    (pod,) = out
    assert pod["kind"] == "Pod" and pod["metadata"]["labels"] == {"app": "dra-smoke"}
    assert pod["spec"]["containers"][0]["image"] == "my/img:1"
    assert pod["spec"]["resourceClaims"][0]["resourceClaimTemplateName"] == "mig-2g-12gb"


def test_kueue_and_its_config():
    assert [d["kind"] for d in docs(run("kueue", "--namespace", "team-a"))] == [
        "ResourceFlavor", "ClusterQueue", "LocalQueue"]
    (cfg,) = docs(run("kueue", "--config"))
    assert cfg["kind"] == "Configuration" and cfg["resources"]["deviceClassMappings"]


def test_out_dir_writes_files(tmp_path):
    result = run("rbac", "--out", str(tmp_path))
    assert result.exit_code == 0
    assert len(list(yaml.safe_load_all((tmp_path / "rbac.yaml").read_text()))) == 4
    result = run("all", "--out", str(tmp_path / "all"))
    assert result.exit_code == 0, result.output
    files = committed.files(TRAINER_IMAGE)
    assert sorted(p.name for p in (tmp_path / "all").iterdir()) == sorted(files)


@pytest.mark.parametrize(("args", "message"), [
    (("claim-templates", "--profile", "1g6gb"), "invalid profile='1g6gb': must be a MIG profile"),
    (("claim-templates", "--profile", "1g.6gb", "--namespace", "Team_A"),
     "invalid namespace='Team_A': must be a DNS-1123 label"),
    (("claim-templates",), "give at least one --profile"),
    (("claim-templates", "--shared", "exclusive"), "invalid shared='exclusive'"),
    (("claim-templates", "--shared", "mps", "--interval", "Long"), "needs --shared timeslicing"),
    (("claim-templates", "--profile", "1g.6gb", "--active-thread-percentage", "50"),
     "need --shared mps"),
    (("claim-templates", "--shared", "mps", "--active-thread-percentage", "150"),
     "invalid active_thread_percentage=150: must be 1..100"),
    (("claim-templates", "--profile", "1g.6gb", "--profile", "1g.6gb"), "give it once"),
    (("admission-policy", "--engine", "gatekeeper"),
     "invalid engine='gatekeeper': must be one of map-v1"),
    (("rbac", "--namespace", "-bad"), "invalid namespace='-bad'"),
    (("rbac", "--service-account", "Pipeline Runner"), "invalid service_account="),
    (("workloads", "--template", "mig.1g"), "invalid claim_template='mig.1g'"),
    (("kueue", "--queue", "Q"), "invalid kueue_queue='Q'"),
    (("kueue", "--mig-slices", "-1"), "invalid mig_slices=-1"),
])
def test_bad_input_is_one_clear_error(args, message):
    result = run(*args)
    assert result.exit_code == 2
    assert result.stderr.startswith("error: ") and message in result.stderr, result.stderr
    assert "Traceback" not in result.output


@pytest.mark.parametrize("sub", ["claim-templates", "rbac", "admission-policy", "workloads",
                                 "kueue", "all"])
def test_every_subcommand_has_help_with_examples(sub):
    result = run(sub, "--help")
    assert result.exit_code == 0 and "Example" in result.output


@pytest.mark.parametrize(("args", "message"), [
    (("workloads", "--image", "not an image ref!!"),
     "invalid image='not an image ref!!': must be an image reference"),
    (("all", "--image", "Registry.example.com/Team/Trainer"), "invalid image="),
    (("kueue", "--mig-slices", "99999999999999999999"),
     "invalid mig_slices=99999999999999999999: must be a whole number from 0 to 1,000,000"),
    (("kueue", "--shared-gpus", "1000001"), "invalid shared_gpus=1000001"),
])
def test_bad_image_and_quota_are_one_line(args, message, tmp_path):
    result = run(*args, "--out", str(tmp_path / "out"))
    assert result.exit_code == 2, result.output
    assert result.stderr.startswith("error: ") and message in result.stderr, result.stderr
    assert len(result.output.splitlines()) == 1 and not (tmp_path / "out").exists()


def test_a_bad_image_from_the_environment_names_the_variable(monkeypatch):
    from draslice.components import image

    monkeypatch.setattr(image, "TRAINER_IMAGE", "my registry/trainer")
    result = run("workloads")
    assert result.exit_code == 2
    assert "invalid DRASLICE_TRAINER_IMAGE='my registry/trainer'" in result.stderr


def test_image_references_of_the_registries_grammar_are_accepted():
    from draslice.cluster.names import validate_image_ref

    for ref in ("ubuntu", "localhost:5000/team/trainer:v1", "[::1]:5000/x:latest",
                "ghcr.io/a__b/c-d--e.f:0.1.0_rc-1", "r.example.com/x@sha256:" + "ab" * 32,
                "r.example.com/x:1@sha256:" + "0" * 64):
        assert validate_image_ref(ref, "image") == ref
    for ref in ("", "x:", ":tag", "/x", "x/", "x@sha256:12", "team/Trainer", "a b",
                "x:" + "t" * 129, "r.io/" + "x" * 251):
        with pytest.raises(ValueError, match="must be an image reference"):
            validate_image_ref(ref, "image")


@pytest.mark.parametrize("args", [("all",), ("claim-templates", "--profile", "1g.6gb"),
                                  ("rbac",)])
def test_a_read_only_out_folder_is_one_line_naming_it(args):
    from draslice.tests.unwritable import read_only_folder

    runner = CliRunner()
    run("rbac")  # the command's modules imported while they can be read
    with read_only_folder() as folder:
        result = runner.invoke(main, ["manifests", *args, "--out", str(folder)])
        assert list(folder.iterdir()) == []
    assert result.exit_code == 2, result.output
    assert result.stderr.splitlines() == [result.stderr.strip()]
    assert f"invalid out='{folder}': cannot write there (Permission denied)" in result.stderr
    assert "Traceback" not in result.output

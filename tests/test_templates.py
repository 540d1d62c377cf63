"""The claim templates preflight evaluates and the manifests render: one builder."""

import pytest

from draslice.cluster.templates import (
    Sharing,
    mig_claim_template,
    mig_template_name,
    shared_gpu_claim_template,
)
from draslice.errors import InvalidParameter


@pytest.mark.parametrize(
    ("profile", "name"),
    [("1g.6gb", "mig-1g-6gb"), ("2g.12gb", "mig-2g-12gb"), ("1g.10gb+me", "mig-1g-10gb-me"),
     ("4g.40gb", "mig-4g-40gb")],
)
def test_mig_template_named_after_profile(profile, name):
    assert mig_template_name(profile) == name
    tpl = mig_claim_template(profile, namespace="team-a")
    assert tpl["metadata"] == {"name": name, "namespace": "team-a"}
    req = tpl["spec"]["spec"]["devices"]["requests"][0]
    assert req["exactly"]["deviceClassName"] == "mig.nvidia.com"
    assert req["exactly"]["selectors"] == [
        {"cel": {"expression": f'device.attributes["gpu.nvidia.com"].profile == "{profile}"'}}
    ]


@pytest.mark.parametrize("profile", ["1g6gb", "MIG-1g.6gb", "", "1g.6gb; true", "0g.1gb"])
def test_bad_profile_says_what_is_valid(profile):
    with pytest.raises(InvalidParameter, match="MIG profile string") as err:
        mig_claim_template(profile)
    assert err.value.name == "profile"


def test_timeslicing_and_mps_configs():
    ts = shared_gpu_claim_template(Sharing(interval="Long"))
    assert ts["metadata"]["name"] == "shared-gpu-timeslice"
    cfg = ts["spec"]["spec"]["devices"]["config"][0]
    assert cfg["requests"] == ["gpu-slice"]
    assert cfg["opaque"]["parameters"]["sharing"] == {
        "strategy": "TimeSlicing", "timeSlicingConfig": {"interval": "Long"}
    }
    mps = shared_gpu_claim_template(
        Sharing(strategy="MPS", active_thread_percentage=50, pinned_memory_limit="10Gi")
    )
    assert mps["metadata"]["name"] == "shared-gpu-mps"
    assert mps["spec"]["spec"]["devices"]["config"][0]["opaque"]["parameters"]["sharing"] == {
        "strategy": "MPS",
        "mpsConfig": {
            "defaultActiveThreadPercentage": 50, "defaultPinnedDeviceMemoryLimit": "10Gi"
        },
    }


@pytest.mark.parametrize(
    ("sharing", "field"),
    [(Sharing(strategy="Exclusive"), "strategy"), (Sharing(interval="Fast"), "interval"),
     (Sharing(active_thread_percentage=50), "strategy"),
     (Sharing(strategy="MPS", active_thread_percentage=0), "active_thread_percentage"),
     (Sharing(strategy="MPS", pinned_memory_limit="10 GB"), "pinned_memory_limit")],
)
def test_bad_sharing_names_the_field(sharing, field):
    with pytest.raises(InvalidParameter) as err:
        shared_gpu_claim_template(sharing)
    assert err.value.name == field


def test_bad_namespace_is_named():
    with pytest.raises(InvalidParameter) as err:
        mig_claim_template("1g.6gb", namespace="Team_A")
    assert err.value.name == "namespace"


def test_template_selectors_are_compiled_at_render_time(monkeypatch):
    """A typo in a selector fails when the template is built, not on the cluster."""
    from draslice.cluster import templates

    monkeypatch.setattr(
        templates, "mig_selector",
        lambda profile: f'device.atributes["gpu.nvidia.com"].profile == "{profile}"',
    )
    with pytest.raises(InvalidParameter, match="atributes"):
        templates.mig_claim_template("1g.6gb")


@pytest.mark.parametrize("text, slices", [
    ("1g.6gb", 1), ("2g.20gb", 2), ("1g.10gb+me", 1), ("7g.141gb", 7),
    ("NVIDIA H200 MIG 3g.71gb", 3), ("NVIDIA A100-SXM4-40GB MIG 2g.10gb", 2),
    ("NVIDIA H200", None), ("full", None), ("NVIDIA A100-SXM4-80GB", None), ("0g.5gb", None),
])
def test_one_grammar_reads_compute_slices_from_profiles_and_device_names(text, slices):
    # sizing (advise's memory ranking and time prediction) and the templates share it
    from draslice.cluster.names import mig_compute_slices
    assert mig_compute_slices(text) == slices

"""``draslice upload`` against the fake KFP server: idempotent, a new version on change."""

from __future__ import annotations

import re

from draslice.kfp_ops import KfpConnection, connect, resolve_package, upload


def _ids(output: str) -> tuple[str, str]:
    pid = re.search(r"^pipeline .* id=(\S+)", output, re.M).group(1)
    vid = re.search(r"^version .* id=(\S+)", output, re.M).group(1)
    return pid, vid


def test_first_upload_creates_pipeline_and_content_named_version(cli, fake_kfp):
    res = cli("upload", "--variant", "sft.policy.mig-1g-6gb")
    assert res.exit_code == 0, res.output
    assert "draslice-sft-mig-1g-6gb" in res.output
    assert "(created)" in res.output
    pid, vid = _ids(res.output)
    versions = fake_kfp.state.versions[pid]
    names = [v.display_name for v in versions]
    assert re.fullmatch(r"v0\.1\.0-[0-9a-f]{12}", names[-1])
    assert versions[-1].pipeline_version_id == vid
    assert f"{fake_kfp.url}/#/pipelines/details/{pid}/version/{vid}" in res.output


def test_reupload_unchanged_creates_nothing(cli, fake_kfp):
    first = cli("upload", "--variant", "canary.policy.mig-1g-6gb")
    uploads_before = sum(r.path.endswith(("/upload", "/upload_version"))
                         for r in fake_kfp.requests)
    second = cli("upload", "--variant", "canary.policy.mig-1g-6gb")
    assert second.exit_code == 0, second.output
    assert _ids(first.output) == _ids(second.output)
    assert "(exists)" in second.output and "unchanged, nothing uploaded" in second.output
    uploads_after = sum(r.path.endswith(("/upload", "/upload_version"))
                        for r in fake_kfp.requests)
    assert uploads_after == uploads_before
    assert len(fake_kfp.state.pipelines) == 1


def test_changed_yaml_adds_exactly_one_version(cli, fake_kfp, compiled):
    path = compiled / "canary.policy.mig-1g-6gb.yaml"
    pid, v1 = _ids(cli("upload", "--variant", "canary.policy.mig-1g-6gb").output)
    path.write_text(path.read_text().replace(
        "Canary for DRA GPU slices", "Canary (edited) for DRA GPU slices"))
    res = cli("upload", "--variant", "canary.policy.mig-1g-6gb")
    pid2, v2 = _ids(res.output)
    assert (pid2, "(exists)") == (pid, "(exists)") and "(exists)" in res.output
    assert v2 != v1 and "version" in res.output and "(created)" in res.output
    assert len(fake_kfp.state.versions[pid]) == 3  # server's first + two content versions


def test_paging_finds_pipeline_and_version_beyond_first_page(cli, fake_kfp):
    """With one item a page and a server that ignores the name filter, every page is read
    and the name is checked on our side."""
    fake_kfp.max_page_size = 1
    fake_kfp.honor_filters = False
    for v in ("sft.policy.mig-1g-6gb", "sft.policy.shared-gpu-timeslice",
              "canary.policy.shared-gpu-timeslice"):
        assert cli("upload", "--variant", v).exit_code == 0
    res = cli("upload", "--all")
    assert res.exit_code == 0, res.output
    # Every variant; the 3 already there are found across pages and left alone
    from draslice.pipelines.variants import VARIANTS

    assert res.output.count("unchanged, nothing uploaded") == 3
    assert len(fake_kfp.state.pipelines) == len(VARIANTS)
    listed = [r for r in fake_kfp.requests if r.path.endswith("/pipelines")]
    assert any(r.query.get("page_token") for r in listed)


def test_python_api_upload_and_path_variant(fake_kfp, compiled):
    session = connect(KfpConnection(host=fake_kfp.url))
    package = resolve_package(str(compiled / "sft.native.mig-1g-6gb.yaml"))
    assert package.native_claims
    result = upload(session, package, name="my-native-sft")
    assert result.created_pipeline and result.created_version
    assert fake_kfp.state.pipelines[result.pipeline_id].display_name == "my-native-sft"
    again = upload(session, package, name="my-native-sft")
    assert (again.created_pipeline, again.created_version) == (False, False)
    assert again.version_id == result.version_id


def test_unknown_variant_lists_the_valid_ones(cli):
    res = cli("upload", "--variant", "sft.policy.mig-9g")
    assert res.exit_code == 2
    assert "sft.policy.mig-1g-6gb" in res.output and "canary.policy.shared-gpu-timeslice" in \
        res.output

"""Profile advice: the table, recommend() on it and on cluster candidates, and the command."""

from __future__ import annotations

import json
import re

import pytest
from click.testing import CliRunner

from draslice.cli import main
from draslice.cli.commands.advise_cmd import GPU_CHOICES
from draslice.errors import InvalidParameter
from draslice.sizing.profiles import TABLE, SliceProfile, candidates, recommend
from draslice.trainer import budget


def test_table_covers_the_gpu_models_and_names_match_their_memory():
    assert set(GPU_CHOICES) == {"all", *TABLE}
    for gpu, rows in TABLE.items():
        assert rows, gpu
        sizes = [p.memory_gib for p in rows]
        assert sizes == sorted(sizes), gpu
        for p in rows:
            assert re.fullmatch(r"[1-7]g\.\d+gb", p.name), p
            nominal = int(p.name.split(".")[1].removesuffix("gb"))
            # What a process sees is a little below the name's nominal GB, never above it.
            assert 0.85 * nominal <= p.memory_gib <= nominal, p
            assert p.estimated or "estimated" not in p.source, p
    confirmed = [p for p in candidates() if not p.estimated]
    assert {p.gpu for p in confirmed} == {"H100-80GB", "A100-80GB"}


def test_recommend_picks_the_smallest_profile_with_headroom():
    a30 = candidates("A30-24GB")
    rec = recommend(5.1, a30, headroom=0.1)
    assert rec.chosen.name == "1g.6gb"  # 5.1 <= 5.75 * 0.9 = 5.175
    assert rec.next_smaller is None
    rec = recommend(5.2, a30, headroom=0.1)
    assert rec.chosen.name == "2g.12gb"
    assert rec.next_smaller.name == "1g.6gb"
    assert [fits for _, fits in rec.ranked] == [False, True, True]
    assert recommend(5.2, a30, headroom=0.0).chosen.name == "1g.6gb"


def test_recommend_prefers_fewer_compute_slices_at_equal_memory():
    rec = recommend(12.0, candidates("H100-80GB"))
    assert rec.chosen.name == "1g.20gb"
    assert rec.next_smaller.name == "1g.10gb"


def test_nothing_fits_names_the_largest_as_the_one_to_shrink_into():
    rec = recommend(500.0, candidates("A100-40GB"))
    assert rec.chosen is None
    assert rec.next_smaller.name == "7g.40gb"


def test_cluster_candidates_with_no_free_device_are_never_chosen():
    cluster = [SliceProfile("1g.10gb", 9.5, free=0), SliceProfile("2g.20gb", 19.5, free=3)]
    rec = recommend(4.0, cluster)
    assert rec.chosen.name == "2g.20gb"
    assert rec.to_dict()["candidates"][0]["fits"] is True


def test_recommend_rejects_bad_input():
    with pytest.raises(InvalidParameter, match="candidates"):
        recommend(1.0, [])
    with pytest.raises(InvalidParameter, match="memory_headroom"):
        recommend(1.0, candidates("A30-24GB"), headroom=1.5)
    with pytest.raises(InvalidParameter, match="gpu"):
        candidates("V100")


def test_budget_rule_is_the_one_validate_uses():
    rec = recommend(8.0, candidates("H100-80GB"), headroom=0.2)
    chosen = rec.chosen
    assert budget.fits(8.0, chosen.memory_gib, 0.2)
    assert not budget.fits(8.0, rec.next_smaller.memory_gib, 0.2)


def test_advise_command_without_measuring():
    result = CliRunner().invoke(main, ["advise", "--peak-gib", "5.2", "--gpu", "A30-24GB"])
    assert result.exit_code == 0, result.output
    assert "recommended: A30-24GB 2g.12gb (11.50 GiB, estimated)" in result.output
    assert "to fit the next smaller profile, A30-24GB 1g.6gb (5.75 GiB):" in result.output
    assert "try --gradient-checkpointing" in result.output


def test_advise_measures_a_real_model_run(tiny_llama, demo_data):
    result = CliRunner().invoke(main, [
        "advise", "--model-dir", str(tiny_llama), "--data", str(demo_data["chat"]),
        "--max-length", "64", "--batch-size", "4", "--device", "cpu", "--measure-steps", "2",
        "--gpu", "A100-40GB", "--json",
    ])
    assert result.exit_code == 0, result.output
    advice = json.loads(result.output[result.output.index("{"):])
    assert advice["peak_gib"] > 0
    assert advice["peak_is_gpu_memory"] is False  # on the CPU it says so
    # and gives no time: a CPU's step says nothing of a GPU slice's
    assert advice["measured_step"] is None
    assert advice["candidates"][0]["time"] == {"none": "not predicted: measured on the CPU"}
    assert advice["chosen"]["gpu"] == "A100-40GB"
    assert len(advice["candidates"]) == len(TABLE["A100-40GB"])


def test_advise_bad_input_is_one_line(tmp_path):
    result = CliRunner().invoke(main, ["advise", "--model-dir", str(tmp_path)])
    assert result.exit_code == 2
    assert "error: invalid data=''" in result.output


def test_advise_chooses_from_the_slices_a_cluster_dump_publishes(tmp_path):
    from draslice.tests.cluster.conftest import claim, mig, rslice, write_snapshot

    node = "worker-1"
    dump = write_snapshot(tmp_path / "dump.yaml", [
        rslice(node, [mig("gpu-0-mig-1g10gb-0", "1g.10gb", "9728Mi"),
                      mig("gpu-0-mig-2g20gb-1", "2g.20gb", "19968Mi")]),
        # The only 1g.10gb is taken: advise must not send the job there.
        claim("busy", {"pool": node, "device": "gpu-0-mig-1g10gb-0"}),
    ])
    result = CliRunner().invoke(main, ["advise", "--peak-gib", "4", "--snapshot", str(dump)])
    assert result.exit_code == 0, result.output
    assert re.search(r"fits  NVIDIA A100 80GB PCIe 1g\.10gb\s+9\.50 GiB, 0 free", result.output)
    assert "recommended: NVIDIA A100 80GB PCIe 2g.20gb (19.50 GiB)" in result.output
    empty = write_snapshot(tmp_path / "empty.yaml", [])
    result = CliRunner().invoke(main, ["advise", "--peak-gib", "4", "--snapshot", str(empty)])
    assert result.exit_code == 2 and "no GPU or MIG device of gpu.nvidia.com" in result.output


def test_advise_over_every_gpu_model_lists_each_models_boundary_unless_verbose():
    """Short by default: with every GPU model's table (33 profiles) it lists, for each model,
    the largest profile the peak does not fit and the smallest it fits; --verbose all."""
    result = CliRunner().invoke(main, ["advise", "--peak-gib", "7.9"])
    assert result.exit_code == 0, result.output
    rows = re.findall(r"^  (fits|    )  (\S+ \S+)\s", result.output, re.M)
    assert rows == [("    ", "A100-40GB 1g.5gb"), ("    ", "A30-24GB 1g.6gb"),
                    ("fits", "A100-80GB 1g.10gb"), ("fits", "A100-40GB 1g.10gb"),
                    ("fits", "H100-80GB 1g.10gb"), ("fits", "A30-24GB 2g.12gb"),
                    ("fits", "H200-141GB 1g.18gb"), ("fits", "B200-180GB 1g.23gb")]
    every = sum(len(profiles) for profiles in TABLE.values())
    assert f"({every - len(rows)} more: --verbose lists every profile" in result.output
    assert "recommended: A100-80GB 1g.10gb (9.50 GiB)" in result.output
    verbose = CliRunner().invoke(main, ["advise", "--peak-gib", "7.9", "--verbose"])
    assert len(re.findall(r"^  (fits|    )  \S+ \S+\s", verbose.output, re.M)) == every
    assert "more: --verbose" not in verbose.output


def test_advise_shows_the_chosen_profile_when_a_smaller_fit_has_none_free(tmp_path):
    from draslice.tests.cluster.conftest import claim, mig, rslice, write_snapshot

    dump = write_snapshot(tmp_path / "dump.yaml", [
        rslice("a100-node", [mig("gpu-0-mig-1g10gb-0", "1g.10gb", "9728Mi"),
                             mig("gpu-0-mig-2g20gb-1", "2g.20gb", "19968Mi")]),
        rslice("h100-node", [mig("gpu-0-mig-3g40gb-0", "3g.40gb", "40448Mi",
                                 product="NVIDIA H100 80GB HBM3")]),
        claim("busy", {"pool": "a100-node", "device": "gpu-0-mig-1g10gb-0"}),
    ])
    result = CliRunner().invoke(main, ["advise", "--peak-gib", "4", "--snapshot", str(dump)])
    assert result.exit_code == 0, result.output
    assert re.search(r"fits  NVIDIA A100 80GB PCIe 1g\.10gb\s+9\.50 GiB, 0 free", result.output)
    assert re.search(r"fits  NVIDIA A100 80GB PCIe 2g\.20gb\s+19\.50 GiB, 1 free", result.output)
    assert "recommended: NVIDIA A100 80GB PCIe 2g.20gb (19.50 GiB)" in result.output

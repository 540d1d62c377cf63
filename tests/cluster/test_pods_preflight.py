"""``draslice preflight --gpus K`` and ``--pods N``: the upstream allocator answers whether K
GPUs fit on one node, and whether N pods' claims fit together (each placed against the ones
before it), on the real two-node, 16-GPU H100 dump."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from draslice.cli import main
from draslice.tests.conftest import fixture_path

H100 = "resourceslices/h100-80gb-x8-two-nodes.k8s-1.35.list.yaml"


def preflight(*args: str):
    return CliRunner().invoke(main, ["preflight", "--snapshot", str(fixture_path(H100)), *args])


@pytest.mark.parametrize(("args", "code", "verdict"), [
    (["--gpus", "8"], 0, "node gpu-node-1 can serve it"),
    (["--gpus", "9"], 1, "no node can serve the claim now"),  # 16 free, 8 per node
    (["--gpus", "4", "--pods", "4"], 0,
     "4 pod(s) × gpus-4: every pod's claim can be allocated now (pods per node: "
     "gpu-node-1: 2, gpu-node-2: 2)"),
    (["--gpus", "4", "--pods", "5"], 1,
     "5 pod(s) × gpus-4: only 4 of 5 claims can be allocated now"),
    (["--gpus", "3", "--pods", "5"], 1,  # 2 pods per node leave 2 GPUs on each: 4 pods only
     "only 4 of 5 claims"),
    (["--shared", "timeslicing", "--pods", "16"], 0, "16 pod(s) × shared-gpu-timeslice: every"),
    (["--gpus", "9", "--pods", "2"], 1, "2 pod(s) × gpus-9: not even one claim"),
])
def test_verdict_line(args, code, verdict):
    result = preflight(*args)
    assert result.exit_code == code, result.output
    first = result.output.splitlines()[0]
    assert verdict in first, first


def test_pods_after_the_first_see_the_earlier_allocations():
    """The JSON report of the pod that does not fit shows every GPU taken by the others."""
    result = preflight("--gpus", "8", "--pods", "3", "--json")
    assert result.exit_code == 1, result.output
    report = json.loads(result.output)
    assert "only 2 of 3 claims" in report["reason"]
    (request,) = report["requests"]
    assert (request["matching"], request["free"]) == (16, 0)


@pytest.mark.parametrize(("args", "says"), [
    (["--gpus", "0"], "invalid gpus=0"),
    (["--pods", "0", "--shared", "mps"], "invalid pods=0"),
    (["--pods", "2"], "invalid pods=2: needs a template"),
    (["--gpus", "2", "--profile", "1g.10gb"], "give at most one of them"),
])
def test_bad_input_is_one_line_exit_2(args, says):
    result = preflight(*args)
    assert result.exit_code == 2, result.output
    assert says in result.output and "Traceback" not in result.output

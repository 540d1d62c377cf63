"""scripts/e2e_dra_gpu_slice.sh with a stand-in kubectl and the fake KFP server.

``kubectl`` is a small stub (it answers ``get resourceslices`` from a variable and ``logs``
from a file, and records every call); ``draslice`` is the real CLI except ``preflight``
(written in another module, stubbed to an exit code), so upload, submit and wait really
talk to the fake KFP server over loopback.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "scripts" / "e2e_dra_gpu_slice.sh"

KUBECTL = r"""#!/usr/bin/env bash
echo "kubectl $*" >> "$STUB_CALLS"
case "$1 $2" in
  "get resourceslices")
    [[ "${STUB_NO_DRA_API:-}" == 1 ]] && { echo 'error: no resource type' >&2; exit 1; }
    printf '%b' "${STUB_DRIVERS:-}"; exit 0 ;;
  "get workflows") exit 0 ;;
esac
case "$1" in
  logs) cat "$STUB_LOGS" ;;
  apply) for a in "$@"; do [[ -f "$a" ]] && cat "$a" >> "$STUB_CALLS"; done; exit 0 ;;
  label) exit 0 ;;
  *) echo "unexpected kubectl $*" >&2; exit 3 ;;
esac
"""

# The real upload/submit commands behind the CLI's error handling, without importing the
# torch-heavy `run` command (that would cost ~10 s a call on a small CI machine).
DRASLICE_PY = """
import sys, click
from draslice.cli.commands import manifests_cmd, submit_cmd, upload_cmd
from draslice.errors import DrasliceError
group = click.Group(commands=[upload_cmd.upload, submit_cmd.submit, manifests_cmd.manifests])
try:
    group.main(sys.argv[1:], prog_name="draslice", standalone_mode=False)
except DrasliceError as err:
    click.echo(f"error: {err}", err=True)
    sys.exit(err.exit_code)
"""

DRASLICE = r"""#!/usr/bin/env bash
if [[ "$1" == preflight ]]; then
  echo "draslice $*" >> "$STUB_CALLS"; exit "${STUB_PREFLIGHT_RC:-0}"
fi
exec "$STUB_PYTHON" -c "$STUB_DRASLICE_PY" "$@"
"""

GOOD_LOGS = "[slice] peak_mem=0.2 GiB\nDRA LoRA SFT on GPU slice: OK\nverdict: PASS (4 checks)\n"


@pytest.fixture
def e2e(tmp_path, fake_kfp):
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for name, text in (("kubectl", KUBECTL), ("draslice", DRASLICE)):
        (bin_dir / name).write_text(text)
        (bin_dir / name).chmod(0o755)
    logs = tmp_path / "pod.log"
    logs.write_text(GOOD_LOGS)
    calls = tmp_path / "calls"
    calls.write_text("")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("KFP", "KF_PIPELINES"))}
    env.update(PATH=f"{bin_dir}:{env['PATH']}", STUB_CALLS=str(calls), STUB_LOGS=str(logs),
               STUB_PYTHON=sys.executable, STUB_DRASLICE_PY=DRASLICE_PY,
               STUB_DRIVERS="gpu.nvidia.com\\ngpu.nvidia.com\\n",
               KFP_HOST=fake_kfp.url, TIMEOUT="60", POLL="0.05",
               HOME=str(tmp_path))
    # A fresh HOME must not mean a cold Go build of preflight's allocator (minutes): keep the
    # real caches, which are keyed by content.
    real_home = Path.home()
    env.setdefault("XDG_CACHE_HOME", str(real_home / ".cache"))
    env.setdefault("GOPATH", str(real_home / "go"))
    env.setdefault("GOCACHE", str(real_home / ".cache" / "go-build"))

    def run(**extra):
        proc = subprocess.run(["bash", str(SCRIPT)], cwd=REPO, env={**env, **extra},
                              capture_output=True, text=True, timeout=180)
        return proc, calls.read_text()

    run.logs = logs
    return run


def test_script_is_shellcheck_clean():
    if shutil.which("shellcheck") is None:
        pytest.skip("shellcheck is not installed (apt-get install shellcheck)")
    proc = subprocess.run(["shellcheck", str(SCRIPT)], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout


def test_skips_when_the_driver_publishes_no_slice(e2e, fake_kfp):
    proc, calls = e2e(STUB_DRIVERS="compute-domain.nvidia.com\\n")
    assert proc.returncode == 77, proc.stdout + proc.stderr
    assert "no ResourceSlice for driver gpu.nvidia.com" in proc.stdout
    assert "apply" not in calls and "preflight" not in calls
    assert not fake_kfp.requests


def test_skips_without_a_dra_api(e2e):
    proc, _ = e2e(STUB_NO_DRA_API="1")
    assert proc.returncode == 77 and "no resource.k8s.io ResourceSlice API" in proc.stdout


def test_preflight_skip_is_a_skip(e2e, fake_kfp):
    proc, calls = e2e(STUB_PREFLIGHT_RC="77")
    assert proc.returncode == 77, proc.stdout + proc.stderr
    assert "draslice preflight --template mig-1g-6gb --namespace kubeflow --on-missing-dra skip" \
        in calls
    assert not fake_kfp.state.runs


def test_full_pass_uploads_runs_waits_and_reads_the_verdict(e2e, fake_kfp):
    proc, calls = e2e()
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "PASS: run run-" in proc.stdout
    # rendered by the real `draslice manifests` for this template and namespace
    assert "kind: ResourceClaimTemplate\nmetadata:\n  name: mig-1g-6gb\n  namespace: kubeflow" \
        in calls
    assert "kind: ClusterRole" in calls and "name: pipeline-runner" in calls
    assert "apiVersion: admissionregistration.k8s.io/v1\nkind: MutatingAdmissionPolicy\n" in calls
    assert "label namespace kubeflow draslice.dev/claim-injection=enabled --overwrite" in calls
    (run, _), = fake_kfp.state.runs.values()
    assert run.pipeline_version_reference is not None
    assert run.runtime_config.parameters == {"on_missing_dra": "fail"}
    assert f"pipeline/runid={run.run_id}" in calls


def test_native_mode_applies_no_admission_policy(e2e, fake_kfp):
    proc, calls = e2e(MODE="native")
    assert proc.returncode == 1  # the fake is a 2.17 backend: it rejects podResourceClaims
    assert "podResourceClaims" in proc.stderr + proc.stdout
    assert "MutatingAdmissionPolicy" not in calls


def test_failed_run_fails(e2e, fake_kfp):
    fake_kfp.script_next_run("RUNNING", "FAILED")
    proc, _ = e2e()
    assert proc.returncode == 1 and "did not succeed" in proc.stdout


def test_missing_verdict_line_fails(e2e):
    e2e.logs.write_text("DRA LoRA SFT on GPU slice: OK\nverdict: FAIL (peak memory)\n")
    proc, _ = e2e()
    assert proc.returncode == 1 and "no 'verdict: PASS'" in proc.stdout


def test_manifests_follow_template_namespace_and_engine(e2e, fake_kfp):
    proc, calls = e2e(TEMPLATE="shared-gpu-timeslice", NAMESPACE="team-a",
                      ENGINE="map-v1beta1", SERVICE_ACCOUNT="default-editor")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "name: shared-gpu-timeslice\n  namespace: team-a" in calls
    assert "strategy: TimeSlicing" in calls
    assert "name: default-editor" in calls
    assert "apiVersion: admissionregistration.k8s.io/v1beta1\nkind: MutatingAdmissionPolicy\n" \
        in calls


def test_template_without_known_manifest_is_a_setup_error(e2e, fake_kfp):
    proc, calls = e2e(TEMPLATE="my-own-template")
    assert proc.returncode == 2
    assert "set CLAIM_TEMPLATE_FILE (or PROFILE for a MIG profile)" in proc.stdout
    assert "apply" not in calls and not fake_kfp.requests

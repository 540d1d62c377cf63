"""Fixtures for the KFP tests: a fake v2beta1 server on 127.0.0.1 and a CLI runner."""

from __future__ import annotations

import logging
import shutil
from pathlib import Path

import kfp
import pytest
from click.testing import CliRunner

from draslice.cli import main
from draslice.tests.kfpserver.kfp_fake_server import FakeKfp

REPO = Path(__file__).resolve().parents[2]
_ENV = ("KF_PIPELINES_ENDPOINT", "KF_PIPELINES_UI_ENDPOINT", "KFP_TOKEN",
        "KF_PIPELINES_SA_TOKEN_PATH", "KF_PIPELINES_DEFAULT_EXPERIMENT_NAME",
        "KF_PIPELINES_OVERRIDE_EXPERIMENT_NAME")


@pytest.fixture(autouse=True)
def _isolated_kfp(tmp_path, monkeypatch):
    """No real kfp context file, no endpoint or token from the developer's environment."""
    monkeypatch.setattr(kfp.Client, "_LOCAL_KFP_CONTEXT", str(tmp_path / "kfp-context.json"))
    for name in _ENV:
        monkeypatch.delenv(name, raising=False)


@pytest.fixture
def fake_kfp():
    """A running KFP 2.17.0 test server in single-user mode (namespace ignored, as the real
    one in that mode), unless the test sets ``multi_user``; the test fails if any request body
    was malformed."""
    server = FakeKfp().start()
    try:
        yield server
    finally:
        server.stop()
    assert not server.violations, "malformed request bodies:\n" + "\n".join(server.violations)


@pytest.fixture
def compiled(tmp_path) -> Path:
    """A private copy of compiled/ that a test may change."""
    dst = tmp_path / "compiled"
    shutil.copytree(REPO / "compiled", dst)
    return dst


class Cli:
    def __init__(self, host: str, compiled_dir: Path) -> None:
        self.host = host
        self.compiled_dir = compiled_dir
        self.runner = CliRunner()

    def __call__(self, *args: str, env: dict | None = None, host: bool = True):
        argv = list(args)
        if host and "--host" not in argv:
            argv += ["--host", self.host]
        if argv[0] in ("upload", "submit") or argv[:2] == ["schedule", "create"]:
            argv += ["--compiled-dir", str(self.compiled_dir)]
        return self.runner.invoke(main, argv, env=env, catch_exceptions=False)


@pytest.fixture
def cli(fake_kfp, compiled) -> Cli:
    return Cli(fake_kfp.url, compiled)


@pytest.fixture
def all_logs(caplog):
    """Capture every logger at DEBUG (kfp, kfp_server_api, urllib3 included)."""
    caplog.set_level(logging.DEBUG)
    for name in ("kfp_server_api", "urllib3", "kfp", "draslice"):
        logging.getLogger(name).setLevel(logging.DEBUG)
    yield caplog

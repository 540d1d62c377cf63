"""Credentials reach the server and nowhere else; server and network errors read clearly."""

from __future__ import annotations

import socket

import pytest

from draslice.kfp_ops import KfpConnection
from draslice.tests.kfpserver.kfp_fake_server import FakeKfp
from draslice.tests.kfpserver.kfp_tls import make_ca_and_server_cert

TOKEN = "tok-9f8e7d6c5b4a-SECRET"
COOKIE = "authservice_session=cookie-1a2b3c-SECRET"


def _auth_headers(fake):
    return [r.headers.get("authorization") for r in fake.requests]


def _assert_secret_nowhere(secret, res, logs):
    assert secret not in res.output
    assert secret not in logs.text
    for record in logs.records:
        assert secret not in record.getMessage()


def test_token_from_env_is_sent_and_never_shown(cli, fake_kfp, all_logs):
    fake_kfp.required_token = TOKEN
    res = cli("upload", "--token-env", "MY_KFP_TOKEN", env={"MY_KFP_TOKEN": TOKEN})
    assert res.exit_code == 0, res.output
    assert set(_auth_headers(fake_kfp)) == {f"Bearer {TOKEN}"}
    assert len(fake_kfp.requests) >= 4
    _assert_secret_nowhere(TOKEN, res, all_logs)


def test_kfp_token_env_is_the_default(cli, fake_kfp):
    fake_kfp.required_token = TOKEN
    res = cli("submit", "--variant", "canary.policy.mig-1g-6gb", env={"KFP_TOKEN": TOKEN})
    assert res.exit_code == 0, res.output


def test_token_file_and_sa_token_use_the_file(cli, fake_kfp, tmp_path, all_logs):
    fake_kfp.required_token = TOKEN
    token_file = tmp_path / "token"
    token_file.write_text(TOKEN + "\n")
    res = cli("schedule", "list", "--token-file", str(token_file))
    assert res.exit_code == 0, res.output
    res2 = cli("schedule", "list", "--sa-token", "--sa-token-path", str(token_file))
    assert res2.exit_code == 0, res2.output
    assert set(_auth_headers(fake_kfp)) == {f"Bearer {TOKEN}"}
    _assert_secret_nowhere(TOKEN, res, all_logs)


def test_rotated_token_file_is_reread(fake_kfp, tmp_path):
    from draslice.kfp_ops import connect, list_schedules

    token_file = tmp_path / "token"
    token_file.write_text("first-token")
    fake_kfp.required_token = "first-token"
    session = connect(KfpConnection(host=fake_kfp.url, token_file=str(token_file)))
    token_file.write_text("second-token")
    fake_kfp.required_token = "second-token"
    assert list_schedules(session) == []


def test_cookies_file_sends_the_cookie(cli, fake_kfp, tmp_path, all_logs):
    fake_kfp.required_cookie = COOKIE
    cookies = tmp_path / "cookies"
    cookies.write_text(COOKIE)
    res = cli("upload", "--cookies-file", str(cookies))
    assert res.exit_code == 0, res.output
    assert all(COOKIE in (r.headers.get("cookie") or "") for r in fake_kfp.requests)
    _assert_secret_nowhere(COOKIE, res, all_logs)
    _assert_secret_nowhere(COOKIE.split("=", 1)[1], res, all_logs)


def test_401_says_how_to_authenticate_and_leaks_nothing(cli, fake_kfp, all_logs):
    fake_kfp.required_token = TOKEN
    res = cli("upload", "--token-env", "T", env={"T": "wrong-token-XYZ123"})
    assert res.exit_code == 8
    assert "401 Unauthorized" in res.output and "--token-env" in res.output
    assert "Traceback" not in res.output
    _assert_secret_nowhere("wrong-token-XYZ123", res, all_logs)


def test_403_mentions_namespace(cli, fake_kfp):
    fake_kfp.fail("GET", r"/healthz$", 403, "user may not access namespace team-b")
    res = cli("schedule", "list", "--namespace", "team-b")
    assert res.exit_code == 8
    assert "403 Forbidden" in res.output and "--namespace" in res.output
    assert "team-b" in res.output


def test_500_shows_the_servers_message(cli, fake_kfp):
    fake_kfp.fail("POST", r"/pipelines/upload$", 500, "Failed to create pipeline: db is down")
    res = cli("upload")
    assert res.exit_code == 10
    assert "HTTP 500" in res.output and "db is down" in res.output
    assert "uploading draslice-sft-mig-1g-6gb" in res.output


def test_404_on_a_wrong_host_path(cli, fake_kfp):
    """A path outside KFP's API gets Go's plain-text 404 (KFP 2.17.0 observed)."""
    res = cli("schedule", "list", "--host", fake_kfp.url + "/not-kfp")
    assert res.exit_code == 9
    assert res.output.rstrip().endswith("answered 404 Not Found: a wrong pipeline, version, run "
                                        "or schedule id, or a --host without the KFP API behind "
                                        "it. Server said: 404 page not found")


def test_unreachable_host_fails_fast_and_clearly(cli):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # closed once we leave: nothing listens there
    res = cli("upload", "--host", f"http://127.0.0.1:{port}")
    assert res.exit_code == 7
    assert f"cannot reach the KFP API at http://127.0.0.1:{port}" in res.output
    assert "port-forward" in res.output


def test_missing_token_env_names_the_variable_not_a_value(cli):
    res = cli("upload", "--token-env", "NOT_SET_ANYWHERE")
    assert res.exit_code == 2
    assert "NOT_SET_ANYWHERE" in res.output and "unset or empty" in res.output


def test_two_token_sources_are_refused(cli, tmp_path):
    f = tmp_path / "t"
    f.write_text("x")
    res = cli("upload", "--token-env", "A", "--token-file", str(f), env={"A": "x"})
    assert res.exit_code == 2 and "choose one token source" in res.output


def test_connection_repr_holds_no_secret(monkeypatch):
    monkeypatch.setenv("MY_KFP_TOKEN", TOKEN)
    conn = KfpConnection(host="https://kfp.example", token_env="MY_KFP_TOKEN")
    assert TOKEN not in repr(conn) and "MY_KFP_TOKEN" in repr(conn)


@pytest.fixture
def tls_kfp(tmp_path):
    ca, cert, key = make_ca_and_server_cert(tmp_path)
    server = FakeKfp().start(tls=(str(cert), str(key)))
    try:
        yield server, ca
    finally:
        server.stop()
    assert not server.violations


@pytest.mark.filterwarnings("ignore::urllib3.exceptions.InsecureRequestWarning")
def test_tls_is_verified_by_default_and_a_ca_bundle_makes_it_work(tls_kfp, cli):
    server, ca = tls_kfp
    refused = cli("schedule", "list", "--host", server.url)
    assert refused.exit_code == 7
    assert "--ca-bundle" in refused.output
    trusted = cli("schedule", "list", "--host", server.url, "--ca-bundle", str(ca))
    assert trusted.exit_code == 0, trusted.output
    skipped = cli("schedule", "list", "--host", server.url, "--insecure-skip-tls-verify")
    assert skipped.exit_code == 0, skipped.output


# --- one deadline a request; schemes; TLS to a plain-HTTP server (issue 37, item 12) --------

@pytest.fixture
def short_deadline(monkeypatch):
    """A 2 s deadline and progress after 0.5 s, so the test need not wait 30 s."""
    from draslice.kfp_ops import transport

    monkeypatch.setattr(transport, "REQUEST_DEADLINE_S", 2.0)
    monkeypatch.setattr(transport, "PROGRESS_AFTER_S", 0.5)
    monkeypatch.setattr(transport, "PROGRESS_EVERY_S", 0.5)
    return 2.0


@pytest.mark.parametrize(("method", "path", "action"), [
    ("GET", r"/healthz$", "connecting"),
    ("POST", r"/pipelines/upload$", "uploading draslice-sft-mig-1g-6gb"),
])
def test_a_stalling_host_keeps_the_deadline_its_message_names(cli, fake_kfp, short_deadline,
                                                              method, path, action):
    import time

    fake_kfp.stall(method, path, times=10)
    start = time.monotonic()
    res = cli("upload")
    took = time.monotonic() - start
    assert res.exit_code == 7, res.output
    assert f"error: {action}: {fake_kfp.url} did not answer within 2 s (it took the connection " \
           "and sent nothing back)" in res.output
    assert took < short_deadline + 1.5, took  # one deadline, not one per retry
    assert [r.path for r in fake_kfp.requests if r.method == method
            and r.path.endswith(path.strip("$"))] == [f"/apis/v2beta1{path.strip('$')}"]
    progress = [ln for ln in res.stderr.splitlines() if ln.startswith("waiting for")]
    assert progress and progress[0].startswith(f"waiting for {fake_kfp.url} ({action}): ")
    assert progress[0].endswith("s of at most 2 s")


def test_a_scheme_other_than_http_is_refused(cli, fake_kfp):
    res = cli("upload", "--host", "ftp://kfp.example.com")
    assert res.exit_code == 2
    assert "invalid --host='ftp://kfp.example.com': the KFP API speaks HTTP: give an http:// " \
           "or https:// URL, not ftp://" in res.output
    assert "https://ftp://" not in res.output and fake_kfp.requests == []


def test_tls_to_a_plain_http_server_suggests_http(cli, fake_kfp):
    host = fake_kfp.url.replace("http://", "https://")
    res = cli("schedule", "list", "--host", host)
    assert res.exit_code == 7, res.output
    assert f"{host} does not speak TLS: it answers plain HTTP. Use --host {fake_kfp.url}" \
        in res.output
    assert "--ca-bundle" not in res.output

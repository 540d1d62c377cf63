"""A server (or a proxy in front of it) that echoes the request's headers into its answer must
not get a credential printed or logged: not whole, and not cut to its first characters when
the echo is long (the message used to be shortened before the secret was redacted).

Every credential source, short and long echoes, on upload, submit and schedule; the long
echo puts the secret across the point where the line is cut. Single-user mode.
"""

from __future__ import annotations

import json

import pytest

from draslice.kfp_ops.errors import MAX_SERVER_TEXT, SNIPPET_CHARS

TOKEN = "tok-7Qv9ZpR2xW4mN8bK3sJ6"
COOKIE_VALUES = ("sess-4Hf8Kq2Lm9Zx7Rt3", "csrf-Wq5Ne1Tb6Yc0Ud8Pg")
COOKIES = f"authservice_session={COOKIE_VALUES[0]}; oauth2_csrf={COOKIE_VALUES[1]}"
WINDOW = 6  # no run of this many characters of a secret may show


def _source(name: str, tmp_path) -> tuple[list[str], dict, tuple[str, ...], str]:
    """(arguments, environment, secrets, what the echo shows before the first secret)."""
    token_file = tmp_path / "token"
    token_file.write_text(TOKEN + "\n")
    cookies_file = tmp_path / "cookies"
    cookies_file.write_text(COOKIES)
    bearer = "request headers: authorization: Bearer "
    return {
        "KFP_TOKEN": ([], {"KFP_TOKEN": TOKEN}, (TOKEN,), bearer),
        "--token-env": (["--token-env", "MY_KFP_TOKEN"], {"MY_KFP_TOKEN": TOKEN}, (TOKEN,),
                        bearer),
        "--token-file": (["--token-file", str(token_file)], {}, (TOKEN,), bearer),
        "--sa-token": (["--sa-token", "--sa-token-path", str(token_file)], {}, (TOKEN,), bearer),
        "--cookies-file": (["--cookies-file", str(cookies_file)], {}, COOKIE_VALUES,
                           "request headers: Cookie: authservice_session="),
    }[name]


# (command, the request whose answer echoes, its shape, the status)
ECHOES = {
    "upload/list": (("upload",), "GET", r"/pipelines$", "field", 200),
    "upload/post": (("upload",), "POST", r"/pipelines/upload$", "error", 500),
    "submit": (("submit", "--variant", "canary.policy.mig-1g-6gb"), "POST", r"/runs$", "error",
               500),
    "schedule create": (("schedule", "create", "--variant", "canary.policy.mig-1g-6gb"), "POST",
                        r"/recurringruns$", "error", 500),
    "schedule list": (("schedule", "list"), "GET", r"/recurringruns$", "field", 200),
}


def _filler(shape: str, before_secret: str) -> int:
    """Characters of echo before the headers so that the secret straddles the cut: the error
    line shows MAX_SERVER_TEXT characters of the message, and a non-KFP answer a snippet of
    SNIPPET_CHARS characters of the whole body (its JSON starts '{"created_at": "')."""
    if shape == "error":
        return MAX_SERVER_TEXT - 2 * WINDOW - len(before_secret)
    return SNIPPET_CHARS - 2 * WINDOW - len(before_secret) - len(json.dumps({"created_at": ""})) + 2


def _leaks(secret: str, text: str) -> list[str]:
    return [secret[i:i + WINDOW] for i in range(len(secret) - WINDOW + 1)
            if secret[i:i + WINDOW] in text]


@pytest.mark.parametrize("length", ["short", "long"])
@pytest.mark.parametrize("echo", list(ECHOES))
@pytest.mark.parametrize("source", ["KFP_TOKEN", "--token-env", "--token-file", "--sa-token",
                                    "--cookies-file"])
def test_an_echoed_credential_is_redacted_whole(cli, fake_kfp, all_logs, tmp_path, source,
                                                echo, length):
    args, env, secrets, before = _source(source, tmp_path)
    command, method, path, shape, status = ECHOES[echo]
    filler = 0 if length == "short" else _filler(shape, before)
    fake_kfp.echo(method, path, status=status, shape=shape, filler=filler)
    res = cli(*command, *args, "--verbose", env=env)
    assert res.exit_code == 10, res.output
    echoed = [r for r in fake_kfp.requests if r.method == method and r.path.endswith(
        path.strip("$").replace("\\", ""))]
    sent = " ".join(f"{k}: {v}" for r in echoed for k, v in r.headers.items())
    assert all(s in sent for s in secrets)  # the server really had them to echo
    assert "<redacted>" in res.output
    for secret in secrets:
        assert not _leaks(secret, res.output), res.output
        assert not _leaks(secret, all_logs.text)
        assert all(not _leaks(secret, r.getMessage()) for r in all_logs.records)


def test_a_long_echo_is_cut_after_the_redaction(cli, fake_kfp, tmp_path):
    """The cut falls where the token was: the line shows the header redacted whole, never
    the first characters of the token."""
    args, env, _, before = _source("--token-env", tmp_path)
    fake_kfp.echo("POST", r"/runs$", filler=_filler("error", before))
    res = cli("submit", "--variant", "canary.policy.mig-1g-6gb", *args, env=env)
    line = next(ln for ln in res.output.splitlines() if ln.startswith("error: "))
    assert line.endswith("…") and "authorization: <redacted>" in line
    assert TOKEN[:WINDOW] not in line


def test_a_secret_is_redacted_in_every_form_a_server_may_echo_it():
    from urllib.parse import quote

    from draslice.kfp_ops.errors import scrub

    secret = 'tok/"8Kq+2Lm=9Zx'
    echoed = (f"raw {secret} json {json.dumps(secret)[1:-1]} url {quote(secret, safe='')} "
              "proxy https://alice:PASSW0RD@kfp.example.com/pipeline")
    clean = scrub(echoed, [secret])
    assert clean == ("raw <redacted> json <redacted> url <redacted> proxy "
                     "https://<credentials>@kfp.example.com/pipeline")

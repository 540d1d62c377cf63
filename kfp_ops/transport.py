"""Each HTTP request draslice makes to a KFP server, with what ``kfp.Client``'s generated
client does not do.

- **One deadline a request, retries included.** The generated client retries through
  urllib3's default (three more tries, each with its own timeout), so a server that takes the
  connection and never answers held ``upload`` for four times the timeout its error then
  names. Here urllib3 does not retry; a connection that could not be made (nothing was sent)
  is tried again at most :data:`CONNECT_ATTEMPTS` times, every try within what is left of
  :data:`REQUEST_DEADLINE_S`, and a request that got no answer in time is not repeated.
  :class:`~draslice.kfp_ops.answers.NoAnswerInTime` says how long it waited: the deadline.
- **Progress.** A request still waiting after :data:`PROGRESS_AFTER_S` says so, and again
  every :data:`PROGRESS_EVERY_S`, through the session's ``progress`` callback.
- **The credentials it sends are secrets to scrub.** The Authorization and Cookie headers of
  every request (a token file is re-read for each one) join the session's secrets.
- **A 2xx body that is not text** (binary junk from something that is not the KFP API) raises
  :class:`~draslice.kfp_ops.answers.NotKfpAnswer` instead of the client's
  ``UnicodeDecodeError``; a non-2xx one is decoded with replacement characters (and a TLS
  failure, which has none, gets an empty one).
"""

from __future__ import annotations

import re
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from draslice.kfp_ops.answers import NoAnswerInTime, NotKfpAnswer

REQUEST_DEADLINE_S = 30.0
PROGRESS_AFTER_S = 5.0
PROGRESS_EVERY_S = 10.0
CONNECT_ATTEMPTS = 3
_CHARSET = re.compile(r"charset=([a-zA-Z\-\d]+)")


@dataclass
class Transport:
    """The request policy of one session: its host, deadline, progress callback, the action
    under way (named in progress lines) and the secrets its requests carried."""

    host: str
    secrets: set[str]
    progress: Callable[[str], None] | None = None
    deadline_s: float = REQUEST_DEADLINE_S
    action: str = "connecting"
    clock: Callable[[], float] = field(default=time.monotonic, repr=False)

    def install(self, api_client) -> None:
        """Route every request of ``api_client`` (a ``kfp_server_api.ApiClient``) through
        :meth:`send`."""
        api_client.rest_client.pool_manager.connection_pool_kw["retries"] = False
        request = api_client.request  # looked up on the instance by ApiClient.__call_api

        def send(method, url, query_params=None, headers=None, post_params=None, body=None,
                 _preload_content=True, _request_timeout=None):
            self.remember(headers or {})
            return self.send(lambda timeout: request(
                method, url, query_params=query_params, headers=headers,
                post_params=post_params, body=body, _preload_content=_preload_content,
                _request_timeout=timeout))

        api_client.request = send

    def remember(self, headers: dict) -> None:
        """Every credential in ``headers`` becomes a secret: the header's value, the token
        after its scheme, each cookie and each cookie's value."""
        for name, value in headers.items():
            if not isinstance(value, str):
                continue
            if name.lower() == "authorization":
                self.secrets.update({value, value.partition(" ")[2]})
            elif name.lower() == "cookie":
                self.secrets.add(value)
                for cookie in value.split(";"):
                    self.secrets.update({cookie.strip(), cookie.partition("=")[2].strip()})

    def send(self, call: Callable[[tuple[float, float]], object]):
        """``call(timeout)`` within one deadline, connection failures tried again."""
        import kfp_server_api
        import urllib3

        start = self.clock()
        deadline = start + self.deadline_s
        stop = threading.Event()
        if self.progress is not None:
            threading.Thread(target=self._tell, args=(start, stop), daemon=True).start()
        try:
            for attempt in range(1, CONNECT_ATTEMPTS + 1):
                left = deadline - self.clock()
                try:
                    response = call((max(left, 0.01), max(left, 0.01)))
                    break
                except urllib3.exceptions.ReadTimeoutError:
                    raise NoAnswerInTime(self.deadline_s, connected=True) from None
                except urllib3.exceptions.ConnectTimeoutError as err:
                    timed_out = not isinstance(err, urllib3.exceptions.NewConnectionError)
                    if timed_out or deadline - self.clock() <= 0.5:
                        if timed_out:
                            raise NoAnswerInTime(self.deadline_s, connected=False) from None
                        raise
                    if attempt == CONNECT_ATTEMPTS:
                        raise
                    time.sleep(0.1 * attempt)  # nothing was sent: trying again is safe
                except kfp_server_api.ApiException as err:
                    # the client decodes the body as strict UTF-8, and has none for TLS errors
                    body = err.body if isinstance(err.body, bytes) else b""
                    err.body = body.decode("utf-8", "replace").encode()
                    raise
        finally:
            stop.set()
        _check_text(response)
        return response

    def _tell(self, start: float, stop: threading.Event) -> None:
        wait = PROGRESS_AFTER_S
        while not stop.wait(wait):
            self.progress(f"waiting for {self.host} ({self.action}): "
                          f"{self.clock() - start:.0f} s of at most {self.deadline_s:.0f} s")
            wait = PROGRESS_EVERY_S


def _check_text(response) -> None:
    data = getattr(response, "data", None)
    if not isinstance(data, bytes):
        return
    ctype = response.getheader("content-type") or "no Content-Type"
    match = _CHARSET.search(ctype)
    try:
        data.decode(match.group(1) if match else "utf-8")
    except (UnicodeDecodeError, LookupError):
        raise NotKfpAnswer(response.status, ctype, len(data), None) from None

"""A client of the SC's public HTTP API, as `sc` and the demo use it: JSON requests, lists read page
by page, reads refused for load tried again after their Retry-After. Any failure is a ClientError
whose message is for a person (what went wrong, and what to do).
"""

from __future__ import annotations

import json
import ssl
import time
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path
from typing import Any

# The SC waits up to 30 s for a topic's verdict; leave it room to answer.
REQUEST_TIMEOUT = 60.0
# Lists are read in pages of this many objects, each page a short request for the SC.
PAGE_SIZE = 1000
# A read the SC refuses for load (429) is tried again after its Retry-After, this many times.
BUSY_RETRIES = 5
# The longest Retry-After honoured: a longer one is the SC's business, not a reason to hang.
MAX_RETRY_AFTER = 10.0
# A standby SC answers a write with 307 to the leader; followed this many times at most (a leader
# that changes while the request travels costs one more).
MAX_REDIRECTS = 3


class ClientError(Exception):
    """The SC refused a request or could not be reached; the message says why, for a person, and
    ``code`` for a program: the SC's error code, or Unreachable, Timeout, BadAnswer or BadCaFile."""

    def __init__(self, message: str, code: str) -> None:
        super().__init__(message)
        self.code = code


class Client:
    """``token``: sent as a bearer token; ``ca``: the CA trusted for an https:// address (None: the
    system's)."""

    def __init__(self, address: str, token: str | None = None, ca: Path | None = None) -> None:
        address = address.strip().rstrip("/")
        if "://" not in address:
            address = f"http://{address}"
        self.address = address
        self._headers = {"Content-Type": "application/json"}
        if token:
            self._headers["Authorization"] = f"Bearer {token}"
        self._tls: ssl.SSLContext | None = None
        if ca is not None:
            try:
                self._tls = ssl.create_default_context(cafile=str(ca))
            except (OSError, ssl.SSLError) as error:
                raise ClientError(f"cannot use CA file {str(ca)!r} ({error}): give the PEM CA that signed the SC's certificate", "BadCaFile") from None
            self._tls.minimum_version = ssl.TLSVersion.TLSv1_2
        self._opener = urllib.request.build_opener(urllib.request.HTTPSHandler(context=self._tls), _NoRedirects())

    def call(self, method: str, path: str, body: Any = None, query: dict[str, str] | None = None) -> tuple[int, Any]:
        """(status, decoded JSON answer) for any status below 400; raises ClientError for the others."""
        status, _, answer = self.exchange(method, path, body, query)
        return status, answer

    def list_all(self, path: str, query: dict[str, str] | None = None) -> list[Any]:
        """Every object of a list, read page by page (?limit=, following X-Continue)."""
        objects: list[Any] = []
        token = None
        while True:
            page_query = {**(query or {}), "limit": str(PAGE_SIZE), **({"continue": token} if token else {})}
            _, headers, page = self.exchange("GET", path, query=page_query)
            if not isinstance(page, list):
                raise ClientError(f"the SC answered a list with {str(page)[:200]}", "BadAnswer")
            objects.extend(page)
            token = headers.get("X-Continue")
            if not token:
                return objects

    def exchange(
        self, method: str, path: str, body: Any = None, query: dict[str, str] | None = None
    ) -> tuple[int, dict[str, str], Any]:
        """(status, headers, decoded answer) for any status below 400; reads refused for load are retried."""
        url = self.address + path + ("?" + urllib.parse.urlencode(query) if query else "")
        data = None if body is None else json.dumps(body).encode()
        redirects: list[str] = []
        attempt = 0
        while attempt <= BUSY_RETRIES:
            request = urllib.request.Request(url, data=data, method=method, headers=self._headers)
            try:
                with self._opener.open(request, timeout=REQUEST_TIMEOUT) as response:
                    return response.status, dict(response.headers), _decode(response.read())
            except urllib.error.HTTPError as failure:
                answer = _decode(failure.read())
                retry_after = failure.headers.get("Retry-After", "")
                location = failure.headers.get("Location", "")
                failure.close()
                if failure.code in (307, 308):
                    # A standby SC: the same request, method, body and credentials, to the leader.
                    url = self._redirected(url, location, redirects)
                    continue
                if failure.code == 429 and method == "GET" and attempt < BUSY_RETRIES and retry_after.isdigit():
                    time.sleep(min(float(retry_after), MAX_RETRY_AFTER))
                    attempt += 1
                    continue
                raise ClientError(_error_message(failure.code, answer), _error_code(failure.code, answer)) from None
            except urllib.error.URLError as failure:
                if isinstance(failure.reason, ConnectionRefusedError):
                    raise ClientError(
                        f"cannot reach the SC at {self.address}: connection refused. Is it running? "
                        "Start it with `sc run`, or point to it with --sc URL or SC_ADDR",
                        "Unreachable",
                    ) from None
                raise ClientError(f"cannot reach the SC at {self.address}: {failure.reason}", "Unreachable") from None
            except TimeoutError:
                raise ClientError(f"the SC at {self.address} did not answer within {REQUEST_TIMEOUT:g} s", "Timeout") from None
            except (ConnectionError, ValueError) as failure:
                raise ClientError(f"cannot talk to the SC at {self.address}: {failure}", "Unreachable") from None
        raise AssertionError("unreachable: the last attempt returns or raises")

    def _redirected(self, url: str, location: str, redirects: list[str]) -> str:
        """Where a 307 from ``url`` sends the request; ClientError past MAX_REDIRECTS hops, for a
        Location that is not an http(s) address, or from https to plain http."""
        target = urllib.parse.urljoin(url, location)
        if urllib.parse.urlsplit(target).scheme not in ("http", "https") or not location:
            raise ClientError(f"the SC at {url} redirected to {location[:200]!r}, which is not an http(s) address", "BadAnswer")
        if urllib.parse.urlsplit(url).scheme == "https" and urllib.parse.urlsplit(target).scheme != "https":
            # The credential goes along: not in clear.
            raise ClientError(
                f"the SC at {url} redirected to {target[:200]!r}, plain http: the request and its credential are "
                "not sent there; call the leader with https yourself", "BadAnswer",
            )  # fmt: skip
        redirects.append(target)
        if len(redirects) > MAX_REDIRECTS:
            raise ClientError(
                f"the SC redirected more than {MAX_REDIRECTS} times ({' -> '.join(redirects)}): the SCs do not agree "
                "on their leader yet; retry in a few seconds", "TooManyRedirects",
            )  # fmt: skip
        return target


class _NoRedirects(urllib.request.HTTPRedirectHandler):
    """urllib follows a 307 for GET itself, and drops the Authorization header across hosts: the
    client follows every redirect itself instead (Client._redirected), credentials kept."""

    def redirect_request(self, *args: Any, **kwargs: Any) -> None:
        return None


def _decode(raw: bytes) -> Any:
    try:
        return json.loads(raw)
    except ValueError:
        return raw.decode(errors="replace")


def _error_code(status: int, answer: Any) -> str:
    if isinstance(answer, dict) and isinstance(answer.get("error"), dict) and isinstance(answer["error"].get("code"), str):
        return str(answer["error"]["code"])
    return f"HTTP{status}"


def _error_message(status: int, answer: Any) -> str:
    if isinstance(answer, dict) and isinstance(answer.get("error"), dict):
        return str(answer["error"].get("message", answer["error"]))
    return f"the SC answered HTTP {status}: {str(answer)[:200]}"

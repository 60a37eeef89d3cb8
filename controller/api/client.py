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
        for attempt in range(BUSY_RETRIES + 1):
            request = urllib.request.Request(url, data=data, method=method, headers=self._headers)
            try:
                with urllib.request.urlopen(request, timeout=REQUEST_TIMEOUT, context=self._tls) as response:
                    return response.status, dict(response.headers), _decode(response.read())
            except urllib.error.HTTPError as failure:
                answer = _decode(failure.read())
                retry_after = failure.headers.get("Retry-After", "")
                failure.close()
                if failure.code == 429 and method == "GET" and attempt < BUSY_RETRIES and retry_after.isdigit():
                    time.sleep(min(float(retry_after), MAX_RETRY_AFTER))
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

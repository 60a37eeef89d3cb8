"""`POST /v1/placement` computed in a child process of the SC, one request at a time.

A placement request body may be 16 MiB, and any holder of the read role may send one. Python's JSON
parser holds the interpreter's lock until the whole body is parsed, and a body of millions of empty
arrays took it 3 s alone, 25 s for eight at once, with each parsed copy over 300 MB: in the SC's
own process (even in a worker thread) the event loop stood still, SPUs were dropped for silence
and /healthz went unanswered. In a process of its own, the parse, the placement and the encoding
take that process's lock and memory, never the SC's.

The child (``python -m controller.api.placement_worker CONFIG``) is started at the first request and
kept; it loads the operator's placement plug-ins itself (the same settings as the SC). It reads
requests on its stdin and answers on its stdout, in frames:

- request: ``>II`` (length of the SPUs, length of the body), the SPUs the SC sees online as JSON
  (``[[id, rack, online], ...]``, or ``null`` while the SC has not loaded its store), the body;
- answer: ``>HI`` (HTTP status, length), then the answer's bytes (200) or ``{"code", "message"}``.

It ends when its stdin closes (the SC stopped, or died). Under memory pressure the kernel's OOM
killer takes it before the SC (its ``oom_score_adj`` is 1000). A child that dies mid-request (killed, out
of memory) makes that request a 503 and the next one starts another; a request cancelled mid-way
kills it (its frames would be out of step).
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import json
import os
import struct
import sys
from collections.abc import Mapping, Sequence
from typing import BinaryIO

import structlog

from controller import placement
from controller.api import placement_answer

log = structlog.get_logger(__name__)

_REQUEST = struct.Struct(">II")
# How long a child whose pipes closed is given to exit before it is killed.
_EXIT_WAIT_SECONDS = 5.0
_ANSWER = struct.Struct(">HI")


class PlacementWorker:
    """The SC's side: sends each request to the child, one at a time, and returns its answer."""

    def __init__(self, plugins: Mapping[str, str], entry_points: bool) -> None:
        self._config = json.dumps({"plugins": dict(plugins), "entryPoints": entry_points})
        self._process: asyncio.subprocess.Process | None = None
        self._lock = asyncio.Lock()
        self.started = 0  # children started, for the tests and the log

    @property
    def pid(self) -> int | None:
        return None if self._process is None or self._process.returncode is not None else self._process.pid

    async def answer(self, raw: bytes, live_spus: Sequence[placement.SpuInfo] | None) -> bytes:
        """The answer's bytes; placement_answer.Refused for an answer in the error shape."""
        spus = b"null" if live_spus is None else json.dumps([[spu.id, spu.rack, spu.online] for spu in live_spus]).encode()
        async with self._lock:
            process = await self._running()
            assert process.stdin is not None and process.stdout is not None
            try:
                process.stdin.write(_REQUEST.pack(len(spus), len(raw)))
                process.stdin.write(spus)
                process.stdin.write(raw)
                await process.stdin.drain()
                status, length = _ANSWER.unpack(await process.stdout.readexactly(_ANSWER.size))
                payload = await process.stdout.readexactly(length)
            except (ConnectionError, asyncio.IncompleteReadError):
                code = await self._ended()
                how = "exit status unknown" if code is None else f"killed by signal {-code}" if code < 0 else f"exit status {code}"
                raise placement_answer.Refused(
                    503,
                    "PlacementWorkerGone",
                    f"the process that computes placements ended ({how}) before it answered: "
                    "it may have run out of memory; retry (another is started)",
                ) from None
            except BaseException:
                # Cancelled mid-exchange: the frames are out of step, and the child may compute on.
                await self._stop()
                raise
        if status == 200:
            return payload
        error = json.loads(payload)
        raise placement_answer.Refused(status, str(error["code"]), str(error["message"]))

    async def close(self) -> None:
        """Stop the child, at once: a request it is computing gets its 503 (the SC is stopping)."""
        await self._stop()

    async def _running(self) -> asyncio.subprocess.Process:
        if self._process is None or self._process.returncode is not None:
            try:
                self._process = await asyncio.create_subprocess_exec(
                    sys.executable, "-m", __name__, self._config, stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE
                )
            except OSError as error:  # out of processes or descriptors, an interpreter gone
                log.warning("placement worker could not be started", error=str(error))
                raise placement_answer.Refused(
                    503, "PlacementWorkerGone", f"the process that computes placements could not be started ({error}); retry shortly"
                ) from None
            self.started += 1
            log.info("placement worker started", pid=self._process.pid)
        return self._process

    async def _ended(self) -> int | None:
        """The exit status of a child whose pipes closed (negative: the signal that killed it)."""
        process, self._process = self._process, None
        if process is None:
            return None
        # Its pipes closed: it is ending. Killed only if it lingers: a kill of a child that has died
        # reaps it (Popen.send_signal polls first), and its status is then lost to asyncio.
        try:
            async with asyncio.timeout(_EXIT_WAIT_SECONDS):
                code = await process.wait()
        except TimeoutError:
            process.kill()
            code = await process.wait()
        log.warning("placement worker ended mid-request", pid=process.pid, exit_status=code)
        return code

    async def _stop(self) -> None:
        process, self._process = self._process, None
        if process is not None and process.returncode is None:
            process.kill()
            await process.wait()


# ---------------------------------------------------------------------------- the child


def serve(config: str, requests: BinaryIO, answers: BinaryIO) -> None:
    """Answer requests until ``requests`` ends."""
    from controller import placement_plugins  # the child's own copy of the operator's plug-ins

    settings = json.loads(config)
    placers = placement_plugins.load(settings["plugins"], settings["entryPoints"])
    # No cyclic collection while a request is parsed and placed: a body of millions of empty arrays
    # took Python's parser 3-20 s with it (each array a container the collector walks again and
    # again), 0.5-1.5 s without. What cycles a request leaves are collected after its answer.
    gc.disable()
    while True:
        header = requests.read(_REQUEST.size)
        if len(header) < _REQUEST.size:
            return  # the SC closed the pipe
        spus_length, body_length = _REQUEST.unpack(header)
        spus = json.loads(_read_exactly(requests, spus_length))
        raw = _read_exactly(requests, body_length)
        live = None if spus is None else [placement.SpuInfo(spu_id, rack, online) for spu_id, rack, online in spus]
        try:
            status, payload = 200, placement_answer.for_body(raw, live, placers)
        except placement_answer.Refused as refused:
            status, payload = refused.status, json.dumps({"code": refused.code, "message": refused.message}).encode()
        except Exception as error:  # a bug, or a plug-in's: the SC answers 500, the child goes on
            # Cut: an exception may quote its input, which is up to 16 MiB of the client's.
            print(f"placement worker: unexpected error: {repr(error)[:500]}", file=sys.stderr, flush=True)
            status, payload = 500, json.dumps({"code": "InternalError", "message": "the placement could not be computed"}).encode()
        del raw, live
        answers.write(_ANSWER.pack(status, len(payload)))
        answers.write(payload)
        answers.flush()
        del payload
        gc.collect()


def _read_exactly(stream: BinaryIO, length: int) -> bytes:
    data = stream.read(length)
    if len(data) != length:
        raise SystemExit(0)  # the SC closed the pipe mid-request
    return data


def main() -> None:
    # Under memory pressure (a pod's limit, a host's), the kernel's OOM killer picks this process
    # before the SC: its request fails with a 503, and the SC goes on. Linux only.
    with contextlib.suppress(OSError):
        with open("/proc/self/oom_score_adj", "w") as adjust:
            adjust.write("1000")
    # The frames own stdout: what a plug-in prints goes to stderr (the SC's log) instead.
    answers = os.fdopen(os.dup(1), "wb")
    os.dup2(2, 1)
    serve(sys.argv[1], sys.stdin.buffer, answers)


if __name__ == "__main__":
    main()

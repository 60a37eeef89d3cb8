"""The metadata history: an append-only log of every change the Reader sees and every action taken.

Segments rotated by size, each record framed (length + CRC32) with a sequence number, so a torn
tail is found and cut on open, never fatal. Recording never blocks the caller: a bounded queue
feeds a writer task, and what does not fit is counted and reported as a gap record.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import fcntl
import json
import logging
import os
import struct
import time
import uuid
import zlib
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from store import supervisor as supervisor_module

_log = logging.getLogger(__name__)

SEGMENT_SUFFIX = ".seg"
LOCK_FILE = "history.lock"
ID_FILE = "history.id"
DEFAULT_SEGMENT_BYTES = 64 * 1024 * 1024
DEFAULT_MAX_QUEUE = 100_000
# Records handed to the writer thread at once: large enough to amortise the hop, small enough
# that one batch never holds the queue's whole content for long.
WRITE_BATCH = 4096
# How long the writer lets records gather before writing them (the lag it adds, at most).
BATCH_DELAY = 0.01
# A record larger than this is not a record: the length field is garbage (a torn or corrupt frame).
MAX_RECORD_BYTES = 64 * 1024 * 1024

_FRAME = struct.Struct("<II")  # payload length, CRC32 of the payload

# Record types.
CHANGE, ACTION, GAP, SYNC = "change", "action", "gap", "sync"
# Who asked for a user's write (store/attribution.py): the principal and its address, by revision.
REQUEST = "request"
# This SC began a term as its store's leader (with what became of the claim before), or ended one.
TAKEOVER, STEP_DOWN = "takeover", "step-down"
# Where a change record comes from: the live watch, the catch-up after a restart, or a listing
# (a baseline when the history starts, or a snapshot after a gap).
WATCH, REPLAY, LIST = "watch", "replay", "list"
# Operations of a change record.
CREATE, UPDATE, DELETE = "create", "update", "delete"
# The gap of a history whose store's revision went below it (etcd restored from a backup, or
# another cluster): the records after it have another store's revisions.
STORE_BEHIND_HISTORY = "store-behind-history"


class HistoryError(Exception):
    """The history directory cannot be used; the message says why and what to do."""


class HistoryLocked(HistoryError):
    def __init__(self, directory: Path) -> None:
        super().__init__(
            f"the history directory {str(directory)!r} is already used by another running SC "
            f"(lock file {str(directory / LOCK_FILE)!r}): only the active SC records; stop the other "
            "one or give this one another --history-dir"
        )


# ---------------------------------------------------------------------------- on-disk log


def segment_name(first_seq: int) -> str:
    return f"{first_seq:020d}{SEGMENT_SUFFIX}"


def segment_paths(directory: Path) -> list[Path]:
    """The segment files of a history directory, oldest first."""
    paths = [path for path in directory.glob(f"*{SEGMENT_SUFFIX}") if path.stem.isdigit()]
    return sorted(paths, key=lambda path: int(path.stem))


def frame(payload: bytes) -> bytes:
    return _FRAME.pack(len(payload), zlib.crc32(payload)) + payload


@dataclass(frozen=True, slots=True)
class SegmentScan:
    """What reading one segment found: its records' payloads and where the good data ends."""

    payloads: list[bytes]
    good_bytes: int  # offset just after the last valid record
    size: int  # the file's size when read

    @property
    def torn_bytes(self) -> int:
        return self.size - self.good_bytes


def scan_segment(path: Path) -> SegmentScan:
    """Every valid record of ``path`` up to the first torn or corrupt frame (which ends the scan)."""
    data = path.read_bytes()
    payloads: list[bytes] = []
    offset, size = 0, len(data)
    while offset + _FRAME.size <= size:
        length, crc = _FRAME.unpack_from(data, offset)
        start = offset + _FRAME.size
        end = start + length
        if length == 0 or length > MAX_RECORD_BYTES or end > size:
            break
        payload = data[start:end]
        if zlib.crc32(payload) != crc:
            break
        payloads.append(payload)
        offset = end
    return SegmentScan(payloads, offset, size)


@dataclass(frozen=True, slots=True)
class ReadProblem:
    """A segment whose valid records ended before the file did (corruption, or a write in progress)."""

    segment: str
    offset: int
    skipped_bytes: int


@dataclass(slots=True)
class HistoryReader:
    """Reads a history directory (while an SC may be appending to it), from a sequence number on.

    Never modifies anything. A bad frame ends its segment: in the last segment that is a write in
    progress or a torn tail; in an earlier one it is corruption, noted in ``problems``.
    """

    directory: Path
    problems: list[ReadProblem] = field(default_factory=list)

    def payloads(self, after_seq: int = 0) -> Iterator[bytes]:
        """The raw JSON payload of every record with a sequence number above ``after_seq``, in order."""
        for _, payload in self.numbered_payloads(after_seq):
            yield payload

    def numbered_payloads(self, after_seq: int = 0) -> Iterator[tuple[int, bytes]]:
        """``payloads``, each with its sequence number as its place in the log says (not as its
        content claims: a record that cannot be parsed still has one)."""
        paths = segment_paths(self.directory)
        # Skip whole segments that end before after_seq: a segment's name is its first seq.
        first = 0
        for index, path in enumerate(paths):
            if int(path.stem) <= after_seq + 1:
                first = index
        for index, path in enumerate(paths[first:], start=first):
            scan = scan_segment(path)
            if scan.torn_bytes and index < len(paths) - 1:
                self.problems.append(ReadProblem(path.name, scan.good_bytes, scan.torn_bytes))
                _log.warning(
                    "history segment %s is corrupt at byte %d: %d bytes skipped",
                    path.name, scan.good_bytes, scan.torn_bytes,
                )
            seq = int(path.stem)
            for payload in scan.payloads:
                if seq > after_seq:
                    yield seq, payload
                seq += 1

    def records(self, after_seq: int = 0) -> Iterator[dict[str, Any]]:
        for payload in self.payloads(after_seq):
            yield json.loads(payload)


def read_history_id(directory: Path) -> str:
    """The identity of a history directory (written when it was first opened)."""
    path = directory / ID_FILE
    try:
        return path.read_text().strip()
    except FileNotFoundError:
        raise HistoryError(
            f"{str(directory)!r} is not a history directory: it has no {ID_FILE} "
            "(give the SC's --history-dir, by default <data-dir>/history)"
        ) from None


class SegmentLog:
    """The writing side of the log: one open segment, rotated by size. Blocking I/O: use it from a
    worker thread. Not thread-safe: one writer at a time."""

    def __init__(self, directory: Path, segment_bytes: int = DEFAULT_SEGMENT_BYTES, fsync_interval: float = 1.0) -> None:
        if segment_bytes < 1024:
            raise ValueError(f"segment size {segment_bytes} bytes is too small: use at least 1024")
        self.directory = directory
        self.segment_bytes = segment_bytes
        self.fsync_interval = fsync_interval
        self.next_seq = 1
        # The highest revision the history holds in full (see Recorder.resume_revision).
        self.resume_revision: int | None = None
        self.truncated_bytes = 0
        self._file: Any = None
        self._size = 0
        self._last_fsync = 0.0

    def open(self) -> None:
        """Find where the log ends, cut a torn tail, and read the resume revision."""
        paths = segment_paths(self.directory)
        if not paths:
            return
        last = paths[-1]
        scan = scan_segment(last)
        if scan.torn_bytes:
            self.truncated_bytes = scan.torn_bytes
            _log.warning(
                "history segment %s ends with a torn record: cutting %d bytes at offset %d",
                last.name, scan.torn_bytes, scan.good_bytes,
            )
            with open(last, "r+b") as torn:
                torn.truncate(scan.good_bytes)
                os.fsync(torn.fileno())
        self.next_seq = int(last.stem) + len(scan.payloads)
        self._file = open(last, "ab")
        self._size = scan.good_bytes
        # The resume revision: the last position recorded, in the newest segment holding one.
        for path in reversed(paths):
            payloads = scan.payloads if path == last else scan_segment(path).payloads
            revisions = [revision for revision in map(_resume_point, payloads) if revision]
            if revisions:
                self.resume_revision = revisions[-1]
                break

    def append(self, payloads: Sequence[bytes]) -> None:
        """Write framed records (already numbered from ``next_seq``), rotating first when full."""
        try:
            for payload in payloads:
                if self._file is None or self._size >= self.segment_bytes:
                    self._rotate()
                record = frame(payload)
                self._file.write(record)
                self._size += len(record)
                self.next_seq += 1
            if self._file is not None:
                self._file.flush()
                now = time.monotonic()
                if now - self._last_fsync >= self.fsync_interval:
                    os.fsync(self._file.fileno())
                    self._last_fsync = now
        except Exception:
            # The segment may now end in a partial record: the next batch starts a new segment,
            # and readers stop this one where its good records end.
            if self._file is not None:
                with contextlib.suppress(OSError):
                    self._file.close()
                self._file = None
            raise

    def close(self) -> None:
        if self._file is not None:
            self._file.flush()
            os.fsync(self._file.fileno())
            self._file.close()
            self._file = None

    def _rotate(self) -> None:
        self.close()
        self._file = open(self.directory / segment_name(self.next_seq), "ab")
        self._size = 0
        _fsync_directory(self.directory)


def _resume_point(payload: bytes) -> int | None:
    """The revision through which a record shows the history complete (None if it shows none)."""
    record = json.loads(payload)
    kind = record["type"]
    if kind == CHANGE and record["source"] != LIST:
        return int(record["revision"])
    if kind == SYNC:
        return int(record["revision"])
    if kind == GAP:
        return int(record["lastRevision"])
    return None


def _fsync_directory(directory: Path) -> None:
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


# ---------------------------------------------------------------------------- the recorder


@dataclass(slots=True)
class RecorderStats:
    """Counters for the metrics (read at scrape time)."""

    recorded: collections.Counter[str] = field(default_factory=collections.Counter)  # by record type, written
    dropped: int = 0
    truncated_bytes: int = 0  # torn tail cut when the history was opened


@dataclass(slots=True)
class _Pending:
    """A record waiting for the writer: its fields, the raw object JSON (if any), its enqueue time."""

    fields: dict[str, Any]
    raw_object: bytes | None
    enqueued: float


class Recorder:
    """Records into a history directory. Create it with :meth:`open`, then :meth:`start` it.

    ``record_*`` never block and never raise for a full queue: the record is dropped, counted, and
    a gap record saying which revisions may be missing follows once there is room again. Sequence
    numbers are given when a record is written, so dropped records leave no hole in them.
    """

    def __init__(
        self,
        directory: Path,
        log: SegmentLog,
        lock_fd: int,
        history_id: str,
        max_queue: int = DEFAULT_MAX_QUEUE,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.directory = directory
        self.history_id = history_id
        self.max_queue = max_queue
        self.clock = clock
        self.stats = RecorderStats(truncated_bytes=log.truncated_bytes)
        self._log = log
        self._lock_fd: int | None = lock_fd
        self._queue: collections.deque[_Pending] = collections.deque()
        self._resume_revision = log.resume_revision
        # Dropped since the last gap record: how many, and the revisions they named.
        self._dropped_since_gap = 0
        self._dropped_first = self._dropped_last = 0
        self._wake = asyncio.Event()
        self._writer: asyncio.Task[None] | None = None
        self._closing = False
        self._closed = False
        self._writing = 0  # records handed to the worker thread and not yet written

    @classmethod
    def open(
        cls,
        directory: Path,
        segment_bytes: int = DEFAULT_SEGMENT_BYTES,
        max_queue: int = DEFAULT_MAX_QUEUE,
        fsync_interval: float = 1.0,
        clock: Callable[[], float] = time.time,
    ) -> Recorder:
        """Lock ``directory`` (one recorder per history), cut a torn tail, find where to resume.

        Blocking (it reads the last segment): call it through ``asyncio.to_thread`` on a loop.
        """
        if max_queue < 1:
            raise ValueError(f"the history queue must hold at least 1 record, got {max_queue}")
        try:
            directory.mkdir(parents=True, exist_ok=True)
        except OSError as error:
            raise HistoryError(f"cannot create the history directory {str(directory)!r}: {error.strerror}") from None
        lock_fd = os.open(directory / LOCK_FILE, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            try:
                fcntl.flock(lock_fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                raise HistoryLocked(directory) from None
            id_path = directory / ID_FILE
            if not id_path.exists():
                id_path.write_text(uuid.uuid4().hex + "\n")
            log = SegmentLog(directory, segment_bytes, fsync_interval)
            log.open()
            return cls(directory, log, lock_fd, read_history_id(directory), max_queue, clock)
        except BaseException:
            os.close(lock_fd)
            raise

    # ------------------------------------------------------------------ state

    @property
    def resume_revision(self) -> int | None:
        """The revision through which the history is complete (queued records included), or None
        for a history that has never been synced: the Reader replays from the next one."""
        return self._resume_revision

    @property
    def next_seq(self) -> int:
        """The sequence number the next written record gets."""
        return self._log.next_seq

    @property
    def queue_depth(self) -> int:
        """Records waiting to be written (those being written included)."""
        return len(self._queue) + self._writing

    def lag(self) -> float:
        """Seconds the oldest queued record has been waiting (0 when nothing waits)."""
        return max(0.0, self.clock() - self._queue[0].enqueued) if self._queue else 0.0

    # ------------------------------------------------------------------ recording (never blocks)

    def record_change(
        self,
        kind: str,
        name: str,
        op: str,
        revision: int,
        value: bytes | None,
        source: str = WATCH,
        snapshot: int | None = None,
    ) -> None:
        """A change of one object: ``value`` is its JSON after the change (None for a delete).

        List records carry ``snapshot``, the revision of the listing they belong to.
        """
        fields: dict[str, Any] = {"type": CHANGE, "kind": kind, "name": name, "op": op, "revision": revision, "source": source}
        if snapshot is not None:
            fields["snapshotRevision"] = snapshot
        if self._push(fields, value, revision) and source != LIST:
            self._advance(revision)

    def record_action(
        self,
        kind: str,
        name: str,
        verb: str,
        reason: str,
        cause: str,
        cause_revision: int,
        outcome: str,
        revision: int,
        keys: Sequence[str],
        detail: str = "",
    ) -> None:
        """A controller's action once the dispatcher has its outcome (``revision``: the commit's)."""
        fields = {
            "type": ACTION, "kind": kind, "name": name, "verb": verb, "reason": reason, "cause": cause,
            "causeRevision": cause_revision, "outcome": outcome, "revision": revision, "keys": list(keys),
            "detail": detail,
        }
        self._push(fields, None, None)

    def record_request(self, kind: str, name: str, revision: int, by: str, address: str | None) -> None:
        """A write of the public port committed at ``revision`` for principal ``by`` from ``address``."""
        fields = {"type": REQUEST, "kind": kind, "name": name, "revision": revision, "by": by, "address": address}
        self._push(fields, None, None)

    def record_takeover(
        self, sc_id: str, address: str, epoch: int, cause: str, previous: str | None, previous_epoch: int
    ) -> None:
        """This SC (``sc_id`` at ``address``) leads its store from ``epoch`` (its claim's create
        revision), because the claim before it ended as ``cause`` says (``previous``: its holder's id)."""
        fields = {
            "type": TAKEOVER, "name": sc_id, "address": address, "revision": epoch, "cause": cause,
            "detail": previous or "", "causeRevision": previous_epoch,
        }
        self._push(fields, None, None)

    def record_step_down(self, sc_id: str, epoch: int, cause: str) -> None:
        """This SC's term that began at ``epoch`` ended (``cause``: lease-lost, fenced, claim-deleted, ...)."""
        self._push({"type": STEP_DOWN, "name": sc_id, "revision": epoch, "cause": cause}, None, None)

    def record_gap(self, first_revision: int, last_revision: int, reason: str, dropped: int = 0) -> None:
        """Revisions ``first_revision..last_revision`` may be missing from the history (or, for
        ``store-behind-history``, were recorded from a store that has since gone back)."""
        fields = {
            "type": GAP, "firstRevision": first_revision, "lastRevision": last_revision, "reason": reason,
            "dropped": dropped,
        }
        if self._push(fields, None, last_revision):
            self._advance(last_revision)

    def record_sync(self, revision: int, snapshot: bool = False) -> None:
        """The history is complete through ``revision``. ``snapshot``: the list records of the
        listing at ``revision`` precede it, and objects absent from them no longer exist."""
        if self._push({"type": SYNC, "revision": revision, "snapshot": snapshot}, None, revision):
            self._advance(revision)

    def _advance(self, revision: int) -> None:
        # The last position, not the highest: after a store-behind-history gap it goes back.
        if revision > 0:
            self._resume_revision = revision

    def _push(self, fields: dict[str, Any], raw_object: bytes | None, revision: int | None) -> bool:
        if self._closed or len(self._queue) >= self.max_queue:
            if self._dropped_since_gap == 0:
                _log.warning(
                    "history queue full (%d records) or recorder closed: dropping records; "
                    "a gap record will say which revisions",
                    self.max_queue,
                )
            self._dropped_since_gap += 1
            self.stats.dropped += 1
            if revision:
                self._dropped_first = min(self._dropped_first or revision, revision)
                self._dropped_last = max(self._dropped_last, revision)
            return False
        if self._dropped_since_gap and len(self._queue) <= self.max_queue // 2:
            self._queue_drop_gap()
        now = self.clock()
        fields["time"] = int(now * 1_000_000)
        self._queue.append(_Pending(fields, raw_object, now))
        self._wake.set()
        return True

    def _queue_drop_gap(self) -> None:
        now = self.clock()
        gap = {
            "type": GAP, "firstRevision": self._dropped_first, "lastRevision": self._dropped_last,
            "reason": "queue-full", "dropped": self._dropped_since_gap, "time": int(now * 1_000_000),
        }
        _log.warning("history queue has room again: %d records were dropped", self._dropped_since_gap)
        self._queue.append(_Pending(gap, None, now))
        self._dropped_since_gap = 0
        self._dropped_first = self._dropped_last = 0

    # ------------------------------------------------------------------ the writer

    async def start(self, supervisor: supervisor_module.Supervisor | None = None) -> None:
        """Start the writer task, under ``supervisor`` (the daemon's) or one of its own: a writer
        that crashes is started again, the batch it held counted as dropped."""
        if self._writer is None:
            supervisor = supervisor if supervisor is not None else supervisor_module.Supervisor()
            self._writer = supervisor.spawn("history-writer", self._run)

    async def _run(self) -> None:
        while True:
            await self._wake.wait()
            if len(self._queue) < WRITE_BATCH and not self._closing:
                # Gather a batch: one hop to the worker thread per record would cost the loop more
                # than the records themselves.
                await asyncio.sleep(BATCH_DELAY)
            self._wake.clear()
            await self._write_queued()
            if self._closing:
                return

    async def _write_queued(self) -> None:
        while self._queue or self._dropped_since_gap:
            if not self._queue:
                self._queue_drop_gap()
            batch = [self._queue.popleft() for _ in range(min(WRITE_BATCH, len(self._queue)))]
            first_seq = self._log.next_seq
            self._writing = len(batch)
            try:
                await asyncio.to_thread(self._write, batch, first_seq)
            except OSError as error:
                # A full disk must not stop the controllers: count the batch as dropped, go on.
                self.stats.dropped += len(batch)
                _log.error("cannot write %d history records: %s", len(batch), error)
                continue
            except Exception:
                self.stats.dropped += len(batch)  # a bug: the supervisor logs it and starts over
                raise
            finally:
                self._writing = 0
            for pending in batch:
                self.stats.recorded[pending.fields["type"]] += 1

    def _write(self, batch: list[_Pending], first_seq: int) -> None:
        payloads = [
            encode({"seq": seq, **pending.fields}, pending.raw_object)
            for seq, pending in enumerate(batch, start=first_seq)
        ]
        self._log.append(payloads)

    async def flush(self) -> None:
        """Return once everything queued so far is written (and handed to the OS)."""
        if self._writer is None or self._writer.done():
            return
        while self._queue or self._dropped_since_gap or self._writing:
            await asyncio.sleep(0.005)

    async def close(self) -> None:
        """Write what is queued, fsync, release the directory. Idempotent."""
        if self._lock_fd is None:
            return
        self._closing = True
        if self._writer is not None:
            # Never cancelled: a batch handed to the worker thread must finish before the next.
            self._wake.set()
            await self._writer
            self._writer = None
        await self._write_queued()
        self._closed = True
        await asyncio.to_thread(self._log.close)
        os.close(self._lock_fd)
        self._lock_fd = None


def encode(fields: dict[str, Any], raw_object: bytes | None) -> bytes:
    """One record's JSON payload; the object's stored JSON is embedded as is (it already is JSON).

    Change records (most of the history) are formatted directly: json.dumps of the whole dict
    cost the writer thread, and so the event loop waiting for the GIL, twice as much.
    """
    if fields["type"] != CHANGE:
        return json.dumps(fields, separators=(",", ":"), ensure_ascii=False).encode()
    snapshot = fields.get("snapshotRevision")
    head = (
        f'{{"seq":{fields["seq"]:d},"type":"change","kind":{_dumps(fields["kind"])},"name":{_dumps(fields["name"])},'
        f'"op":{_dumps(fields["op"])},"revision":{fields["revision"]:d},"source":{_dumps(fields["source"])},'
        f'"time":{fields["time"]:d},' + ("" if snapshot is None else f'"snapshotRevision":{snapshot:d},') + '"object":'
    )
    return head.encode() + (raw_object if raw_object is not None else b"null") + b"}"


_dumps = json.JSONEncoder(ensure_ascii=False).encode

"""The Spark audit jobs over the exported history; the only module of the project that imports pyspark.

Leader changes with their cause, unavailability windows, provisioning latency, SPU intervals and
flapping, placement balance at a chosen time, spec changes, partition uids written over. Run by
`sc audit report`, or on a real cluster: `spark-submit controller/audit/jobs.py --history DIR --out
DIR` (the package on the driver).
"""

from __future__ import annotations

import argparse
import concurrent.futures
import datetime
import os
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from pyspark.sql import Column, DataFrame, SparkSession, Window
from pyspark.sql import functions as F
from pyspark.sql.pandas.types import from_arrow_schema

from controller.audit import export, options as options_module, report
from store.history import STORE_BEHIND_HISTORY

# The causes of the leader changes the SC decided (controller/reconcile/partition_state.py names them, written as Action.cause).
CAUSES = ("spu-offline", "preferred-leader", "drain", "unclean", "reassignment")
# The causes of a replica move's writes that start it (the rebalance controller's), add its new
# replicas, commit the last of them into the in-sync set, and end it
# (controller/reconcile/moves.py, controller/reconcile/partition_state.py).
MOVE_STARTED, MOVE_ADDING, MOVE_CAUGHT_UP = "move-started", "move-adding", "move-caught-up"
MOVE_COMPLETED, MOVE_REVERTED = "move-completed", "move-reverted"
# Buckets of the "leaders per SPU over time" series.
TIMELINE_BUCKETS = 200
# Jobs submitted at once by the driver.
PARALLEL_JOBS = 4


def session(
    master: str | None = None,
    app_name: str = "sc-audit",
    shuffle_partitions: int | None = None,
    settings: dict[str, str] | None = None,
) -> SparkSession:
    """A SparkSession in UTC. ``master`` None: whatever spark-submit (or the environment) says.
    ``settings`` come last, over these defaults; JVM options among them apply only if this starts
    the JVM (the first session of the process)."""
    builder = SparkSession.builder.appName(app_name)
    if master:
        builder = builder.master(master)
    builder = (
        builder.config("spark.sql.session.timeZone", "UTC")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.sql.parquet.mergeSchema", "false")
    )
    local = bool(master and master.startswith("local"))
    if local:
        builder = builder.config("spark.ui.enabled", "false")
    if shuffle_partitions is not None:
        builder = builder.config("spark.sql.shuffle.partitions", str(shuffle_partitions))
    for key, value in (settings or {}).items():
        builder = builder.config(key, value)
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")
    # A session that was running already keeps its context's launch settings: those given here
    # are only in this session's conf, so they are looked at too.
    chosen = shuffle_partitions is not None or "spark.sql.shuffle.partitions" in (settings or {})
    if local and not chosen and not spark.sparkContext.getConf().contains("spark.sql.shuffle.partitions"):
        # One machine: a few shuffle partitions per core, not Spark's cluster default of 200; unless
        # set here or where Spark was launched (spark-submit --conf, PYSPARK_SUBMIT_ARGS).
        spark.conf.set("spark.sql.shuffle.partitions", str(2 * (os.cpu_count() or 1)))
    return spark


def load(spark: SparkSession, history_dir: Path | str) -> DataFrame:
    path = Path(history_dir)
    if not path.is_dir() or not any(path.glob("date=*")):
        raise ValueError(
            f"{str(history_dir)!r} holds no exported history (no date=... directories): "
            "run `sc audit export --out DIR` first and pass that DIR"
        )
    # The export's own schema, not one Spark infers from the files: it would take the date partition
    # for a date, and the columns from whichever file's footer it reads first.
    return spark.read.schema(from_arrow_schema(export.SCHEMA)).parquet(str(path))


def load_histories(spark: SparkSession, history_dirs: Sequence[Path | str]) -> DataFrame:
    """The records of one exported history, or of several SCs' histories of one store, as the jobs
    read them: with ``history`` (the id of the history a record is from), ``order`` (the order the
    jobs take records in; unique) and ``duplicate`` (a change record another history holds too).

    One history: ``order`` is ``seq``, and nothing is a duplicate. Several (each SC of a store
    records every change its Reader sees, and the actions of the terms it led): a change several
    histories hold is taken once, as the first SC recorded it (a copy seen live or replayed before
    one from a listing, then the earliest ``time``); change and sync records are ordered by the store
    revision they stand at (a listing's records at the listing's revision), then in the order the
    histories were given and by ``seq``. Refused: a history given twice, a history whose store went behind it (its revisions
    after that are another store's), and histories that recorded different objects at one revision
    (they are not of one store).
    """
    paths = [Path(directory) for directory in history_dirs]
    if not paths:
        raise ValueError("no exported history given: pass at least one `sc audit export --out` directory")
    frames: list[DataFrame] = []
    ids: dict[str, Path] = {}
    for index, path in enumerate(paths):
        frame = load(spark, path)
        try:
            history_id = export.dataset_history_id(path)
        except export.ExportError as error:
            raise ValueError(str(error)) from None
        if history_id in ids:
            raise ValueError(
                f"{str(ids[history_id])!r} and {str(path)!r} are exports of the same history (id {history_id}): give each once"
            )
        ids[history_id] = path
        frames.append(frame.withColumn("history", F.lit(history_id)).withColumn("history_index", F.lit(index)))
    if len(frames) == 1:
        return frames[0].withColumn("order", F.col("seq")).withColumn("duplicate", F.lit(False)).drop("history_index")
    merged = frames[0]
    for frame in frames[1:]:
        merged = merged.unionByName(frame)
    _check_one_store(merged)
    is_change, listed = F.col("type") == "change", F.coalesce(F.col("source") == "list", F.lit(False))
    copies = Window.partitionBy("kind", "name", "revision").orderBy(listed, "time", "history", "seq")
    flagged = (
        merged.filter(is_change)
        .withColumn("duplicate", F.row_number().over(copies) > 1)
        .unionByName(merged.filter(~is_change).withColumn("duplicate", F.lit(False)))
    )
    position = F.when(is_change, F.when(listed, F.col("snapshot_revision")).otherwise(F.col("revision"))).when(
        F.col("type") == "sync", F.col("revision")
    )
    # Numbered on the three numbers that place a record, then joined back: one ordered window over
    # every column would move the whole history into one Spark partition.
    keys = flagged.select("history_index", "seq", position.alias("position"))
    numbered = keys.select(
        "history_index", "seq", F.row_number().over(Window.orderBy("position", "history_index", "seq")).alias("order")
    )
    return flagged.join(numbered, ["history_index", "seq"]).drop("history_index")


def _check_one_store(merged: DataFrame) -> None:
    behind = merged.filter((F.col("type") == "gap") & (F.col("reason") == STORE_BEHIND_HISTORY)).select("history").first()
    if behind is not None:
        raise ValueError(
            f"the history {behind['history']} has a {STORE_BEHIND_HISTORY} gap: its later revisions are another "
            "store's and cannot be merged with other histories by revision; report on it alone"
        )
    clash = (
        merged.filter(F.col("type") == "change")
        .groupBy("kind", "name", "revision")
        .agg(
            # A listing's copy names the change "create"; the object is the same.
            F.count_distinct(F.xxhash64(F.coalesce("spec", F.lit("")), F.coalesce("status", F.lit("")))).alias("versions"),
            F.sort_array(F.collect_set("history")).alias("histories"),
        )
        .filter(F.col("versions") > 1)
        .first()
    )
    if clash is not None:
        raise ValueError(
            f"the histories {', '.join(clash['histories'])} recorded different objects as {clash['kind']}/{clash['name']} "
            f"at revision {clash['revision']}: they are not histories of one store; report on each alone"
        )


def run(
    spark: SparkSession,
    history_dirs: Path | str | Sequence[Path | str],
    options: options_module.Options = options_module.Options(),
) -> options_module.Results:
    """Every audit over the exported history at ``history_dirs``, or over several SCs' histories
    of one store merged (``load_histories``)."""
    dirs = [history_dirs] if isinstance(history_dirs, Path | str) else list(history_dirs)
    frame = load_histories(spark, dirs)
    if len(dirs) > 1:
        # Merged, the records come from windows and joins over every history: computed once, and
        # the jobs planned against the result, not that lineage (a cache keeps the lineage to plan:
        # the two-SC test's report took 36-45 s with one, 18-25 s so).
        frame = frame.localCheckpoint()
    summary = frame.filter(~F.col("duplicate")).agg(
        F.count(F.lit(1)).alias("records"),
        F.min(F.unix_micros("time")).alias("first_us"),
        F.max(F.unix_micros("time")).alias("last_us"),
    ).first()
    assert summary is not None
    first_us, last_us = summary["first_us"], summary["last_us"]
    histories = sorted(export.dataset_history_id(Path(directory)) for directory in dirs)
    results = options_module.Results(
        history={"records": summary["records"], "first_us": first_us, "last_us": last_us, "histories": histories}
    )
    at_us = _micros(options.at) if options.at is not None else last_us
    results.balance_at_us = at_us

    # Cached and computed before the jobs start: jobs started together on an uncomputed cache would
    # each run its shuffles again.
    changes = enrich(frame).cache()
    runs = _runs(changes).cache()
    runs.count()
    leader_changes = _leader_changes(changes, frame)
    moves = _moves(changes, frame)
    unavailability = _unavailability(runs, last_us)
    intervals = _spu_intervals(runs, last_us)
    spus, racks, violations = balance(frame, changes, at_us)
    gaps = frame.filter(F.col("type") == "gap").select(
        "history", "seq", F.unix_micros("time").alias("at_us"), "first_revision", F.col("revision").alias("last_revision"),
        "reason", "dropped",
    )
    sc_terms = frame.filter(F.col("type").isin("takeover", "step-down")).select(
        "history", "seq", F.unix_micros("time").alias("at_us"), F.col("type").alias("event"), F.col("name").alias("sc"), "address",
        F.col("revision").alias("epoch"), "cause", F.col("detail").alias("previous"),
        F.col("cause_revision").alias("previous_epoch"),
    )
    queries: dict[str, tuple[DataFrame, tuple[str, ...]]] = {
        "leader_changes": (leader_changes, ("at_us", "partition")),
        "leader_changes_by_spu": (_leader_changes_by_spu(leader_changes), ("spu", "cause")),
        "unavailability": (unavailability, ("start_us", "partition")),
        "unavailability_by_topic": (_unavailability_by_topic(unavailability), ("topic",)),
        "provisioning": (_provisioning(changes), ("created_us", "topic")),
        "spu_intervals": (intervals, ("spu", "start_us")),
        "flapping_spus": (_flapping(intervals, options), ("spu",)),
        "balance_spus": (spus, ("spu",)),
        "balance_racks": (racks, ("rack",)),
        "rack_violations": (violations, ("partition",)),
        "spec_changes": (_spec_changes(changes), ("order",)),
        # By time: the records of different SCs' histories have no common sequence.
        "gaps": (gaps, ("at_us", "history", "seq")),
        "sc_terms": (sc_terms, ("at_us", "history", "seq")),
        "leaders_over_time": (_leaders_over_time(changes, first_us, last_us), ("bucket_us", "spu")),
        "moves": (moves, ("at_us", "partition")),
        "moves_by_spu": (_moves_by_spu(moves), ("spu",)),
        "identity_changes": (_identity_changes(changes), ("at_us", "partition", "revision")),
    }
    # Submitted together, the jobs share the executors instead of waiting on each other's latency.
    with concurrent.futures.ThreadPoolExecutor(max_workers=PARALLEL_JOBS) as pool:
        futures = {name: pool.submit(_collect, query, *order) for name, (query, order) in queries.items()}
        results.tables = {name: future.result() for name, future in futures.items()}
    runs.unpersist()
    changes.unpersist()
    frame.unpersist()
    return results


# ---------------------------------------------------------------------------- the jobs


def enrich(frame: DataFrame) -> DataFrame:
    """Every change record with what the jobs need from the records before and after it of the same
    object (one sort of the history by object and sequence number, shared by every job):

    ``by_sc`` and ``action_cause`` (an applied action of the SC wrote this key at this revision),
    ``prev_leader``, ``prev_revision``, ``prev_spec_hash``, ``next_time``, ``incarnation`` (a create starts a new life of
    the object), ``spu`` (an SPU's id, also on its delete record) and ``state`` (partitions: "down"
    while unavailable, else "up"; SPUs: Online, Offline, "other" or "deleted").
    """
    applied = (
        frame.filter((F.col("type") == "action") & (F.col("outcome") == "applied"))
        .select(F.explode("keys").alias("key"), F.col("revision").alias("action_revision"), F.col("cause").alias("action_cause"))
        .select(
            F.split("key", "/", 2)[0].alias("kind"), F.split("key", "/", 2)[1].alias("name"),
            F.col("action_revision").alias("revision"), "action_cause", F.lit(True).alias("by_sc"),
        )
    )
    # Who asked for a write of the public port (one per key and revision): the principal.
    requested = frame.filter(F.col("type") == "request").select(
        "kind", "name", "revision", F.col("by").alias("requested_by"), F.col("address").alias("requested_from")
    ).dropDuplicates(["kind", "name", "revision"])
    changes = frame.filter((F.col("type") == "change") & ~F.col("duplicate")).select(
        "history", "seq", "order", "time", "kind", "name", "op", "revision", "source", "snapshot_revision", "resolution", "uid",
        "leader", "replicas", "spu_id", "rack", "ignore_rack_assignment", F.xxhash64("spec").alias("spec_hash"),
    )
    joined = (
        changes.join(applied, ["kind", "name", "revision"], "left")
        .join(requested, ["kind", "name", "revision"], "left")
        .repartition("kind", "name")
    )
    ordered = Window.partitionBy("kind", "name").orderBy("order")
    running = ordered.rowsBetween(Window.unboundedPreceding, Window.currentRow)
    enriched = joined.select(
        "*",
        F.lag("leader").over(ordered).alias("prev_leader"),
        F.lag("replicas").over(ordered).alias("prev_replicas"),
        F.lag("revision").over(ordered).alias("prev_revision"),
        F.lag("spec_hash").over(ordered).alias("prev_spec_hash"),
        F.lead("time").over(ordered).alias("next_time"),
        F.sum(F.when(F.col("op") == "create", 1).otherwise(0)).over(running).alias("incarnation"),
        F.last("spu_id", ignorenulls=True).over(running).alias("spu"),  # a delete record has no spec
    )
    # Online at some point of this life so far: a partition Offline after that has lost its leader.
    was_online = F.max(F.when(F.col("resolution") == "Online", F.col("incarnation"))).over(running) == F.col("incarnation")
    partition_down = (F.col("resolution") == "LeaderOffline") | ((F.col("resolution") == "Offline") & was_online)
    state = (
        F.when(F.col("kind") == "partitions", F.when(F.coalesce(partition_down, F.lit(False)), "down").otherwise("up"))
        .when(F.col("kind") != "spus", F.lit(None))
        .when(F.col("op") == "delete", F.lit("deleted"))
        .when(F.col("resolution").isin("Online", "Offline"), F.col("resolution"))
        .otherwise(F.lit("other"))
    )
    return enriched.withColumn("state", state).withColumn("topic", _topic(F.col("name")))


def _runs(changes: DataFrame) -> DataFrame:
    """Consecutive records of an object in the same ``state``: one row per run, with its start and
    end (the time of the first record after the run; None while it lasts)."""
    ordered = Window.partitionBy("kind", "name").orderBy("order")
    running = ordered.rowsBetween(Window.unboundedPreceding, Window.currentRow)
    new_run = F.when(F.col("state").eqNullSafe(F.lag("state").over(ordered)), 0).otherwise(1)
    marked = changes.filter(F.col("kind").isin("partitions", "spus")).withColumn("run", F.sum(new_run).over(running))
    return marked.groupBy("kind", "name", "run", "state").agg(
        F.min("time").alias("start"),
        F.max_by("next_time", "order").alias("end"),
        F.min_by("spu", "order").alias("spu"),
        F.first("topic").alias("topic"),
    )


def _leader_changes(changes: DataFrame, frame: DataFrame) -> DataFrame:
    """A partition's spec.leader moving from one SPU to another, with its cause.

    The cause of the SC's election that wrote it: the one applied at that revision, else one whose
    answer was lost (``unavailable``: the write may have committed) and whose compare-and-swap
    expected the partition's previous revision, the one this change replaced. No election: "unknown"
    when a gap record covers the revision (the history lost records there), else "external".
    """
    moved = changes.filter(
        (F.col("kind") == "partitions")
        & F.col("prev_leader").isNotNull()
        & F.col("leader").isNotNull()
        & (F.col("leader") != F.col("prev_leader"))
    )
    # Elections record the revision they were decided from (their expected revision) as cause_revision.
    in_doubt = (
        frame.filter((F.col("type") == "action") & (F.col("verb") == "elect") & (F.col("outcome") == "unavailable"))
        .select(F.explode("keys").alias("key"), "cause_revision", "cause", F.struct("time", "history", "seq").alias("decided"))
        .filter(F.col("key").startswith("partitions/"))
        .groupBy(F.split("key", "/", 2)[1].alias("name"), F.col("cause_revision").alias("prev_revision"))
        .agg(F.max_by("cause", "decided").alias("in_doubt_cause"))  # several (of one SC or more): the last one decided
    )
    gap_ranges = frame.filter(F.col("type") == "gap").select(
        F.col("first_revision").alias("gap_first"), F.col("revision").alias("gap_last")
    )
    in_gap = (
        moved.select("name", "revision")
        .join(F.broadcast(gap_ranges), (F.col("revision") >= F.col("gap_first")) & (F.col("revision") <= F.col("gap_last")), "left_semi")
        .withColumn("in_gap", F.lit(True))
    )
    explained = moved.join(in_doubt, ["name", "prev_revision"], "left").join(in_gap, ["name", "revision"], "left")
    cause = F.coalesce(
        F.col("action_cause"), F.col("in_doubt_cause"), F.when(F.col("in_gap"), F.lit(report.UNKNOWN)), F.lit(report.EXTERNAL)
    )
    return explained.select(
        F.col("name").alias("partition"),
        "topic",
        F.col("prev_leader").alias("from_spu"),
        F.col("leader").alias("to_spu"),
        cause.alias("cause"),
        F.unix_micros("time").alias("at_us"),
        "revision",
    )


def _moves(changes: DataFrame, frame: DataFrame) -> DataFrame:
    """Each replica move that ended, from the partition's writes that the SC's move steps made (their
    action causes): the SPUs it added (the ``move-adding`` write), the SPUs that left (the
    ``move-completed`` write: what the replicas lost), from start (the ``move-adding`` write; the
    ``move-started`` one for a move that adds no replica, such as a reordering) to end; a cancelled
    move ends ``reverted`` and moved nothing. A move's writes are those from its ``move-started``
    write (or, where the history lacks it, its ``move-adding`` one) to its end, or to the next
    move's start, within one life of the partition (``_partition_lives``); a snapshot's copy of a
    write the history holds is not one of them again.

    ``records``: what each arriving replica copied, the committed offset (``status.leader.hw``)
    its ``move-caught-up`` write recorded (the write that committed the last arriving replica into
    the in-sync set: a replica joins holding every record committed then, and logs start at 0); the
    records appended after that are replication, not the move's. 0 when no replica arrived; None
    when the history holds no such write for the move (a gap).

    A completed move none of whose starting writes the history holds has no start, and its
    ``arrived`` is None (unknown); so is its ``left`` when its end is the first write of its life
    the history holds."""
    # A snapshot after a gap lists each partition at its last write, which carries that write's
    # action: a listed copy of a write the history holds is not that step again (one of a write
    # the gap lost is the step).
    copies = Window.partitionBy("name", "revision").orderBy("order")
    steps = (
        _partition_lives(changes.filter(F.col("kind") == "partitions"))
        .filter(F.col("action_cause").isin(MOVE_STARTED, MOVE_ADDING, MOVE_CAUGHT_UP, MOVE_COMPLETED, MOVE_REVERTED))
        .withColumn("copy", F.row_number().over(copies))
        .filter(F.col("copy") == 1)
        .drop("copy")
    )
    caught_up = F.col("action_cause") == MOVE_CAUGHT_UP
    # The committed offset of the few caught-up writes, from their status (JSON, not in ``changes``).
    committed = (
        frame.filter((F.col("type") == "change") & (F.col("kind") == "partitions"))
        .join(F.broadcast(steps.filter(caught_up).select("order")), "order", "left_semi")
        .select("order", F.get_json_object("status", "$.leader.hw").cast("long").alias("committed_hw"))
    )
    started, adding = F.col("action_cause") == MOVE_STARTED, F.col("action_cause") == MOVE_ADDING
    ordered = Window.partitionBy("name", "life").orderBy("order")
    running = ordered.rowsBetween(Window.unboundedPreceding, Window.currentRow)
    after_start = F.coalesce(F.col("previous_cause") == MOVE_STARTED, F.lit(False))
    # A move ends with its completed or reverted write: the step after one is of another move, even
    # where the history lost that move's start (a gap).
    after_end = F.coalesce(F.col("previous_cause").isin(MOVE_COMPLETED, MOVE_REVERTED), F.lit(False))
    opens = started | (adding & ~after_start) | after_end
    numbered = (
        steps.join(committed, ["order"], "left")
        .withColumn("previous_cause", F.lag("action_cause").over(ordered))
        .withColumn("move", F.sum(F.when(opens, 1).otherwise(0)).over(running))
    )
    of_move = Window.partitionBy("name", "life", "move").orderBy("order").rowsBetween(Window.unboundedPreceding, Window.currentRow)
    carried = numbered.select(
        "*",
        F.last(F.when(adding, F.array_except("replicas", "prev_replicas")), ignorenulls=True).over(of_move).alias("added"),
        F.coalesce(
            F.last(F.when(adding, F.col("time")), ignorenulls=True).over(of_move),
            F.first(F.when(started, F.col("time")), ignorenulls=True).over(of_move),
        ).alias("started"),
        F.last(F.when(caught_up, F.col("committed_hw")), ignorenulls=True).over(of_move).alias("copied"),
    )
    ended = carried.filter(F.col("action_cause").isin(MOVE_COMPLETED, MOVE_REVERTED))
    completed = F.col("action_cause") == MOVE_COMPLETED
    # A completed move none of whose starting writes the history holds (a gap): what arrived is
    # unknown (null), not nothing; a reverted one moved nothing.
    arrived = F.when(~completed, F.array()).when(
        F.col("started").isNotNull(), F.array_intersect("replicas", F.coalesce("added", F.array()))
    )
    return ended.select(
        F.col("name").alias("partition"),
        "topic",
        F.when(completed, "completed").otherwise("reverted").alias("outcome"),
        arrived.alias("arrived"),
        F.when(completed, F.array_except("prev_replicas", "replicas")).otherwise(F.array()).alias("left"),
        F.unix_micros("started").alias("started_us"),
        F.unix_micros("time").alias("at_us"),
        ((F.unix_micros("time") - F.unix_micros("started")) / F.lit(1_000_000.0)).alias("seconds"),
        # -1: the SC knew of no committed offset then (unknown, as no write). Arrivals unknown: the
        # committed offset, if the history holds the caught-up write (an unknown list's size is not 0).
        F.when(F.size(arrived) == 0, F.lit(0)).when(F.col("copied") >= 0, F.col("copied")).alias("records"),
    )


def _partition_lives(partitions: DataFrame) -> DataFrame:
    """The partition change records with ``life``, a number that changes where another partition of
    the name begins: at a create (a listing's too: a snapshot after a gap lists as created what was
    created in the gap) or a delete, and at a uid other than the last one known since (a delete and
    a create the history lost, or an identity edit, which makes it another partition to its SPUs).
    A uid removed, or given to a partition that had none, begins none (as identity changes count
    them: no SPU drops a log, and records exported before the uid column read as having none), so
    partitions without uids are told apart by creates and deletes alone. ``prev_replicas`` is kept
    only from a record of the same life."""
    ordered = Window.partitionBy("kind", "name").orderBy("order")
    running = ordered.rowsBetween(Window.unboundedPreceding, Window.currentRow)
    made_or_deleted = F.col("op").isin("create", "delete")
    spans = partitions.withColumn("span", F.sum(F.when(made_or_deleted, 1).otherwise(0)).over(running))
    before = Window.partitionBy("kind", "name", "span").orderBy("order").rowsBetween(Window.unboundedPreceding, -1)
    other_uid = F.coalesce(F.col("uid") != F.last("uid", ignorenulls=True).over(before), F.lit(False))
    lives = spans.withColumn("life", F.sum(F.when(made_or_deleted | other_uid, 1).otherwise(0)).over(running))
    same_life = F.coalesce(F.lag("life").over(ordered) == F.col("life"), F.lit(False))
    return lives.withColumn("prev_replicas", F.when(same_life, F.col("prev_replicas"))).drop("span")


def _moves_by_spu(moves: DataFrame) -> DataFrame:
    """Per SPU: the completed moves that brought it a replica, and those that took one away, with
    the records they copied onto it and off it (moves whose records are unknown count none)."""
    records = F.coalesce(F.col("records"), F.lit(0))
    arrived = moves.select(F.explode("arrived").alias("spu"), records.alias("records")).groupBy("spu").agg(
        F.count(F.lit(1)).alias("moves_in"), F.sum("records").alias("records_in")
    )
    left = moves.select(F.explode("left").alias("spu"), records.alias("records")).groupBy("spu").agg(
        F.count(F.lit(1)).alias("moves_out"), F.sum("records").alias("records_out")
    )
    return arrived.join(left, ["spu"], "full_outer").select(
        "spu",
        F.coalesce("moves_in", F.lit(0)).alias("moves_in"),
        F.coalesce("moves_out", F.lit(0)).alias("moves_out"),
        F.coalesce("records_in", F.lit(0)).alias("records_in"),
        F.coalesce("records_out", F.lit(0)).alias("records_out"),
    )


def _identity_changes(changes: DataFrame) -> DataFrame:
    """A partition's uid written over in place: an update whose uid differs from the last uid of the
    same life of the partition (from its create, or a listing's, to its delete), which the SC never
    does. A uid removed, or given to a partition that had none, is not one (it makes no SPU drop a
    log, and records exported before the uid column read as having none); a uid given after one was
    removed is, from the removed one (the SPUs still hold it)."""
    partitions = changes.filter(F.col("kind") == "partitions")
    running = Window.partitionBy("name").orderBy("order").rowsBetween(Window.unboundedPreceding, Window.currentRow)
    # A delete ends a life, as a create starts one: an update after a delete whose create the
    # history lost (a queue-full gap) belongs to no earlier life.
    lives = partitions.withColumn("life", F.sum(F.when(F.col("op").isin("create", "delete"), 1).otherwise(0)).over(running))
    before = Window.partitionBy("name", "life").orderBy("order").rowsBetween(Window.unboundedPreceding, -1)
    known = lives.withColumn("from_uid", F.last("uid", ignorenulls=True).over(before))
    return known.filter(
        (F.col("op") == "update") & F.col("uid").isNotNull() & F.col("from_uid").isNotNull() & (F.col("uid") != F.col("from_uid"))
    ).select(
        F.col("name").alias("partition"), "revision", F.unix_micros("time").alias("at_us"), "from_uid", F.col("uid").alias("to_uid")
    )


def _leader_changes_by_spu(leader_changes: DataFrame) -> DataFrame:
    gained = leader_changes.groupBy(F.col("to_spu").alias("spu"), "cause").agg(F.count(F.lit(1)).alias("gained"))
    lost = leader_changes.groupBy(F.col("from_spu").alias("spu"), "cause").agg(F.count(F.lit(1)).alias("lost"))
    return gained.join(lost, ["spu", "cause"], "full_outer").select(
        "spu", "cause", F.coalesce("gained", F.lit(0)).alias("gained"), F.coalesce("lost", F.lit(0)).alias("lost")
    )


def _seconds(start: Column, end: Column, last_us: int) -> Column:
    end_us = F.coalesce(F.unix_micros(end), F.lit(last_us))
    return ((end_us - F.unix_micros(start)) / F.lit(1_000_000.0)).alias("seconds")


def _unavailability(runs: DataFrame, last_us: int) -> DataFrame:
    """Windows with no serving leader: LeaderOffline, or Offline after having been Online (a new
    partition that has never been Online counts as provisioning, not as unavailability)."""
    return runs.filter((F.col("kind") == "partitions") & (F.col("state") == "down")).select(
        F.col("name").alias("partition"),
        "topic",
        F.unix_micros("start").alias("start_us"),
        F.unix_micros("end").alias("end_us"),
        _seconds(F.col("start"), F.col("end"), last_us),
    )


def _unavailability_by_topic(unavailability: DataFrame) -> DataFrame:
    return unavailability.groupBy("topic").agg(
        F.count(F.lit(1)).alias("windows"),
        F.expr("percentile(seconds, 0.5)").alias("p50"),
        F.expr("percentile(seconds, 0.99)").alias("p99"),
        F.max("seconds").alias("max"),
        F.sum("seconds").alias("total"),
    )


def _provisioning(changes: DataFrame) -> DataFrame:
    """From a topic's creation (as seen live, not from a listing) to its first Provisioned status."""
    topics = changes.filter(F.col("kind") == "topics")
    lives = topics.groupBy("name", "incarnation").agg(
        F.min(F.when((F.col("op") == "create") & (F.col("source") != "list"), F.col("time"))).alias("created"),
        F.min(F.when(F.col("resolution") == "Provisioned", F.col("time"))).alias("provisioned"),
    )
    return lives.filter(F.col("created").isNotNull()).select(
        F.col("name").alias("topic"),
        F.unix_micros("created").alias("created_us"),
        F.unix_micros("provisioned").alias("provisioned_us"),
        ((F.unix_micros("provisioned") - F.unix_micros("created")) / F.lit(1_000_000.0)).alias("seconds"),
    )


def _spu_intervals(runs: DataFrame, last_us: int) -> DataFrame:
    """Each SPU's Online and Offline periods (Init and deletion end a period, and start none)."""
    return runs.filter((F.col("kind") == "spus") & F.col("state").isin("Online", "Offline")).select(
        "spu",
        "state",
        F.unix_micros("start").alias("start_us"),
        F.unix_micros("end").alias("end_us"),
        _seconds(F.col("start"), F.col("end"), last_us),
    )


def _flapping(intervals: DataFrame, options: options_module.Options) -> DataFrame:
    """SPUs that went offline at least ``flap_count`` times within ``flap_window`` seconds."""
    window_us = int(options.flap_window * 1_000_000)
    offline = intervals.filter(F.col("state") == "Offline")
    recent = Window.partitionBy("spu").orderBy("start_us").rangeBetween(-window_us, 0)
    counted = offline.withColumn("in_window", F.count(F.lit(1)).over(recent))
    return (
        counted.groupBy("spu")
        .agg(F.count(F.lit(1)).alias("offline_count"), F.max("in_window").alias("max_in_window"))
        .filter(F.col("max_in_window") >= options.flap_count)
    )


def _state_at(frame: DataFrame, changes: DataFrame, at_us: int) -> DataFrame:
    """The objects that existed at ``at_us``: each one's last record by then, unless a delete.

    A snapshot (list records closed by a sync record, after a gap) is a barrier: an object whose
    last record is older and that the snapshot did not list had gone by then.
    """
    barrier = (
        frame.filter((F.col("type") == "sync") & F.col("snapshot") & (F.unix_micros("time") <= at_us))
        .agg(F.max("order").alias("barrier_order"), F.max_by(F.struct("revision", "history"), "order").alias("barrier"))
        .select("barrier_order", F.col("barrier.revision").alias("barrier_revision"), F.col("barrier.history").alias("barrier_history"))
    )
    # The objects the last snapshot listed (from any copy: of several histories, the one kept may be another's).
    listed = (
        frame.filter((F.col("type") == "change") & (F.col("source") == "list"))
        .join(
            F.broadcast(barrier),
            (F.col("snapshot_revision") == F.col("barrier_revision")) & (F.col("history") == F.col("barrier_history")),
            "left_semi",
        )
        .select("kind", "name", F.lit(True).alias("listed"))
        .distinct()
    )
    fields = ["order", "op", "source", "snapshot_revision", "spu_id", "rack", "leader", "replicas", "ignore_rack_assignment"]
    last = (
        changes.filter(F.unix_micros("time") <= at_us)
        .groupBy("kind", "name")
        .agg(F.max_by(F.struct(*fields), "order").alias("last"))
        .select("kind", "name", "last.*")
    )
    return (
        last.crossJoin(F.broadcast(barrier))
        .join(listed, ["kind", "name"], "left")
        .filter(
            (F.col("op") != "delete")
            & (F.col("barrier_order").isNull() | (F.col("order") > F.col("barrier_order")) | F.coalesce("listed", F.lit(False)))
        )
    )


def balance(frame: DataFrame, changes: DataFrame, at_us: int) -> tuple[DataFrame, DataFrame, DataFrame]:
    """Replicas and leaders per SPU and per rack at ``at_us``, and partitions whose replicas share a
    rack although enough racks existed (topics that ignore rack assignment excepted).

    ``changes``: the change records (``enrich(frame)``, or simply those of ``frame``).
    """
    alive = _state_at(frame, changes, at_us)
    spus = alive.filter(F.col("kind") == "spus").select(F.col("spu_id").alias("spu"), "rack")
    partitions = alive.filter(F.col("kind") == "partitions").select(
        "name", _topic(F.col("name")).alias("topic"), "leader", "replicas"
    )
    topics = alive.filter(F.col("kind") == "topics").select(
        F.col("name").alias("topic"), "ignore_rack_assignment"
    )
    replicas = partitions.select("name", "topic", F.posexplode("replicas").alias("position", "spu"))
    replica_counts = replicas.groupBy("spu").agg(F.count(F.lit(1)).alias("replicas"))
    leader_counts = partitions.groupBy(F.col("leader").alias("spu")).agg(F.count(F.lit(1)).alias("leaders"))
    per_spu = (
        spus.join(replica_counts, "spu", "full_outer")
        .join(leader_counts, "spu", "full_outer")
        .select(
            "spu", "rack", F.coalesce("replicas", F.lit(0)).alias("replicas"), F.coalesce("leaders", F.lit(0)).alias("leaders")
        )
    )
    per_rack = (
        per_spu.filter(F.col("rack").isNotNull())
        .groupBy("rack")
        .agg(F.sum("replicas").alias("replicas"), F.sum("leaders").alias("leaders"), F.count(F.lit(1)).alias("spus"))
    )
    rack_count = spus.agg(F.count_distinct("rack").alias("rack_count"))  # nulls are not counted
    placed = replicas.join(F.broadcast(spus), "spu", "left").groupBy("name", "topic").agg(
        F.sort_array(F.collect_list(F.struct("position", "spu", "rack"))).alias("placed"),
        F.count_distinct("rack").alias("distinct_racks"),
    )
    violations = (
        placed.join(topics, "topic", "left")
        .crossJoin(F.broadcast(rack_count))
        .withColumn("required_racks", F.least(F.size("placed"), F.col("rack_count").cast("int")))
        .filter((F.col("distinct_racks") < F.col("required_racks")) & ~F.coalesce("ignore_rack_assignment", F.lit(False)))
        .select(
            F.col("name").alias("partition"),
            "topic",
            F.col("placed.spu").alias("replicas"),
            F.col("placed.rack").alias("racks"),
            "distinct_racks",
            "required_racks",
        )
    )
    return per_spu, per_rack, violations


def _spec_changes(changes: DataFrame) -> DataFrame:
    """Creates, deletes and updates that changed the spec (status-only writes are not spec changes),
    as seen live; ``by`` is "sc" when an action of the SC wrote it, else the principal of the request
    that did (a token's name, CN=<cn>, anonymous@loopback), else "user" (a write from outside the SC,
    or from an SC that recorded no principal); ``address`` is where that request came from."""
    kept = changes.filter(
        (F.col("source") != "list")
        & (
            F.col("op").isin("create", "delete")
            | ((F.col("op") == "update") & ~F.col("spec_hash").eqNullSafe(F.col("prev_spec_hash")))
        )
    )
    return kept.select(
        "order",
        "history",
        "seq",
        "kind",
        "name",
        "op",
        F.unix_micros("time").alias("at_us"),
        "revision",
        F.when(F.col("by_sc"), F.lit("sc")).otherwise(F.coalesce(F.col("requested_by"), F.lit("user"))).alias("by"),
        F.when(F.col("by_sc"), F.lit(None)).otherwise(F.col("requested_from")).alias("address"),
    )


def _leaders_over_time(changes: DataFrame, first_us: int, last_us: int) -> DataFrame:
    """Leaders per SPU at the end of each of TIMELINE_BUCKETS time buckets (for the chart)."""
    bucket_us = max(1, -(-(last_us - first_us) // TIMELINE_BUCKETS))
    moved = changes.filter((F.col("kind") == "partitions") & ~F.col("leader").eqNullSafe(F.col("prev_leader")))
    bucket = (F.floor((F.unix_micros("time") - F.lit(first_us)) / F.lit(bucket_us)) + 1) * F.lit(bucket_us) + F.lit(first_us)
    gained = moved.filter(F.col("leader").isNotNull()).select(bucket.alias("bucket_us"), F.col("leader").alias("spu"), F.lit(1).alias("delta"))
    lost = moved.filter(F.col("prev_leader").isNotNull()).select(bucket.alias("bucket_us"), F.col("prev_leader").alias("spu"), F.lit(-1).alias("delta"))
    deltas = gained.unionByName(lost).groupBy("bucket_us", "spu").agg(F.sum("delta").alias("delta"))
    running = Window.partitionBy("spu").orderBy("bucket_us").rowsBetween(Window.unboundedPreceding, Window.currentRow)
    return deltas.select("bucket_us", "spu", F.sum("delta").over(running).alias("leaders"))


# ---------------------------------------------------------------------------- helpers


def _topic(name: Column) -> Column:
    return F.regexp_extract(name, r"^(.*)-[0-9]+$", 1)


def _collect(frame: DataFrame, *order: str) -> list[dict[str, Any]]:
    """The rows, in order, as dicts (through Arrow: several times faster than Row objects)."""
    rows: list[dict[str, Any]] = frame.orderBy(*order).toArrow().to_pylist()
    return rows


def _micros(value: datetime.datetime) -> int:
    if value.tzinfo is None:
        value = value.replace(tzinfo=datetime.UTC)
    return (value - datetime.datetime(1970, 1, 1, tzinfo=datetime.UTC)) // datetime.timedelta(microseconds=1)


# ---------------------------------------------------------------------------- entry points


def report_command(args: argparse.Namespace, default_master: str | None = None) -> int:
    """Run every job and write the report (the arguments of options.add_report_arguments); an exit status."""
    try:
        options = options_module.Options(
            at=export.parse_time(args.at) if args.at else None, flap_count=args.flap_count, flap_window=args.flap_window
        )
    except (ValueError, export.ExportError) as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    # Spark's Python workers must run this interpreter (the one with the project installed).
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    already = SparkSession.getActiveSession()  # e.g. a notebook's: used as it is, and left running
    spark = already or session(args.master or default_master)
    try:
        results = run(spark, args.history, options)
    except ValueError as error:
        print(f"error: {error}", file=sys.stderr)
        return 1
    finally:
        if already is None:
            spark.stop()
    written = report.write(results, args.out)
    print(f"report written to {args.out}: {len(written)} files (report.json, report.md, tables/, charts/)")
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    """spark-submit controller/audit/jobs.py --history DIR --out DIR (the master: spark-submit's)."""
    parser = argparse.ArgumentParser(prog="jobs.py", description="The SC's Spark audit jobs over an exported history.")
    options_module.add_report_arguments(parser)
    return report_command(parser.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())

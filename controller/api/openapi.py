"""The OpenAPI 3.1 document of the public API; object schemas come from the pydantic models.

Purely computational, no I/O. ``python -m controller.api.openapi > docs/openapi.json`` refreshes the
copy kept in the repo (a test checks the served document equals it).
"""

from __future__ import annotations

import json
import sys
from typing import Any

from controller import placement
from controller.api import auth, listing
from store import models

KIND_SCHEMAS = {"spus": "Spu", "spu-groups": "SpuGroup", "topics": "Topic", "partitions": "Partition"}


def _ref(name: str) -> dict[str, str]:
    return {"$ref": f"#/components/schemas/{name}"}


def _json(schema: dict[str, Any], description: str) -> dict[str, Any]:
    return {"description": description, "content": {"application/json": {"schema": schema}}}


def _error(description: str) -> dict[str, Any]:
    return _json(_ref("Error"), description)


# An object's name, as the models check it.
NAME = {"type": "string", "minLength": 1, "maxLength": models.NAME_MAX_LENGTH, "pattern": models.NAME_REGEX}
# Any object's name in a path: a partition's is its topic's, '-', and an index below MAX_PARTITIONS.
PATH_NAME = {**NAME, "maxLength": models.NAME_MAX_LENGTH + 1 + len(str(models.MAX_PARTITIONS - 1))}
# A placement plug-in is named like an object, and must be one the SC's operator configured.
PLUGIN_NAME = {**NAME, "description": "The NAME of a placement plug-in configured on the SC (never a module)"}
STRATEGY = {"anyOf": [{"enum": list(models.PLACEMENT_STRATEGIES)}, PLUGIN_NAME]}
SPU_ID = {"type": "integer", "minimum": 0, "maximum": 2**31 - 1}


def _object_schemas() -> dict[str, Any]:
    """Every object model and the models it uses, with refs into components."""
    schemas: dict[str, Any] = {}
    for model in (models.Spu, models.SpuGroup, models.Topic, models.Partition):
        schema = model.model_json_schema(by_alias=True, ref_template="#/components/schemas/{model}")
        schemas.update(schema.pop("$defs", {}))
        schemas[model.__name__] = schema
    # What the validators check beyond the field types, where JSON Schema can say it.
    schemas["PlacementSpec"]["properties"]["strategy"] = {**STRATEGY, "default": "computed"}
    return schemas


def _new_object(model: str, spec: Any, note: str) -> dict[str, Any]:
    return {
        "type": "object",
        "description": f"A new {model}: name and spec only (the SC writes the status). {note}".strip(),
        "properties": {"name": NAME, "spec": spec},
        "required": ["name", "spec"],
        "additionalProperties": False,
    }


def _new_topic_spec(topic_spec: dict[str, Any]) -> dict[str, Any]:
    """TopicSpec as a topic is created: computed (partitions and replicationFactor) or manual
    (replicaAssignment), not both: the model's own rule, which its JSON schema cannot say."""
    properties = topic_spec["properties"]

    def without_null(name: str) -> Any:
        options = [option for option in properties[name].get("anyOf", [properties[name]]) if option.get("type") != "null"]
        return options[0] if len(options) == 1 else {"anyOf": options}

    computed = {name: value for name, value in properties.items() if name != "replicaAssignment"}
    computed.update(partitions=without_null("partitions"), replicationFactor=without_null("replicationFactor"))
    manual = {"replicaAssignment": {**without_null("replicaAssignment"), "minItems": 1}, "ignoreRackAssignment": properties["ignoreRackAssignment"]}
    return {
        "oneOf": [
            {"type": "object", "properties": computed, "required": ["partitions", "replicationFactor"], "additionalProperties": False},
            {"type": "object", "properties": manual, "required": ["replicaAssignment"], "additionalProperties": False},
        ],
        "description": topic_spec.get("description", ""),
    }


_KIND = {
    "name": "kind",
    "in": "path",
    "required": True,
    "schema": {"type": "string", "enum": list(models.KINDS)},
}
_NAME = {"name": "name", "in": "path", "required": True, "schema": PATH_NAME}
_TOPIC_FILTER = {
    "name": "topic",
    "in": "query",
    "required": False,
    "description": "Only the partitions of this topic (partitions only; 422 for other kinds).",
    "schema": NAME,
}
_TIMEOUT = {
    "name": "timeout",
    "in": "query",
    "required": False,
    "description": "Milliseconds to wait for the controller's verdict (default 30000, at most 600000); "
    "0 answers at once with 202.",
    "schema": {"type": "integer", "minimum": 0, "maximum": 600000, "default": 30000},
}
_DRY_RUN = {
    "name": "dryRun",
    "in": "query",
    "required": False,
    "description": "Validate and answer the placement the topic would get now, writing nothing.",
    "schema": {"type": "boolean", "default": False},
}

_REBALANCE_DRY_RUN = {
    "name": "dryRun",
    "in": "query",
    "required": False,
    "description": "true: answer the plan only, writing nothing (the read role may ask); exactly true or false.",
    "schema": {"type": "boolean", "default": False},
}

_FORCE = {
    "name": "force",
    "in": "query",
    "required": False,
    "description": "Drain even if some partitions cannot move now: they keep this SPU as leader, the others move.",
    "schema": {"type": "boolean", "default": False},
}

_WARNINGS = {"type": "array", "items": {"type": "string"}}
_LIMIT = {
    "name": "limit",
    "in": "query",
    "required": False,
    "description": f"Page size: answer at most this many objects, in list order (1 to {listing.MAX_LIMIT}). Without it, "
    "every object in one answer. The X-Continue header of a page that is not the last resumes after it.",
    "schema": {"type": "integer", "minimum": 1, "maximum": listing.MAX_LIMIT},
}
_CONTINUE = {
    "name": "continue",
    "in": "query",
    "required": False,
    "description": "The X-Continue header of the previous page (needs limit; the same kind and topic filter). The "
    "next page starts after the last object of the previous one, as the store is now: an object present for "
    "the whole walk is listed exactly once; one created or deleted meanwhile may or may not be. A token this "
    "SC did not issue for this listing is 400.",
    "schema": {"type": "string", "minLength": 1, "maxLength": listing.MAX_TOKEN_LENGTH, "pattern": "^[A-Za-z0-9_-]+$"},
}
_LIST_HEADERS = {
    "X-Revision": {
        "description": "A store revision at which the kind held exactly these objects",
        "schema": {"type": "integer", "minimum": 0},
    },
    "X-Continue": {
        "description": "Present on a page that is not the last: pass it as continue for the next page",
        "schema": {"type": "string"},
    },
}


def _busy(what: str) -> dict[str, Any]:
    return {
        "description": f"TooManyRequests: {what}; retry after Retry-After seconds",
        "headers": {"Retry-After": {"description": "Seconds to wait before retrying", "schema": {"type": "integer", "minimum": 1}}},
        "content": {"application/json": {"schema": _ref("Error")}},
    }


_EXPENSIVE_BUSY = "every slot for expensive requests (max_expensive_requests) is taken and the queue is full or this request waited too long"

_COMMON_ERRORS = {
    "400": _error(
        "Malformed: the body is not JSON, not an object, a value has the wrong JSON type or a number is too "
        "long for any field, or a query parameter is not a value in its range"
    ),
    "503": _error("The KV store is unavailable (Unavailable) or the SC has not synced its store yet (NotSynced)"),
}


def _operation(
    summary: str,
    *,
    description: str | None = None,
    parameters: tuple[dict[str, Any], ...] = (),
    body: str | None = None,
    **responses: dict[str, Any],
) -> dict[str, Any]:
    """One operation; responses are given as r200=..., r404=... (keywords cannot start with a digit)."""
    operation: dict[str, Any] = {"summary": summary}
    if description is not None:
        operation["description"] = description
    if parameters:
        operation["parameters"] = list(parameters)
    if body is not None:
        operation["requestBody"] = {"required": True, "content": {"application/json": {"schema": _ref(body)}}}
    operation["responses"] = {code.removeprefix("r"): answer for code, answer in responses.items()}
    return operation


def _paths() -> dict[str, Any]:
    any_object = {"oneOf": [_ref(name) for name in KIND_SCHEMAS.values()]}
    unavailable, malformed = _COMMON_ERRORS["503"], _COMMON_ERRORS["400"]
    return {
        "/healthz": {
            "get": _operation(
                "200 once the SC has synced its store and knows its role (leader, or a standby behind another "
                "SC) and while it runs well; 503 with a reason while it starts (first in line, it waits for a "
                "previous leader's claim to end), while a task keeps failing, or while the leader may not write "
                "(its claim could not be renewed)",
                r200=_json(_ref("Health"), "Synced"),
                r503=_json(_ref("Health"), "Starting, failing or inactive"),
            )
        },
        **_ui_paths(),
        "/metrics": {
            "get": _operation(
                "Prometheus metrics of this SC",
                r200={
                    "description": "Prometheus text exposition format 0.0.4",
                    "content": {"text/plain": {"schema": {"type": "string"}}},
                },
            )
        },
        "/openapi.json": {"get": _operation("This document", r200=_json({"type": "object"}, "OpenAPI 3.1 document"))},
        "/v1/cluster": {
            "get": _operation(
                "The SCs of this store: this one and its role, the active SC, the standbys",
                description="The active SC (the leader) holds the store's claim (meta/active-sc, kept under a lease); "
                "its epoch is the claim's create revision, new with every holder, and fences every write of the "
                "leader. The standbys are the other SCs of the store (meta/sc-candidates/<id>), in the order they "
                "would take over. Read from this SC's mirror of the store.",
                r200=_json(_ref("Cluster"), "The SCs"),
            )
        },
        "/v1/cluster/rebalance": {
            "post": _optional_body(
                _operation(
                    "Plan a rebalance of the replicas over the SPUs; unless dryRun, store the plan and start it",
                    description="Plans from the cluster as this SC's mirror has it (racks, online SPUs, decommissioned "
                    "ones) with the fewest replica moves the balance allows. Unless dryRun=true, the plan is stored "
                    "(meta/rebalance, compare-and-swap: it survives an SC restart) and its moves start, at most "
                    "maxMovesPerSpu (the body's, else the setting rebalance_max_moves_per_spu) in flight on any SPU "
                    "a move changes. Each move is a reassignment (Kafka's KIP-455, docs/replication.md): new replicas "
                    "join as followers, leadership leaves a leaving replica once they are in the committed in-sync "
                    "set, then the leaving replicas go. 409 while a run is running or moves are still going back.",
                    parameters=(_REBALANCE_DRY_RUN,),
                    r200=_json(_ref("RebalancePlan"), "dryRun: the plan, nothing written"),
                    r202=_json(_ref("RebalancePlan"), "The plan, stored and started (state running, or done if it moves nothing)"),
                    r400=malformed,
                    r409=_error("RebalanceRunning, MovesInProgress, or the plan lost a compare-and-swap (Conflict)"),
                    r422=_error("InvalidRequest: maxMovesPerSpu out of range or an unknown field; CannotPlan; PlanTooLarge"),
                    r429=_busy(_EXPENSIVE_BUSY),
                    r503=unavailable,
                ),
                "RebalanceLimit",
            ),
            "get": _operation(
                "The stored rebalance run's progress",
                description="From the stored run and the partitions as this SC's mirror has them: idle without a "
                "run; state stays done after completion until the next plan.",
                r200=_json(_ref("RebalanceProgress"), "The run and its moves by progress"),
                r503=unavailable,
            ),
            "delete": _operation(
                "Cancel the running rebalance (or decommission): unfinished moves revert",
                description="Moves not started stay unstarted; moves in flight go back to the replicas they had "
                "(added replicas leave; leadership returns to a previous replica in the in-sync set); finished moves stay.",
                r200=_json(_ref("RebalanceCancelled"), "Cancelled"),
                r409=_error("NotRunning: nothing to cancel, or the run changed meanwhile (Conflict)"),
                r503=unavailable,
            ),
        },
        "/v1/{kind}": {
            "get": _operation(
                "List the objects of a kind (SPUs by id, partitions by topic and index, others by name)",
                description="Without limit, every object; identical lists at the same store state share one "
                "encoded answer. With limit, one page; its X-Continue header gives the next. Whole lists and "
                "pages are expensive requests: beyond the SC's slots and queue, 429 with Retry-After.",
                parameters=(_KIND, _TOPIC_FILTER, _LIMIT, _CONTINUE),
                r200={
                    **_json({"type": "array", "items": any_object}, "The objects (of the page, with limit)"),
                    "headers": _LIST_HEADERS,
                },
                r400=_error(
                    "topic is not a topic name, limit is not a whole number in range, or continue is not a token "
                    "this SC issued for this listing"
                ),
                r404=_error("Unknown kind"),
                r422=_error("topic given for a kind other than partitions; limit out of range; continue without limit"),
                r429=_busy(_EXPENSIVE_BUSY),
                r503=unavailable,
            )
        },
        "/v1/{kind}/{name}": {
            "get": _operation(
                "One object",
                parameters=(_KIND, _NAME),
                r200=_json(any_object, "The object"),
                r404=_error("Unknown kind, or no such object"),
                r503=unavailable,
            ),
            "delete": _operation(
                "Delete an object (compare-and-swap); a topic's partitions and a group's SPUs go with it",
                description="Partitions cannot be deleted on their own (422 PartitionOwnedByTopic). A managed SPU "
                "whose group exists cannot be deleted (409 ManagedSpu). Deleting an SPU that partitions "
                "still use is allowed; the answer's warnings name those partitions (for an SPU group, "
                "each of its SPUs that partitions still use).",
                parameters=(_KIND, _NAME),
                r200=_json(_ref("Deleted"), "Deleted"),
                r404=_error("Unknown kind, or no such object"),
                r409=_error("ManagedSpu, or the object kept changing (Conflict)"),
                r422=_error("PartitionOwnedByTopic"),
                r503=unavailable,
            ),
        },
        "/v1/spus": {
            "post": _operation(
                "Register a custom SPU",
                body="NewSpu",
                r201=_json(_ref("Spu"), "Registered (status Init)"),
                r400=malformed,
                r409=_error(
                    "AlreadyExists (the name, or a name an SPU group manages), or SpuIdInUse (naming the SPU "
                    "that has the id)"
                ),
                r422=_error("InvalidObject: a field's value is not acceptable (spuType must be Custom)"),
                r503=unavailable,
            )
        },
        "/v1/spus/{name}/drain": {
            "post": _operation(
                "Drain an SPU: move every leadership off it before it is stopped (an extension of API.md)",
                description="Kafka's controlled shutdown, kept like Kubernetes' cordon: the intent is stored "
                "in the SPU's spec (spec.drain) and lasts until it is cancelled (DELETE), across SPU "
                "reconnections and SC restarts; the SPU's status.drain says Draining or Drained, with a "
                "reason naming what cannot move. Each partition the SPU leads gets an in-sync follower "
                "that is online and not draining as leader. A drain that cannot finish (a partition with "
                "no such follower) is refused up front with 409 DrainRefused, changing nothing; with "
                "force=true it is recorded anyway and moves what can move. Waits at most ?timeout= "
                "milliseconds (and stops early once nothing has moved for 3 s): 200 when the SPU leads "
                "nothing, else 202 saying what moved, what it still leads and why; it stays draining.",
                parameters=(_NAME, _TIMEOUT, _FORCE),
                r200=_json(_ref("Drain"), "The SPU is drained: it leads nothing"),
                r202=_json(_ref("Drain"), "Draining, not drained: 'leading' and 'blocked' say what is left and why"),
                r400=malformed,
                r404=_error("No such SPU"),
                r409=_error(
                    "DrainRefused: some partition could not get another leader now; nothing was changed, "
                    "and the answer lists them with the reason of each in 'blocked'"
                ),
                r503=unavailable,
            ),
            "delete": _operation(
                "Cancel an SPU's drain (an extension of API.md)",
                description="Clears spec.drain: the SPU may lead again, and the partitions that prefer it "
                "return to it once it is in sync. Cancelling a drain that is not there changes nothing.",
                parameters=(_NAME,),
                r200=_json(_ref("Undrained"), "The SPU is not draining"),
                r404=_error("No such SPU"),
                r409=_error("The SPU kept changing (Conflict)"),
                r503=unavailable,
            ),
        },
        "/v1/spus/{name}/decommission": {
            "post": _optional_body(
                _operation(
                    "Decommission an SPU: move every replica off it, then it may be deleted with nothing lost",
                    description="Sets spec.decommission and stores a plan that moves every replica of the SPU to "
                    "others (respecting racks, the rest balanced), in one transaction; it runs like a rebalance "
                    "(GET /v1/cluster/rebalance for progress, DELETE to cancel). The SPU's status.decommission says "
                    "InProgress, then Done once no partition lists it. Later plans keep it empty.",
                    parameters=(_NAME, _REBALANCE_DRY_RUN),
                    r200=_json(_ref("RebalancePlan"), "dryRun: the plan, nothing written"),
                    r202=_json(_ref("RebalancePlan"), "The plan, stored and started, with the SPU's id and name"),
                    r400=malformed,
                    r404=_error("No such SPU"),
                    r409=_error("RebalanceRunning, MovesInProgress, or a compare-and-swap lost (Conflict)"),
                    r422=_error("InvalidRequest (maxMovesPerSpu); CannotPlan: no online SPU may take its replicas"),
                    r429=_busy(_EXPENSIVE_BUSY),
                    r503=unavailable,
                ),
                "RebalanceLimit",
            )
        },
        "/v1/spus/{name}/rack": {
            "post": _operation(
                "Give a custom SPU a rack, or take it away with null (an extension of API.md)",
                description="Compare-and-swap on the SPU's spec; the same rack again writes nothing. Topics "
                "waiting for racks (InvalidConfig because some online SPUs have one and others not) are "
                "then placed by their controller. A managed SPU has its group's rack (409 ManagedSpu).",
                parameters=(_NAME,),
                body="SpuRack",
                r200=_json(_ref("Spu"), "The SPU as written"),
                r400=malformed,
                r404=_error("No such SPU"),
                r409=_error("ManagedSpu, or the SPU kept changing (Conflict)"),
                r422=_error("InvalidRequest: the rack is not a label or a /path, or the body has other fields"),
                r503=unavailable,
            )
        },
        "/v1/spu-groups": {
            "post": _operation(
                "Create an SPU group; waits until it is Reserved or Invalid",
                parameters=(_TIMEOUT,),
                body="NewSpuGroup",
                r201=_json(_ref("SpuGroup"), "Reserved"),
                r202=_json(_ref("SpuGroup"), "Created, not decided within the timeout"),
                r400=malformed,
                r409=_error("AlreadyExists"),
                r422=_error("InvalidObject, or SpuGroupInvalid (the group is kept; the answer has it as object)"),
                r503=unavailable,
            )
        },
        "/v1/spu-groups/{name}/scale": {
            "post": _operation(
                "Set an SPU group's replica count (an extension of API.md)",
                description="Compare-and-swap on the group's spec; the SPU-group controller then creates SPUs "
                "(scale up) or deletes the highest ids (scale down). Answers at once with the group as "
                "written: a group that stays Reserved gets no new status to wait for. Like deleting an SPU, "
                "scaling down is allowed while partitions still use the SPUs it deletes; 'warnings' names "
                "each such SPU and its partitions.",
                parameters=(_NAME,),
                body="Scale",
                # The group's own fields and warnings in one object: an allOf of SpuGroup (which
                # allows no other field) and {warnings} could never validate.
                r202=_json(
                    {
                        "type": "object",
                        "properties": {
                            "name": {"type": "string"},
                            "spec": _ref("SpuGroupSpec"),
                            "status": _ref("SpuGroupStatus"),
                            "warnings": _WARNINGS,
                        },
                        "required": ["name", "spec", "warnings"],
                        "additionalProperties": False,
                    },
                    "The group with its new replica count, and warnings",
                ),
                r400=malformed,
                r404=_error("No such SPU group"),
                r409=_error("The group kept changing (Conflict)"),
                r422=_error("InvalidRequest: replicas out of range, or ids beyond the largest SPU id"),
                r503=unavailable,
            )
        },
        "/v1/topics": {
            "post": _operation(
                "Create a topic; waits until it is Provisioned or definitely not",
                description="201 Provisioned; 202 InsufficientResources (provisioned once enough SPUs are "
                "online) or not decided within the timeout; 422 InvalidConfig (checked before writing "
                "when possible; a topic the controller rejects later is kept, and the answer has it as "
                "object). With dryRun=true: 200 and the placement it would get, nothing written.",
                parameters=(_TIMEOUT, _DRY_RUN),
                body="NewTopic",
                r200=_json(_ref("PlacementResult"), "dryRun: the placement it would get"),
                r201=_json(_ref("Topic"), "Provisioned"),
                r202=_json(_ref("Topic"), "InsufficientResources, or not decided within the timeout"),
                r400=malformed,
                r409=_error("AlreadyExists, or deleted while waiting (Conflict)"),
                r422=_error(
                    "InvalidObject, InvalidConfig (for example a strategy that is neither built in nor a configured "
                    "plug-in), TopicTooLarge (it would not fit in one etcd request: the message names the limit and "
                    "the most partitions that fit), or (dryRun) InsufficientResources"
                ),
                r429=_busy("(dryRun) " + _EXPENSIVE_BUSY),
                r503=unavailable,
            )
        },
        "/v1/topics/{name}/partitions": {
            "post": _operation(
                "Add count partitions; existing partitions keep their replicas; waits like create",
                parameters=(_NAME, _TIMEOUT),
                body="AddPartitions",
                r200=_json(_ref("Topic"), "Every partition placed"),
                r202=_json(_ref("Topic"), "InsufficientResources, or not placed within the timeout"),
                r400=malformed,
                r404=_error("No such topic"),
                r409=_error("The topic kept changing (Conflict)"),
                r422=_error(
                    "InvalidRequest (count below 1 or above the partition limit), ManualTopic, InvalidConfig, "
                    "TopicTooLarge (as for a create)"
                ),
                r503=unavailable,
            )
        },
        "/v1/placement": {
            "post": _operation(
                "Compute a placement without creating anything (as `sc placement compute`)",
                description="spus defaults to the cluster's Online SPUs. Malformed fields are InvalidConfig, as "
                "for `sc placement compute`.",
                body="PlacementRequest",
                r200=_json(_ref("PlacementResult"), "The placement"),
                r400=malformed,
                r422=_error("InvalidConfig or InsufficientResources"),
                r429=_busy(_EXPENSIVE_BUSY),
                r503=unavailable,
            )
        },
        "/v1/watch/events": {
            "get": _operation(
                "Stream this SC's latest decisions, a SYNC marker, then each new decision",
                description="The decisions of this SC's controllers as they are applied (or refused by the store): "
                "elections with their cause, provisioning, status and spec changes, each with the reason a person "
                "reads. First the latest 500 (kept in memory, lost at a restart), then SYNC, then each new one; "
                "JSON lines or WebSocket messages and the same limits as the other watch streams (see "
                "/v1/watch/{kind} for the WebSocket subprotocols).",
                r200={
                    "description": "The event stream",
                    "content": {"application/x-ndjson": {"schema": _ref("DecisionEvent")}},
                },
                r429=_busy("the SC serves max_watchers watch streams, or max_watchers_per_address to this client"),
            )
        },
        "/v1/watch/{kind}": {
            "get": _operation(
                "Stream every object, a SYNC marker, then each change",
                description="JSON lines (application/x-ndjson), or one WebSocket text message per event when "
                f"the client asks for an upgrade; a WebSocket client offering the subprotocol {auth.WEBSOCKET_PROTOCOL} "
                "(the SC picks it) gets a message per batch of events instead, one JSON per line, each line ending "
                "with a newline. A client that cannot send an Authorization header (a browser) may offer its token "
                f"as the subprotocol {auth.WEBSOCKET_BEARER_PREFIX}<the token in base64url, unpadded> next to "
                f"{auth.WEBSOCKET_PROTOCOL}. Changes that arrive together may be coalesced into the "
                "latest state of each object. Every watcher gets the same events; one that has not taken "
                "watch_buffer_bytes of them, or takes nothing for client_stall_seconds, is dropped (the "
                "connection is reset) and should watch again. DELETED carries the last state sent; its "
                "revision is one at which the object is known absent.",
                parameters=(_KIND, _TOPIC_FILTER),
                r200={
                    "description": "The event stream",
                    "content": {"application/x-ndjson": {"schema": _ref("WatchEvent")}},
                },
                r400=_error("topic is not a topic name"),
                r404=_error("Unknown kind"),
                r422=_error("topic given for a kind other than partitions"),
                r429=_busy("the SC serves max_watchers watch streams, or max_watchers_per_address to this client"),
                r503=unavailable,
            )
        },
    }


def _optional_body(operation: dict[str, Any], schema: str) -> dict[str, Any]:
    """``operation`` with a request body that may be left out."""
    return {**operation, "requestBody": {"required": False, "content": {"application/json": {"schema": _ref(schema)}}}}


def _ui_paths() -> dict[str, Any]:
    """The live page's files: no credential needed, no cluster data in them (the page asks for a token)."""
    described = {
        "/ui": ("text/html", "The live cluster page (it reads the watch streams with the credential it is given)"),
        "/ui/app.js": ("text/javascript", "The live page's script"),
        "/ui/app.css": ("text/css", "The live page's style sheet"),
    }
    return {
        path: {
            "get": _operation(
                summary,
                r200={"description": "The file", "content": {content_type: {"schema": {"type": "string"}}}},
                r503=_error("The file is missing from the installed package"),
            )
        }
        for path, (content_type, summary) in described.items()
    }


def _one_integer(field: str, minimum: int, maximum: int, description: str) -> dict[str, Any]:
    return {
        "type": "object",
        "properties": {field: {"type": "integer", "minimum": minimum, "maximum": maximum, "description": description}},
        "required": [field],
        "additionalProperties": False,
    }


def _partition_and(field: str, schema: dict[str, Any]) -> dict[str, Any]:
    return {
        "type": "object",
        "properties": {"partition": {"type": "string"}, field: schema},
        "required": ["partition", field],
    }


def _extra_schemas(objects: dict[str, Any]) -> dict[str, Any]:
    spu_ids = {"type": "array", "items": SPU_ID}
    return {
        "NewSpu": _new_object("SPU", _ref("SpuSpec"), "spuType must be Custom (the default)."),
        "NewSpuGroup": _new_object("SPU group", _ref("SpuGroupSpec"), ""),
        "NewTopic": _new_object("topic", _new_topic_spec(objects["TopicSpec"]), ""),
        "AddPartitions": _one_integer("count", 1, models.MAX_PARTITIONS, "Partitions to add"),
        "Scale": _one_integer("replicas", 0, 10_000, "SPUs the group should have"),
        "SpuRack": {
            "type": "object",
            "properties": {
                "rack": {
                    "type": ["string", "null"],
                    "maxLength": models.MAX_RACK_LENGTH,
                    "description": (
                        "A label, or a path such as /dc1/r2 (multi-level racks), with no control, format or "
                        "line-separator character (Unicode Cc, Cf, Zl, Zp); null for no rack"
                    ),
                }
            },
            "required": ["rack"],
            "additionalProperties": False,
        },
        "Error": {
            "type": "object",
            "properties": {
                "error": {
                    "type": "object",
                    "properties": {"code": {"type": "string"}, "message": {"type": "string"}},
                    "required": ["code", "message"],
                },
                "object": {"description": "The object as the SC left it, when it was written but rejected"},
            },
            "required": ["error"],
        },
        "Health": {
            "type": "object",
            "properties": {"status": {"enum": ["ok", "starting", "failing", "inactive", "store-stopped"]}, "reason": {"type": "string"}},
            "required": ["status"],
        },
        "Drain": {
            "type": "object",
            "properties": {
                "spu": {"type": "integer"},
                "name": {"type": "string"},
                "draining": {"const": True},
                "drained": {"type": "boolean", "description": "It leads no partition"},
                "moved": {
                    "type": "array",
                    "description": "The leaderships this drain has moved so far, and where",
                    "items": _partition_and("to", {"type": "integer"}),
                },
                "leading": {"type": "array", "items": {"type": "string"}, "description": "What it still leads"},
                "blocked": {
                    "type": "array",
                    "description": "Each partition it still leads, and why",
                    "items": _partition_and("reason", {"type": "string"}),
                },
            },
            "required": ["spu", "name", "draining", "drained", "moved", "leading"],
        },
        "RebalanceLimit": {
            "type": "object",
            "properties": {
                "maxMovesPerSpu": {
                    "type": "integer", "minimum": 1, "maximum": 10_000,
                    "description": "Moves in flight at once on any SPU a move changes (default: the setting rebalance_max_moves_per_spu)",
                }
            },
            "additionalProperties": False,
        },
        "RebalancePlan": {
            "type": "object",
            "properties": {
                "replicaMoves": {"type": "integer", "description": "Replicas placed on an SPU that did not hold them"},
                "lowerBound": {"type": "integer", "description": "The sum over SPUs of their replicas above their target"},
                "leaderChanges": {"type": "integer"},
                "moves": {
                    "type": "array",
                    "items": {
                        "type": "object",
                        "properties": {
                            "partition": {"type": "string"},
                            "from": {"type": "array", "items": {"type": "integer"}},
                            "to": {"type": "array", "items": {"type": "integer"}},
                        },
                        "required": ["partition", "from", "to"],
                    },
                },
                "before": {"$ref": "#/components/schemas/RebalanceLoad"},
                "after": {"$ref": "#/components/schemas/RebalanceLoad"},
                "targets": {"type": "object"},
                "balanced": {"type": "boolean"},
                "unreachable": {"type": "array", "items": {"type": "object"}},
                "notes": {"type": "array", "items": {"type": "string"}},
                "state": {"enum": ["running", "done"], "description": "Not in a dry run's answer"},
                "maxMovesPerSpu": {"type": "integer", "description": "Not in a dry run's answer"},
            },
            "required": ["replicaMoves", "lowerBound", "moves", "before", "after"],
        },
        "RebalanceLoad": {
            "type": "object",
            "properties": {
                "replicasPerSpu": {"type": "object", "additionalProperties": {"type": "integer"}},
                "leadersPerSpu": {"type": "object", "additionalProperties": {"type": "integer"}},
            },
            "required": ["replicasPerSpu", "leadersPerSpu"],
        },
        "RebalanceProgress": {
            "type": "object",
            "properties": {
                "state": {"enum": ["idle", "running", "done", "cancelled"]},
                "kind": {"enum": ["rebalance", "decommission"]},
                "total": {"type": "integer"},
                "done": {"type": "integer"},
                "inFlight": {"type": "array", "items": {"type": "string"}, "description": "Partitions moving or going back"},
                "pending": {"type": "integer", "description": "Moves not started"},
                "skipped": {"type": "array", "items": {"type": "string"}, "description": "Partitions deleted or changed otherwise"},
                "problem": {"type": "string", "description": "Why the stored value under meta/rebalance is not a run (state idle)"},
            },
            "required": ["state", "total", "done", "inFlight"],
        },
        "RebalanceCancelled": {
            "type": "object",
            "properties": {"state": {"const": "cancelled"}, "kind": {"type": "string"}, "total": {"type": "integer"}},
            "required": ["state", "kind", "total"],
        },
        "Undrained": {
            "type": "object",
            "properties": {"spu": {"type": "integer"}, "name": {"type": "string"}, "draining": {"const": False}},
            "required": ["spu", "name", "draining"],
        },
        "Deleted": {
            "type": "object",
            "properties": {"deleted": {"type": "object"}, "warnings": _WARNINGS},
            "required": ["deleted", "warnings"],
        },
        "WatchEvent": {
            "type": "object",
            "properties": {
                "type": {"enum": ["ADDED", "MODIFIED", "DELETED", "SYNC"]},
                "revision": {"type": "integer"},
                "object": {"description": "The object (null for SYNC)"},
            },
            "required": ["type", "revision", "object"],
        },
        "Cluster": {
            "type": "object",
            "properties": {
                "self": {
                    "type": "object",
                    "properties": {
                        "id": {"type": ["string", "null"], "description": "This SC's id (null before it joined the store's SCs)"},
                        "role": {"enum": ["leader", "standby"], "description": "leader: it holds the claim and may write"},
                        "address": {"type": ["string", "null"], "description": "Its public host:port"},
                    },
                    "required": ["id", "role", "address"],
                    "additionalProperties": False,
                },
                "leader": {
                    "description": "The active SC (null while no SC holds the claim)",
                    "anyOf": [
                        {"type": "null"},
                        {
                            "type": "object",
                            "properties": {
                                "id": {"type": ["string", "null"], "description": "null if the claim holds a value no SC of this project wrote"},
                                "address": {"type": ["string", "null"], "description": "Its public host:port"},
                                "since": {"type": ["string", "null"], "description": "When it claimed the store (ISO 8601, UTC)"},
                                "epoch": {"type": "integer", "description": "The claim's store revision: new with every holder"},
                            },
                            "required": ["id", "address", "since", "epoch"],
                            "additionalProperties": False,
                        },
                    ],
                },
                "standbys": {
                    "type": "array",
                    "description": "The other SCs of the store, first in line to take over first",
                    "items": {
                        "type": "object",
                        "properties": {"id": {"type": "string"}, "address": {"type": "string"}},
                        "required": ["id", "address"],
                    },
                },
            },
            "required": ["self", "leader", "standbys"],
            "additionalProperties": False,
        },
        "DecisionEvent": {
            "type": "object",
            "properties": {
                "type": {"enum": ["ADDED", "SYNC"]},
                "revision": {"type": "integer", "description": "The store revision the decision committed at (0 if refused)"},
                "object": {
                    "description": "The decision (null for SYNC)",
                    "anyOf": [
                        {"type": "null"},
                        {
                            "type": "object",
                            "properties": {
                                "time": {"type": "number", "description": "When it was applied, seconds since the epoch (UTC)"},
                                "kind": {"type": "string"},
                                "name": {"type": "string"},
                                "verb": {"type": "string", "description": "create, create-partitions, update-status, update-spec, delete, provision or elect"},
                                "cause": {"type": "string", "description": "For an election: spu-offline, preferred-leader, drain, unclean or reassignment; for a replica move's other writes move-started, move-adding, move-caught-up, move-completed, move-cancelled or move-reverted; else empty"},
                                "reason": {"type": "string", "description": "Why, for people (scripts must not parse it)"},
                                "outcome": {"enum": ["applied", "failed"]},
                                "revision": {"type": "integer"},
                                "detail": {"type": "string"},
                            },
                            "required": ["time", "kind", "name", "verb", "cause", "reason", "outcome", "revision", "detail"],
                        },
                    ],
                },
            },
            "required": ["type", "revision", "object"],
        },
        "PlacementRequest": {
            "type": "object",
            "description": "As for `sc placement compute`; without spus, the cluster's Online SPUs.",
            "properties": {
                "spus": {
                    "type": "array",
                    "items": {
                        "type": "object",
                        "properties": {
                            "id": SPU_ID,
                            "rack": {"anyOf": [{"type": "string", "minLength": 1, "pattern": r"\S"}, {"type": "null"}]},
                            "online": {"type": "boolean"},
                        },
                        "required": ["id"],
                        "additionalProperties": False,
                    },
                },
                "partitions": {"type": "integer", "minimum": 0, "maximum": models.MAX_PARTITIONS},
                "replicationFactor": {"type": "integer", "minimum": 0, "maximum": models.MAX_REPLICATION_FACTOR},
                "strategy": {"anyOf": [*STRATEGY["anyOf"], {"const": "manual"}]},
                "plugin": {
                    **PLUGIN_NAME,
                    "description": "A configured plug-in asked before a built-in strategy, which runs if it defers",
                },
                "startIndex": {"type": "integer", "minimum": 0, "maximum": placement.MAX_START_INDEX},
                "ignoreRackAssignment": {"type": "boolean"},
                "policies": {"type": "string", "maxLength": models.MAX_POLICIES_LENGTH},
                "existing": {
                    "type": "array",
                    "items": {
                        "type": "object",
                        "properties": {"topic": {"type": "string"}, "partition": {"type": "integer", "minimum": 0}, "replicas": spu_ids},
                        "required": ["topic", "partition", "replicas"],
                        "additionalProperties": False,
                    },
                },
                "replicaAssignment": {"type": "array", "items": _ref("PartitionAssignment"), "maxItems": models.MAX_PARTITIONS},
                "currentReplicaMap": {"type": "array", "items": spu_ids},
                "registeredSpuIds": spu_ids,
            },
            "additionalProperties": False,
        },
        "PlacementResult": {
            "type": "object",
            "properties": {
                "replicaMap": {"type": "array", "items": {"type": "array", "items": {"type": "integer"}}},
                "nextStartIndex": {"type": "integer"},
                "balance": {"type": "object"},
            },
            "required": ["replicaMap", "nextStartIndex"],
        },
    }


# Answered to any operation but /healthz when the SC has credentials configured (controller/api/auth.py).
_AUTH_ERRORS = {
    "401": _error(
        "Unauthenticated: credentials are configured and the request has none, or an unknown token, or a "
        "client certificate mapped to no role (WWW-Authenticate: Bearer)"
    ),
    "403": _error("Forbidden: the credential's role lacks the right this request needs (the message names it)"),
}
# Either credential; none at all when the SC has none configured (it then listens on loopback only).
_SECURITY: list[dict[str, list[str]]] = [{}, {"bearerToken": []}, {"clientCertificate": []}]
_SECURITY_SCHEMES = {
    "bearerToken": {
        "type": "http", "scheme": "bearer",
        "description": "A token of the SC's --auth-tokens file (lines NAME ROLE TOKEN; roles read, admin, admin:PREFIX)",
    },
    "clientCertificate": {
        "type": "mutualTLS",
        "description": "A client certificate signed by --tls-client-ca whose CN the --auth-tokens file maps (NAME ROLE cert:CN)",
    },
}


def _secured(paths: dict[str, Any]) -> dict[str, Any]:
    """Every operation but /healthz: the credentials it takes, and its 401 and 403 answers."""
    for path, methods in paths.items():
        if path in auth.UNAUTHENTICATED_PATHS:
            methods["get"]["security"] = [{}]
            continue
        for operation in methods.values():
            operation["security"] = _SECURITY
            operation["responses"] = {**operation["responses"], **_AUTH_ERRORS}
    return paths


_STANDBY_REDIRECT = {
    "description": "NotLeader: this SC is a standby; the same request (method, body, credentials) goes to the "
    "leader at Location (same path and query). The sc CLI follows it",
    "headers": {"Location": {"description": "The leader's URL for this request", "schema": {"type": "string"}}},
    "content": {"application/json": {"schema": _ref("Error")}},
}


def _standby_answers(paths: dict[str, Any]) -> dict[str, Any]:
    """Every write (an operation that takes the admin right): a standby's 307 to the leader, and its
    503 NoLeader while no SC leads the store."""
    for path, methods in paths.items():
        for method, operation in methods.items():
            right = auth.http_right(method.upper(), path, dry_run=False)
            if right is None or right.role != auth.ADMIN:
                continue
            responses = operation["responses"]
            unavailable = responses.get("503", _COMMON_ERRORS["503"])
            responses["307"] = _STANDBY_REDIRECT
            responses["503"] = {
                **unavailable,
                "description": f"{unavailable['description']}; NoLeader: this SC is a standby and no SC leads the store "
                "right now (retry in a few seconds)",
            }
    return paths


def document() -> dict[str, Any]:
    objects = _object_schemas()
    return {
        "openapi": "3.1.0",
        "info": {
            "title": "Streaming Controller public API",
            "version": "1",
            "description": "The SC's HTTP API on the public port (default 9003); see API.md. Errors are "
            '{"error": {"code", "message"}}; 400 malformed, 404 absent, 409 exists or conflict, '
            "422 well-formed but invalid, 401 no or bad credentials and 403 a right the credential's role lacks "
            "(when credentials are configured: read may GET, watch and compute placements and dry runs; admin may "
            "do everything), 429 too many expensive requests or watchers (with Retry-After), 503 "
            "store unavailable or not synced; a standby SC answers every write with 307 to the leader; a request body is refused with 413 above 16 MiB (a topic create or dry run: "
            "above twice etcd_max_request_bytes and 64 KiB, or holding more than etcd_max_request_bytes and 64 KiB besides "
            "whitespace, as a topic is one etcd request), or 64 KiB "
            "where it is a few fields (every POST but topic creates and placements; before it is read when its "
            "Content-Length says so), 408 when it pauses longer than client_body_timeout, 503 (Busy) when "
            "max_buffered_request_bytes are being received already. An integer is a JSON number written without a "
            "fraction or exponent (1.0 is malformed), of at most 20 digits.",
        },
        "paths": _secured(_standby_answers(_paths())),
        "components": {"schemas": {**objects, **_extra_schemas(objects)}, "securitySchemes": _SECURITY_SCHEMES},
    }


def main() -> None:
    sys.stdout.write(json.dumps(document(), indent=2) + "\n")


if __name__ == "__main__":
    main()

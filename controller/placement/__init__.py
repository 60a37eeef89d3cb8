"""Replica placement: every strategy of the seeds, purely computational, no I/O.

Callers import the package and use the names below (`placement.compute(request)`); the
strategies live one per module (computed, kafka, least_loaded, multilevel, policies,
manual, plugins) behind `engine.compute`. Only `cli` reads or writes anything, and nothing here
imports a module by name: plug-ins arrive as objects (`compute(request, placers)`).
"""

from controller.placement.report import balance, rack_violations
from controller.placement.codec import error_to_json, request_from_json, result_to_json
from controller.placement.engine import check_strategy, compute
from controller.placement.manual import validate_manual
from controller.placement.model import (
    STRATEGIES,
    ExistingPartition,
    Fix,
    InsufficientResources,
    InvalidConfig,
    ManualPartition,
    PlacementError,
    PlacementRequest,
    PlacementResult,
    SpuInfo,
    format_ids,
)
from controller.placement.plugins import ClusterView, PlacementSpec, Placers, ReplicaPlacer
from controller.placement.policies import Policies, compact_policies, parse_policies

__all__ = [
    "STRATEGIES",
    "ClusterView",
    "ExistingPartition",
    "Fix",
    "InsufficientResources",
    "InvalidConfig",
    "ManualPartition",
    "PlacementError",
    "PlacementRequest",
    "PlacementResult",
    "PlacementSpec",
    "Placers",
    "Policies",
    "ReplicaPlacer",
    "SpuInfo",
    "balance",
    "check_strategy",
    "compact_policies",
    "compute",
    "error_to_json",
    "format_ids",
    "parse_policies",
    "rack_violations",
    "request_from_json",
    "result_to_json",
    "validate_manual",
]

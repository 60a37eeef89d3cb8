"""Replica placement: every strategy of the seeds, purely computational, no I/O.

Callers import the package and use the names below (`placement.compute(request)`); the
strategies live one per module (computed, kafka, least_loaded, multilevel, policies,
manual, plugins) behind `engine.compute`; the rebalance planner (`planner`, with its
vocabulary in `rebalance`) moves replicas of existing partitions. Only `cli` reads or writes
anything, and nothing here imports a module by name: plug-ins arrive as objects
(`compute(request, placers)`).
"""

from controller.placement.report import balance, rack_violations
from controller.placement.codec import (
    error_to_json,
    plan_to_json,
    rebalance_request_from_json,
    request_from_json,
    result_to_json,
)
from controller.placement.engine import check_strategy, compute
from controller.placement.manual import validate_manual
from controller.placement.model import (
    CACHED_SPUS_LIMIT,
    MAX_START_INDEX,
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
from controller.placement.planner import plan as plan_rebalance
from controller.placement.plugins import ClusterView, PlacementSpec, Placers, ReplicaPlacer
from controller.placement.policies import Policies, compact_policies, parse_policies
from controller.placement.rebalance import (
    Load,
    Move,
    PartitionReplicas,
    RebalancePlan,
    RebalanceRequest,
    Shortfall,
    Targets,
)

__all__ = [
    "CACHED_SPUS_LIMIT",
    "MAX_START_INDEX",
    "STRATEGIES",
    "ClusterView",
    "ExistingPartition",
    "Fix",
    "InsufficientResources",
    "InvalidConfig",
    "Load",
    "ManualPartition",
    "Move",
    "PartitionReplicas",
    "PlacementError",
    "PlacementRequest",
    "PlacementResult",
    "PlacementSpec",
    "Placers",
    "Policies",
    "RebalancePlan",
    "RebalanceRequest",
    "ReplicaPlacer",
    "Shortfall",
    "SpuInfo",
    "Targets",
    "balance",
    "check_strategy",
    "compact_policies",
    "compute",
    "error_to_json",
    "format_ids",
    "parse_policies",
    "rack_violations",
    "plan_rebalance",
    "plan_to_json",
    "rebalance_request_from_json",
    "request_from_json",
    "result_to_json",
    "validate_manual",
]

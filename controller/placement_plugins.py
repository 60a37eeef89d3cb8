"""Loads the operator's placement plug-ins once, when the daemon starts: the only code of the SC that
imports a module by name. A topic never chooses what is imported: it names a plug-in loaded here.
"""

from __future__ import annotations

import importlib
import importlib.metadata
from collections.abc import Callable, Iterable, Mapping

from controller import placement
from store import models

# Installed packages may declare plug-ins here (`[project.entry-points."streaming_controller.placement"]`,
# NAME = "module:Class"); they are loaded only with placement_entry_points.
ENTRY_POINT_GROUP = "streaming_controller.placement"


class PluginError(Exception):
    """A plug-in that cannot be loaded, in one line naming it; `sc run` stops with status 2."""


def parse_references(items: Iterable[str]) -> dict[str, str]:
    """``NAME=module:Class`` items (flags, or the comma-separated variable) as NAME -> module:Class.

    Raises ValueError naming the item that is not of that form, or a name given twice."""
    references: dict[str, str] = {}
    for item in items:
        name, equals, reference = str(item).partition("=")
        name, reference = name.strip(), reference.strip()
        if not equals or not name or not reference:
            raise ValueError(f"placement plug-in {item!r} is not NAME=module:Class")
        if name in references:
            raise ValueError(f"placement plug-in {name!r} is given twice ({references[name]} and {reference})")
        references[name] = reference
    return references


def load(references: Mapping[str, str], entry_points: bool = False) -> dict[str, placement.ReplicaPlacer]:
    """Import and create every configured plug-in (NAME -> module:Class), and with `entry_points`
    every one installed packages declare in ENTRY_POINT_GROUP; the placers by name."""
    sources: dict[str, tuple[str, Callable[[], object]]] = {}
    for name, reference in sorted(references.items()):
        _check_name(name, reference)
        sources[name] = (reference, _importer(name, reference))
    if entry_points:
        for entry_point in sorted(importlib.metadata.entry_points(group=ENTRY_POINT_GROUP), key=lambda entry: entry.name):
            shown = f"{entry_point.value}, entry point of {_distribution(entry_point)}"
            _check_name(entry_point.name, shown)
            if entry_point.name in sources:
                raise PluginError(
                    f"placement plug-in {entry_point.name!r} is given twice: as {sources[entry_point.name][0]} and "
                    f"as {shown}; configure one name once"
                )
            sources[entry_point.name] = (shown, _entry_point_loader(entry_point, shown))
    return {name: _create(name, shown, load_class) for name, (shown, load_class) in sources.items()}


def _check_name(name: str, shown: str) -> None:
    try:
        models.validate_plugin_name(name)
    except ValueError as error:
        raise PluginError(f"placement plug-in {name!r} ({shown}): {error}") from None


def _distribution(entry_point: importlib.metadata.EntryPoint) -> str:
    distribution = entry_point.dist
    return "an unknown package" if distribution is None else f"package {distribution.name!r}"


def _importer(name: str, reference: str) -> Callable[[], object]:
    def load_class() -> object:
        if not models.is_module_reference(reference):
            raise PluginError(f"placement plug-in {name!r}: {reference!r} is not written module:Class")
        module_name, _, class_name = reference.partition(":")
        try:
            module = importlib.import_module(module_name)
        except ImportError as error:
            raise PluginError(f"placement plug-in {name!r} ({reference}): cannot import {module_name!r}: {error}") from None
        except (Exception, SystemExit) as error:  # the module's own code failed while importing
            raise PluginError(
                f"placement plug-in {name!r} ({reference}): importing {module_name!r} failed: "
                f"{type(error).__name__}: {error}"
            ) from None
        found = getattr(module, class_name, None)
        if found is None:
            raise PluginError(f"placement plug-in {name!r} ({reference}): module {module_name!r} has no {class_name!r}")
        return found

    return load_class


def _entry_point_loader(entry_point: importlib.metadata.EntryPoint, shown: str) -> Callable[[], object]:
    def load_class() -> object:
        try:
            return entry_point.load()
        except (Exception, SystemExit) as error:
            raise PluginError(
                f"placement plug-in {entry_point.name!r} ({shown}) cannot be loaded: {type(error).__name__}: {error}"
            ) from None

    return load_class


def _create(name: str, shown: str, load_class: Callable[[], object]) -> placement.ReplicaPlacer:
    placer_class = load_class()
    if not callable(placer_class):
        raise PluginError(f"placement plug-in {name!r} ({shown}) is {type(placer_class).__name__}, not a class")
    try:
        placer = placer_class()
    except (Exception, SystemExit) as error:
        raise PluginError(
            f"placement plug-in {name!r} ({shown}) could not be created: {type(error).__name__}: {error}"
        ) from None
    if not isinstance(placer, placement.ReplicaPlacer):
        raise PluginError(f"placement plug-in {name!r} ({shown}) has no place(spec, cluster, spu_ids) method")
    return placer

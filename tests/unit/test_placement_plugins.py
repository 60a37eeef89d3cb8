"""The plug-in loader and its settings: what the operator configures is imported once, each failure
is one line naming the plug-in, and installed entry points load only when the operator asks."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from controller import config, placement_plugins
from tests import placement_plugins as examples

HERE = "tests.placement_plugins"


def test_configured_plugins_are_created_by_name() -> None:
    placers = placement_plugins.load({"highest-first": f"{HERE}:HighestFirst", "defers": f"{HERE}:Defers"})
    assert sorted(placers) == ["defers", "highest-first"]
    assert isinstance(placers["highest-first"], examples.HighestFirst)
    assert isinstance(placers["defers"], examples.Defers)
    assert placement_plugins.load({}) == {}


@pytest.mark.parametrize(
    ("references", "message"),
    [
        ({"gone": "tests.no_such_module:Placer"}, "placement plug-in 'gone' (tests.no_such_module:Placer): cannot import 'tests.no_such_module': No module named 'tests.no_such_module'"),
        ({"missing": f"{HERE}:Missing"}, f"placement plug-in 'missing' ({HERE}:Missing): module '{HERE}' has no 'Missing'"),
        ({"broken": f"{HERE}:BrokenAtStart"}, f"placement plug-in 'broken' ({HERE}:BrokenAtStart) could not be created: RuntimeError: no licence file"),
        ({"empty": f"{HERE}:NoPlaceMethod"}, f"placement plug-in 'empty' ({HERE}:NoPlaceMethod) has no place(spec, cluster, spu_ids) method"),
        ({"constant": f"{HERE}:HERE_IS_NOT_A_CLASS"}, f"placement plug-in 'constant' ({HERE}:HERE_IS_NOT_A_CLASS) is str, not a class"),
        ({"nocolon": "tests.placement_plugins"}, "placement plug-in 'nocolon': 'tests.placement_plugins' is not written module:Class"),
        ({"kafka": f"{HERE}:HighestFirst"}, f"placement plug-in 'kafka' ({HERE}:HighestFirst): placement plug-in name 'kafka' is the name of a built-in strategy: choose another"),
        ({"Bad_Name": f"{HERE}:HighestFirst"}, f"placement plug-in 'Bad_Name' ({HERE}:HighestFirst): placement plug-in name 'Bad_Name' is invalid: use only lowercase letters, digits and '-', and do not start or end with '-'"),
    ],
)  # fmt: skip
def test_each_failure_is_one_line_naming_the_plugin(references: dict[str, str], message: str) -> None:
    with pytest.raises(placement_plugins.PluginError) as raised:
        placement_plugins.load(references)
    assert str(raised.value) == message


def test_a_module_failing_while_it_is_imported_is_reported_not_raised(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "exploding_placer.py").write_text("raise SystemExit('bye')\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(placement_plugins.PluginError) as raised:
        placement_plugins.load({"boom": "exploding_placer:Placer"})
    assert str(raised.value) == "placement plug-in 'boom' (exploding_placer:Placer): importing 'exploding_placer' failed: SystemExit: bye"


def installed_package(root: Path, entry_points: str) -> None:
    """A distribution on sys.path declaring entry points, as `pip install` of a plug-in package leaves it."""
    info = root / "zoned_placers-1.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: zoned-placers\nVersion: 1.0\n")
    (info / "entry_points.txt").write_text(f"[{placement_plugins.ENTRY_POINT_GROUP}]\n{entry_points}")


def test_entry_points_load_only_when_asked(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    installed_package(tmp_path, f"highest-first = {HERE}:HighestFirst\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    assert placement_plugins.load({}) == {}
    placers = placement_plugins.load({"defers": f"{HERE}:Defers"}, entry_points=True)
    assert sorted(placers) == ["defers", "highest-first"]
    assert isinstance(placers["highest-first"], examples.HighestFirst)


def test_an_entry_point_may_not_take_a_configured_name(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    installed_package(tmp_path, f"defers = {HERE}:HighestFirst\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(placement_plugins.PluginError) as raised:
        placement_plugins.load({"defers": f"{HERE}:Defers"}, entry_points=True)
    assert str(raised.value) == (
        f"placement plug-in 'defers' is given twice: as {HERE}:Defers and as {HERE}:HighestFirst, entry point of "
        "package 'zoned-placers'; configure one name once"
    )


def test_a_broken_entry_point_names_its_package(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    installed_package(tmp_path, "zoned = zoned_placers_missing:Zoned\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(placement_plugins.PluginError) as raised:
        placement_plugins.load({}, entry_points=True)
    assert str(raised.value) == (
        "placement plug-in 'zoned' (zoned_placers_missing:Zoned, entry point of package 'zoned-placers') cannot be "
        "loaded: ModuleNotFoundError: No module named 'zoned_placers_missing'"
    )
    assert "zoned_placers_missing" not in sys.modules


# ---------------------------------------------------------------------------- settings


def test_the_setting_from_flags_the_variable_and_the_file(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("SC_PLACEMENT_PLUGINS", f" zoned={HERE}:HighestFirst , defers={HERE}:Defers")
    assert config.load().placement_plugins == {"zoned": f"{HERE}:HighestFirst", "defers": f"{HERE}:Defers"}
    # A flag replaces the variable's whole list (flags over environment, as for every setting).
    assert config.load(placement_plugins=[f"only={HERE}:Defers"]).placement_plugins == {"only": f"{HERE}:Defers"}
    monkeypatch.delenv("SC_PLACEMENT_PLUGINS")
    config_file = tmp_path / "sc.toml"
    config_file.write_text(f'placement_entry_points = true\n[placement_plugins]\nzoned = "{HERE}:HighestFirst"\n')
    settings = config.load(config_file)
    assert (settings.placement_plugins, settings.placement_entry_points) == ({"zoned": f"{HERE}:HighestFirst"}, True)
    assert (config.Settings().placement_plugins, config.Settings().placement_entry_points) == ({}, False)


@pytest.mark.parametrize(
    ("value", "message"),
    [
        (["zoned"], "placement plug-in 'zoned' is not NAME=module:Class"),
        ([f"zoned={HERE}:A", f"zoned={HERE}:B"], f"placement plug-in 'zoned' is given twice ({HERE}:A and {HERE}:B)"),
        ([f"policies={HERE}:A"], "placement plug-in name 'policies' is the name of a built-in strategy: choose another"),
        (["zoned=my_pkg.Zoned"], "placement plug-in 'zoned': 'my_pkg.Zoned' is not written module:Class"),
    ],
)
def test_bad_plugin_settings_name_the_item(value: list[str], message: str) -> None:
    with pytest.raises(config.ConfigError) as raised:
        config.load(placement_plugins=value)
    assert message in str(raised.value)

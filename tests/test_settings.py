"""One settings table (libshare/settings.py): the environment, the flags, the configuration file and
docs/configuration.md are all read from or checked against it."""

from __future__ import annotations

import argparse
import ast
import re
import subprocess
import sys

import pytest

import libshare
from libshare import settings
from libshare.daemon import config_file
from libshare.daemon.options import add_arguments, flag_default
from libshare.errors import InvalidSubmission
from libshare.settings import SETTINGS, TABLE

from tests.conftest import ROOT

_VARIABLE = re.compile(r"\bLIBSHARE_[A-Z][A-Z0-9_]*[A-Z0-9]\b")
_SCALARS = (bool, int, float, str)


def _sources():
    for path in sorted((ROOT / "libshare").rglob("*.py")):
        if "_stubs" in path.parts and path.name != "__init__.py":
            continue  # generated gRPC code
        yield path


def test_the_docs_table_is_the_generated_one():
    text = (ROOT / "docs" / "configuration.md").read_text()
    assert settings.update_markdown(text) == text, \
        "docs/configuration.md's settings table is stale: run .venv/bin/python tools/settings_table.py"


def test_the_table_is_well_formed():
    assert len(SETTINGS) == len(TABLE), "two rows share a name"
    variables = [s.env for s in TABLE if s.env]
    flags = [s.flag for s in TABLE if s.flag]
    keys = [s.file_key for s in TABLE if s.file_key]
    for names in (variables, flags, keys):
        assert len(set(names)) == len(names), f"a name appears twice: {names}"
    for s in TABLE:
        assert s.meaning and s.who in ("arbiter", "client", "client, arbiter", "slurm", "k8s", "testing",
                                       "internal"), s.name
        assert s.env is None or _VARIABLE.fullmatch(s.env), s.name
        assert s.file_key is None or s.file_kinds, f"{s.name}: a file key needs its TOML types"
        if isinstance(s.default, _SCALARS) and s.default is not settings.FITS:
            assert s.parse(s.default) == s.default, f"{s.name}'s default does not pass its own check"


def test_every_libshare_variable_in_libshare_is_in_the_table():
    """Every LIBSHARE_* name a module of libshare/ reads, writes for a child or mentions is a row's."""
    known = {s.env for s in TABLE if s.env}
    found = {}
    for path in _sources():
        for name in _VARIABLE.findall(path.read_text()):
            found.setdefault(name, path.relative_to(ROOT))
    unknown = {name: str(path) for name, path in found.items() if name not in known}
    assert unknown == {}, f"LIBSHARE_* variables that are not in libshare/settings.py's table: {unknown}"


def _environment_reads(tree: ast.AST) -> list[int]:
    """Lines that read ``os.environ`` or ``os.getenv`` with a LIBSHARE_* name."""
    lines = []
    for node in ast.walk(tree):
        text = ast.unparse(node) if isinstance(node, (ast.Call, ast.Subscript, ast.Compare)) else ""
        if ("environ" in text or "getenv" in text) and _VARIABLE.search(text):
            lines.append(node.lineno)
    return lines


def test_only_the_settings_table_reads_libshare_variables():
    """Settings are read through libshare/settings.py, never from os.environ directly."""
    readers = {}
    for path in _sources():
        if path == ROOT / "libshare" / "settings.py":
            continue
        lines = _environment_reads(ast.parse(path.read_text()))
        if lines:
            readers[str(path.relative_to(ROOT))] = sorted(set(lines))
    assert readers == {}, f"modules that read LIBSHARE_* from the environment themselves: {readers}"


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    return parser


def test_the_flags_and_their_defaults_are_the_tables():
    actions = {option: action for action in _parser()._actions for option in action.option_strings
               if option not in ("-h", "--help")}
    assert sorted(actions) == sorted(s.flag for s in TABLE if s.flag)
    for s in TABLE:
        if s.flag is None:
            continue
        action = actions[s.flag]
        if s.switch:
            assert isinstance(action, argparse._StoreTrueAction), s.flag
            assert action.default is False
            assert s.flag == (f"--no-{s.name}" if s.default else "--" + s.name.replace("_", "-")), s.flag
        else:
            assert action.dest == s.name and action.default == flag_default(s), s.flag
            expected = None if s.env or s.file_key else s.default
            assert action.default == expected, s.flag
        if s.who == "internal":
            assert action.help == argparse.SUPPRESS, s.flag
        elif s.env:
            assert s.env in action.help, f"{s.flag}'s help does not name {s.env}"
    parsed = _parser().parse_args([])
    assert parsed.metrics_port == SETTINGS["metrics_port"].default
    assert parsed.shutdown_timeout == SETTINGS["shutdown_timeout"].default
    assert parsed.metrics_address == SETTINGS["metrics_address"].default


def test_a_flag_is_checked_by_its_row():
    parser = _parser()
    assert parser.parse_args(["--max-clients", "4096"]).max_clients == 4096
    for flag, bad in (("--max-clients", "4097"), ("--max-clients", "0"), ("--metrics-port", "70000")):
        with pytest.raises(SystemExit):
            parser.parse_args([flag, bad])


def test_the_config_files_keys_are_the_tables():
    from libshare.arbiter.serve import config as applied

    rows = [s for s in TABLE if s.file_key]
    assert list(config_file.DEFAULTS) == [s.file_key for s in rows]
    assert list(applied.DEFAULTS) == list(config_file.DEFAULTS), "a key of [defaults] is read but not applied"
    assert list(applied.GROUP) == list(config_file.GROUP)
    for s in rows:
        key = config_file.DEFAULTS[s.file_key]
        assert key.parse is (s.file_parse or s.parse) and key.kinds == s.file_kinds, s.name
        assert key.size == s.size, s.name


def test_the_config_file_checks_a_key_as_the_environment_does():
    for name, good, bad in (("watchdog_seconds", 30, 86401), ("max_clients", 8, 5000),
                            ("active_thread_percentage", 40, 150), ("priority", "high", "urgent")):
        key = SETTINGS[name].file_key
        assert config_file.parse(f"[defaults]\n{key} = {good!r}\n".replace("'", '"'))[("", key)] == \
            settings.value(name, str(good))
        with pytest.raises(InvalidSubmission):
            config_file.parse(f"[defaults]\n{key} = {bad!r}\n".replace("'", '"'))
        refused = InvalidSubmission if SETTINGS[name].env else ValueError  # an argument is a ValueError
        with pytest.raises(refused, match=SETTINGS[name].env or name):
            settings.value(name, env={SETTINGS[name].env: str(bad)} if SETTINGS[name].env else None,
                           override=None if SETTINGS[name].env else str(bad))


def test_a_value_comes_from_the_argument_then_the_environment_then_the_default():
    env = {"LIBSHARE_MAX_PROGRAMS": "8"}
    assert settings.value("max_programs", 16, env=env) == 16
    assert settings.value("max_programs", env=env) == 8
    assert settings.value("max_programs", env={}) == 256
    assert settings.value("max_programs", env={"LIBSHARE_MAX_PROGRAMS": "  "}) == 256  # blank is unset
    assert settings.configured("max_programs", env={}) is None
    assert settings.value("device_mem_total", env={}) is settings.FITS
    assert settings.value("device_mem_total", env={"LIBSHARE_DEVICE_MEM_TOTAL": "unlimited"}) is None
    assert settings.value("device_mem_limit", env={"LIBSHARE_DEVICE_MEM_LIMIT": "0=1G,AB-CD=512M"}) == \
        {"0": 1 << 30, "abcd": 512 << 20}


def _bad_text_refused(setting) -> bool:
    try:
        setting.parse("§bad§")
    except ValueError:
        return True
    return False


@pytest.mark.parametrize("setting", [s for s in TABLE if s.env and _bad_text_refused(s)], ids=lambda s: s.env)
def test_a_bad_value_in_the_environment_names_its_variable(setting):
    with pytest.raises(InvalidSubmission, match=rf"^{setting.env}='§bad§': "):
        settings.value(setting.name, env={setting.env: "§bad§"})


def test_a_bad_value_in_a_clients_environment_is_refused_before_it_connects(tmp_path, monkeypatch):
    monkeypatch.setenv("LIBSHARE_ACTIVE_THREAD_PERCENTAGE", "150")
    with pytest.raises(InvalidSubmission, match=r"LIBSHARE_ACTIVE_THREAD_PERCENTAGE='150': a percentage"):
        libshare.connect(mode="daemon", pipe_directory=tmp_path)


def test_a_bad_value_in_the_arbiters_environment_stops_it_naming_the_variable(tmp_path):
    """Read before the device is opened: no Vulkan needed to see the refusal."""
    import os

    for variable, text, reason in (("LIBSHARE_MAX_PROGRAMS", "0", "must be in 1..4096"),
                                   ("LIBSHARE_PLACEMENT", "yes", "must be 1 (on) or 0 (off)")):
        result = subprocess.run([sys.executable, "-m", "libshare.arbiter", "--pipe-directory", str(tmp_path / "pipe")],
                                cwd=ROOT, capture_output=True, text=True, timeout=120,
                                env={**os.environ, variable: text})
        assert result.returncode != 0
        assert f"{variable}={text!r}: {reason}" in result.stderr, result.stderr

"""The settings table: every setting libshare reads, where it comes from, and how it is checked.

Each row of :data:`TABLE` names a setting and says where it may come from (an environment
variable ``LIBSHARE_*``, a flag of ``libshare-control -d/-f`` and ``python -m libshare.arbiter``,
a key of the operator's configuration file's ``[defaults]``), its default, its bounds, the
parser that checks it and what it means. Everything that reads a setting reads it here:

* :func:`value` (an argument, else the environment parsed and checked, else the default) and
  :func:`configured` (the environment's alone) are the only readers of ``LIBSHARE_*``;
* the flags (``libshare.daemon.options.add_arguments``) take their names, defaults, parsers and
  help from the rows;
* the configuration file's ``[defaults]`` keys are the rows' file keys, checked by the rows'
  parsers (``libshare.daemon.config_file``);
* docs/configuration.md's table is written from the rows (:func:`markdown`): ``python
  tools/settings_table.py`` writes it between the file's markers, and a test fails when it is stale.

Where a setting comes from several places, for the arbiter a flag wins over the file, the file
over the environment, the environment over the default; for a client an argument wins over
its environment.

Light on purpose: every process imports this module (a client, the CLI, the control daemon, the
Kubernetes plugin, the Slurm hooks), and it imports nothing but the standard library and
:mod:`libshare.errors`. The size parsers (:func:`parse_size`, :func:`format_size`,
:func:`parse_limit`) and the checks of priorities, modes and compute shares live here too, so
that all of these can check a value without the arbiter.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from fractions import Fraction
from pathlib import Path
from typing import Any, Callable, Mapping

from libshare.errors import InvalidSubmission

__all__ = ["Setting", "TABLE", "SETTINGS", "value", "configured", "default", "markdown", "update_markdown",
           "parse_size", "parse_limit", "parse_limit_value", "format_size", "parse_device_limits", "UNLIMITED", "FITS",
           "priority_name", "mode_name", "percentage", "max_clients_count", "watchdog_seconds",
           "PRIORITIES", "MODES", "UNSCHEDULED", "MAX_CLIENTS", "MAX_TOTAL_PROGRAMS"]

# -------------------------------------------------------------------- sizes

_UNITS = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40}
_SIZE = re.compile(r"(\d+(?:\.\d+)?)\s*([KMGT]?)(?:I?B)?", re.IGNORECASE | re.ASCII)
MAX_SIZE = 1 << 60
"""The largest memory size or limit anything takes."""
UNLIMITED = ("unlimited", "none")
"""The words that remove a limit."""


def parse_size(text: str) -> int:
    """Bytes in ``text`` ("900M", "2G", "1.5G", "4096": binary units, an optional ``B`` or ``iB``
    after the unit); InvalidSubmission if it is not a size."""
    match = _SIZE.fullmatch(text.strip()) if isinstance(text, str) else None
    if match is None and isinstance(text, str) and text.strip().startswith("-"):
        raise InvalidSubmission(f"a memory size cannot be negative: {text!r}")
    if match is None:
        raise InvalidSubmission(f"not a memory size: {text!r}; write bytes or a number with a unit "
                                "K, M, G or T, like 900M or 2G")
    number, unit = match.groups()
    value = Fraction(number) * _UNITS[unit.upper()]  # exact: a float is inf past 309 digits, and rounds
    if value > MAX_SIZE:
        raise InvalidSubmission(f"memory size {text[:80]!r} is too large (at most {format_size(MAX_SIZE)})")
    return int(value)


def parse_limit(text: str) -> int | None:
    """A limit from ``text``: bytes as in :func:`parse_size`, or None for "unlimited"."""
    if isinstance(text, str) and text.strip().lower() in UNLIMITED:
        return None
    return parse_size(text)


def format_size(value: int | None) -> str:
    """``value`` in the shortest exact form :func:`parse_size` reads back ("2G", "900M", "12345")."""
    if value is None:
        return "unlimited"
    for unit in ("T", "G", "M", "K"):
        if value and value % _UNITS[unit] == 0:
            return f"{value // _UNITS[unit]}{unit}"
    return str(value)


def parse_device_limits(text: str) -> dict[str, int]:
    """A memory limit as LIBSHARE_DEVICE_MEM_LIMIT takes it: "1G" (any device, key "") or, in MPS's
    per-device form, "0=1G,UUID=512M" (keys: the index, or the UUID without dashes, lowercase)."""
    limits = {}
    for part in text.split(","):
        device, _, size = part.rpartition("=")
        limits[device.strip().lower().replace("-", "")] = parse_size(size)
    return limits


def parse_limit_value(value) -> int | None:
    """A limit as the configuration file writes it: a size (text), bytes (a number) or "unlimited"."""
    return parse_limit(str(value))


# -------------------------------------------------------------------- priorities, modes, shares, counts

PRIORITIES = ("low", "normal", "high", "realtime")
"""The priorities, lowest first."""
MODES = ("throughput", "fairshare")
"""The scheduling modes an operator may choose."""
UNSCHEDULED = "off"
"""The scheduling mode of no scheduling (every client, all it has, in id order): only in the arbiter's
environment or arguments, to measure the scheduler's own cost."""
MAX_CLIENTS = 4096
"""The most clients one arbiter may be sized for."""
MAX_TOTAL_PROGRAMS = 4096
"""The most programs all clients of an arbiter together may hold (and so one client's most)."""
_MAX_SECONDS = 86400.0


def priority_name(value: str) -> str:
    """A priority name from a name or an MPS number (0 = normal, 1 = below normal); ValueError otherwise."""
    value = {"0": "normal", "1": "low"}.get(str(value).strip(), str(value).strip().lower())
    if value not in PRIORITIES:
        raise ValueError(f"priority must be one of {', '.join(PRIORITIES)} (or MPS 0/1), got {value!r}")
    return value


def mode_name(value) -> str:
    """A scheduling mode (one of :data:`MODES`) from text; ValueError otherwise."""
    if value not in MODES:
        raise ValueError(f"scheduling mode must be one of {', '.join(MODES)}, got {value!r}")
    return value


def _any_mode(value) -> str:
    return value if value == UNSCHEDULED else mode_name(value)


def percentage(value) -> int:
    """A compute share in 1..100 from text or a number; ValueError otherwise."""
    try:
        pct = float(value)
    except (TypeError, ValueError):
        pct = -1.0
    if not 1 <= pct <= 100 or pct != int(pct):
        raise ValueError(f"a percentage must be a whole number in 1..100, got {value!r}")
    return int(pct)


def max_clients_count(value) -> int:
    """A client count in 1..MAX_CLIENTS; ValueError otherwise."""
    value = int(value)
    if not 1 <= value <= MAX_CLIENTS:
        raise ValueError(f"max_clients must be in 1..{MAX_CLIENTS} (got {value})")
    return value


def watchdog_seconds(value) -> float:
    """Seconds a submission may run before the server faults (0: no watchdog); ValueError otherwise."""
    seconds = float(value)
    if not 0 <= seconds <= _MAX_SECONDS:
        raise ValueError(f"watchdog seconds must be in 0..{_MAX_SECONDS:.0f} (0: off), got {value!r}")
    return seconds


# -------------------------------------------------------------------- simple parsers

class Number:
    """A parser of a number in bounds: ``kind`` (int or float) from ``low`` (excluded when
    ``low_open``) to ``high``."""

    def __init__(self, kind: type, low: float, high: float, low_open: bool = False):
        self.kind, self.low, self.high, self.low_open = kind, low, high, low_open

    def __call__(self, text) -> int | float:
        if isinstance(text, bool):
            raise ValueError(f"not a number: {text!r}")
        try:
            value = self.kind(text)
        except (TypeError, ValueError):
            raise ValueError(f"not {'a whole number' if self.kind is int else 'a number'}: {text!r}") from None
        if not (self.low < value if self.low_open else self.low <= value) or not value <= self.high:
            raise ValueError(f"must be in {self.bounds} (got {value!r})")
        return value

    @property
    def bounds(self) -> str:
        low, high = _number(self.low), _number(self.high)
        return f"above {low}, up to {high}" if self.low_open else f"{low}..{high}"


class Choice:
    """A parser of one word of ``choices``."""

    def __init__(self, *choices: str, what: str):
        self.choices, self.what = choices, what

    def __call__(self, text) -> str:
        if text not in self.choices:
            raise ValueError(f"{self.what} must be one of {', '.join(self.choices)} (got {text!r})")
        return text

    @property
    def bounds(self) -> str:
        return ", ".join(f"`{c}`" for c in self.choices)


def _number(value: float) -> str:
    return str(int(value)) if value == int(value) else str(value)


def _switch(text) -> bool:
    """``1`` (on) or ``0`` (off)."""
    if isinstance(text, bool):
        return text
    text = str(text).strip()
    if text not in ("0", "1"):
        raise ValueError(f"must be 1 (on) or 0 (off), got {text!r}")
    return text == "1"


def _text(text) -> str:
    return str(text)


def _path(text) -> Path:
    return Path(text)


def _words(text) -> frozenset[str]:
    """A comma-separated list."""
    return frozenset(word.strip() for word in str(text).split(",") if word.strip())


def _cores(text) -> frozenset[int]:
    """A comma-separated list of CPU numbers."""
    return frozenset(int(word) for word in str(text).split(",") if word.strip())


def _per_user_pipe_directory() -> Path:
    runtime = os.environ.get("XDG_RUNTIME_DIR")
    if runtime and os.access(runtime, os.W_OK):
        return Path(runtime) / "libshare"
    return Path(f"/tmp/libshare-{os.getuid()}")


def _stub_cache() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "libshare" / "k8s-stubs"


FITS = "fits"
"""The default of ``device_mem_total``: what the device fits, measured when the arbiter starts."""


# -------------------------------------------------------------------- the table

@dataclass(frozen=True)
class Setting:
    """One row of the settings table."""

    name: str
    meaning: str
    """What it sets (the docs' and the flag's help text)."""
    default: Any
    """The value when nothing sets it; a callable is called for it (a per-user directory)."""
    parse: Callable[[Any], Any]
    """Checks a value (the environment's text, a flag's, an argument) and returns it canonical; raises
    ValueError (InvalidSubmission is one) with the reason."""
    env: str | None = None
    """The environment variable (``LIBSHARE_*``)."""
    flag: str | None = None
    """The arbiter's command-line flag; ``--no-X`` turns a setting that is on by default off."""
    file_key: str | None = None
    """The key of the configuration file's ``[defaults]``."""
    file_kinds: tuple[type, ...] = ()
    """The TOML types the file's key takes."""
    file_parse: Callable[[Any], Any] | None = None
    """The file's check, where it differs from :attr:`parse` (None: the same)."""
    shown_default: str | None = None
    """The default as the docs say it (None: written from :attr:`default`)."""
    bounds: str | None = None
    """What it takes, as the docs say it (None: the parser's own ``bounds``, if any)."""
    who: str = "arbiter"
    """Who reads it: ``arbiter``, ``client``, ``client, arbiter``, ``slurm``, ``k8s``, or ``testing`` and
    ``internal`` (not for operators: never set them in production)."""
    size: bool = False
    """A memory size (the file shows it as one)."""
    metavar: str | None = None
    flag_help: str | None = None
    """The flag's help, where it says more than :attr:`meaning` (a ``--no-X`` flag, what it turns off)."""

    @property
    def switch(self) -> bool:
        """A flag without a value (``--multi-user``, ``--no-placement``)."""
        return isinstance(self.default, bool)

    @property
    def listed(self) -> bool:
        """Shown in docs/configuration.md's table (an operator's or a user's setting)."""
        return self.who in ("arbiter", "client", "client, arbiter")

    def fallback(self):
        """The default value."""
        return self.default() if callable(self.default) else self.default

    def check(self, given, where: str | None = None):
        """``given`` parsed and checked. Read from the environment (``where`` names the variable), a
        bad value raises InvalidSubmission naming it; passed as an argument, ValueError naming the
        setting (a caller's mistake: the C API answers it -EINVAL)."""
        try:
            return self.parse(given)
        except ValueError as exc:
            if where is None:
                raise ValueError(f"{self.name}={given!r}: {exc}") from None
            raise InvalidSubmission(f"{where}={given!r}: {exc}") from None

    def describe_default(self) -> str:
        if self.shown_default is not None:
            return self.shown_default
        value = self.default
        if isinstance(value, bool):
            return "on" if value else "off"
        if isinstance(value, str):
            return f"`{value}`"
        if isinstance(value, float):
            return f"{_number(value)} s"
        return str(value)

    def describe_bounds(self) -> str:
        if self.bounds is not None:
            return self.bounds
        return getattr(self.parse, "bounds", "")


_SECONDS = Number(float, 0.0, _MAX_SECONDS, low_open=True)
_DISK_SIZE = Number(lambda text: parse_size(str(text)), 1 << 16, 1 << 40)  # bytes on disk, from "16M" or 16777216

TABLE: tuple[Setting, ...] = (
    # where things live
    Setting("pipe_directory", "where the arbiter's socket and lock file live, and where clients look for it",
            _per_user_pipe_directory, _path, env="LIBSHARE_PIPE_DIRECTORY", flag="--pipe-directory",
            shown_default="`$XDG_RUNTIME_DIR/libshare`, else `/tmp/libshare-$UID`", who="client, arbiter",
            metavar="DIR"),
    Setting("log_directory", "where `server.log` and `control.log` go", None, _path, env="LIBSHARE_LOG_DIRECTORY",
            flag="--log-directory", shown_default="the pipe directory", metavar="DIR"),
    Setting("log_max_size", "the size at which a log is renamed `NAME.1` (replacing the older one) and begun anew",
            16 << 20, _DISK_SIZE, env="LIBSHARE_LOG_MAX_SIZE", shown_default="16M", bounds="64K to 1T"),
    Setting("shader_cache_max_size", "the most the driver's shader cache in the pipe directory holds; its least "
            "recently used entries go first (Mesa's `MESA_SHADER_CACHE_MAX_SIZE`, when set, wins)", 128 << 20,
            _DISK_SIZE, env="LIBSHARE_SHADER_CACHE_MAX_SIZE", shown_default="128M", bounds="64K to 1T"),
    Setting("device", "the Vulkan device the arbiter opens", None, _text, env="LIBSHARE_DEVICE", flag="--device",
            shown_default="0", bounds="a device index or UUID", metavar="N|UUID"),
    # a client's
    Setting("mode", "client: use a daemon if one answers, else embed (`auto`); insist on a daemon; never look "
            "for one", "auto", Choice("auto", "daemon", "embedded", what="mode"), env="LIBSHARE_MODE", who="client"),
    Setting("client_priority", "client: the priority it asks for", None, priority_name,
            env="LIBSHARE_CLIENT_PRIORITY", shown_default="the arbiter's default",
            bounds="`low`, `normal`, `high`, `realtime`, MPS `0`, `1`", who="client"),
    Setting("group", "client: the group it joins", "", _text, env="LIBSHARE_GROUP", shown_default="none",
            who="client"),
    Setting("client_name", "client: the name `ps` shows, for a program under the Vulkan driver (`connect()` takes "
            "`name=`)", "", _text, env="LIBSHARE_CLIENT_NAME", shown_default="`pidPID`", who="client"),
    # the defaults of the configuration file, in the order get_config shows them
    Setting("active_thread_percentage", "client: lowers its own compute share; arbiter: the default compute "
            "share", 100, percentage, env="LIBSHARE_ACTIVE_THREAD_PERCENTAGE", file_key="active_thread_percentage",
            file_kinds=(int,), bounds="1..100", who="client, arbiter"),
    Setting("device_mem_limit", "client: lowers its own memory limit; arbiter: the default limit of each client",
            {}, parse_device_limits, env="LIBSHARE_DEVICE_MEM_LIMIT", file_key="device_mem_limit",
            file_kinds=(str, int), file_parse=parse_limit_value, size=True, shown_default="unlimited",
            bounds="a size, `unlimited`, or per device `0=1G,UUID=512M`", who="client, arbiter"),
    Setting("priority", "the priority of clients that ask for none", "normal", priority_name,
            env="LIBSHARE_DEFAULT_CLIENT_PRIORITY", file_key="priority", file_kinds=(str, int),
            bounds="as the priority"),
    Setting("scheduling", "the scheduling mode", "throughput", _any_mode, env="LIBSHARE_SCHEDULING",
            file_key="scheduling", file_kinds=(str,), file_parse=mode_name,
            bounds="`throughput`, `fairshare`"),
    Setting("max_clients", "clients served at once, set at start only", 48, max_clients_count, flag="--max-clients",
            file_key="max_clients", file_kinds=(int,), bounds=f"1..{MAX_CLIENTS}", metavar="N"),
    Setting("watchdog_seconds", "how long one dispatch may run before the arbiter faults", 120.0,
            watchdog_seconds, env="LIBSHARE_WATCHDOG_SECONDS", file_key="watchdog_seconds",
            file_kinds=(int, float), shown_default="120", bounds=f"0 (off) to {_MAX_SECONDS:.0f}"),
    # the arbiter's environment
    Setting("device_mem_total", "memory of all clients together", FITS, parse_limit,
            env="LIBSHARE_DEVICE_MEM_TOTAL", shown_default="what the device fits", bounds="a size or `unlimited`"),
    Setting("max_buffers", "buffers one client may hold", 4096, Number(int, 1, 1 << 20), env="LIBSHARE_MAX_BUFFERS"),
    Setting("max_programs", f"programs one client may hold (all clients together: {MAX_TOTAL_PROGRAMS})", 256,
            Number(int, 1, MAX_TOTAL_PROGRAMS), env="LIBSHARE_MAX_PROGRAMS"),
    Setting("hello_timeout", "time a new connection has to say hello", 10.0, _SECONDS, env="LIBSHARE_HELLO_TIMEOUT"),
    Setting("request_timeout", "time a client has to finish a request it began", 30.0, _SECONDS,
            env="LIBSHARE_REQUEST_TIMEOUT"),
    Setting("compile_timeout", "CPU time a vetting compile of a new module may take (twice that on the clock)",
            300.0, _SECONDS,
            env="LIBSHARE_COMPILE_TIMEOUT"),
    Setting("metrics_client_names", "the metrics show every client's name, group and usage to every scraper "
            "(off: as `ps` shows them to the scraper's uid)", False, _switch, env="LIBSHARE_METRICS_CLIENT_NAMES",
            bounds="`0`, or `1` (on)"),
    # the arbiter's flags
    Setting("placement", "on a CPU device, the engine and the driver's threads on one core", True, _switch,
            env="LIBSHARE_PLACEMENT", flag="--no-placement", bounds="`1`, or `0` (off)",
            flag_help="leave the engine's and the driver's threads on every core (by default, on a CPU device, "
                      "they share one core and the arbiter's other threads get the rest; LIBSHARE_PLACEMENT=0 "
                      "does the same)"),
    Setting("timestamps", "per-dispatch device timing (device-time accounting)", True, _switch,
            flag="--no-timestamps", shown_default="timestamps on",
            flag_help="skip per-dispatch device timing (no device-time accounting; faster on lavapipe)"),
    Setting("multi_user", "serve clients of every user", False, _switch, flag="--multi-user", bounds="root only",
            flag_help="serve clients of every user (run as root), not only the arbiter's own user"),
    Setting("metrics_port", "serve Prometheus metrics on this TCP port", 0, Number(int, 0, 65535),
            flag="--metrics-port", shown_default="0 (off)", metavar="PORT",
            flag_help="serve Prometheus metrics on this TCP port (default 0: off)"),
    Setting("metrics_address", "the metrics endpoint's address", "127.0.0.1", _text, flag="--metrics-address",
            metavar="ADDRESS"),
    Setting("shutdown_timeout", "time running work may take to end on SIGINT or SIGTERM", 10.0,
            Number(float, 0.0, _MAX_SECONDS), flag="--shutdown-timeout", metavar="SECONDS"),
    Setting("config", "the configuration file", None, _path, flag="--config", shown_default="none", metavar="FILE",
            flag_help="the operator's configuration (TOML: [defaults] and [groups.NAME]; see "
                      "docs/configuration.md); read again on reload and SIGHUP"),
    Setting("supervisor_fd", "the control daemon's end of its link to the arbiter it starts", -1, int,
            flag="--supervisor-fd", who="internal"),
    # the Slurm hooks (libshare.slurm: the pipe and log directories default to /run/libshare and /var/log/libshare)
    Setting("slurm_state", "where the hooks keep the node's jobs", Path("/run/libshare-slurm"), _path,
            env="LIBSHARE_SLURM_STATE", who="slurm"),
    Setting("slurm_gres", "the gres name of the shares", "libshare", _text, env="LIBSHARE_SLURM_GRES", who="slurm"),
    Setting("slurm_shares", "the node's count of shares", 100, Number(int, 1, 1 << 20), env="LIBSHARE_SLURM_SHARES",
            who="slurm"),
    Setting("slurm_multi_user", "start the arbiter with `--multi-user`", False, _switch,
            env="LIBSHARE_SLURM_MULTI_USER", who="slurm"),
    Setting("slurm_scontrol", "the `scontrol` the hooks run", None, _text, env="LIBSHARE_SLURM_SCONTROL",
            shown_default="`scontrol` on the PATH", who="slurm"),
    Setting("slurm_python", "the Python the Slurm scripts run the hooks with", None, _text, env="LIBSHARE_PYTHON",
            shown_default="none: libshare-slurm.env sets it", who="slurm"),
    # the Kubernetes plugin
    Setting("k8s_stub_cache", "where the plugin's generated gRPC stubs are cached", _stub_cache, _path,
            env="LIBSHARE_K8S_STUB_CACHE", shown_default="`$XDG_CACHE_HOME/libshare/k8s-stubs`", who="k8s"),
    # tests and the arbiter's own children
    Setting("test_hooks", "test-only control commands that inject crashes and faults", False, _switch,
            env="LIBSHARE_TEST_HOOKS", who="testing"),
    Setting("test_crash_compiles", "with the test hooks, the SHA-256s of modules a vetting compile crashes on",
            frozenset(), _words, env="LIBSHARE_TEST_CRASH_COMPILES", shown_default="none", who="testing"),
    Setting("test_hold_compiles", "with the test hooks, `SHA256=FIFO` words: a vetting compile of that module "
            "first reads that FIFO to its end", frozenset(), _words, env="LIBSHARE_TEST_HOLD_COMPILES",
            shown_default="none", who="testing"),
    Setting("require_vulkan", "the tests fail, instead of skipping, without a Vulkan driver", False, _switch,
            env="LIBSHARE_REQUIRE_VULKAN", who="testing"),
    Setting("require_slurm", "the Slurm tests fail, instead of skipping, when Slurm cannot be installed", False,
            _switch, env="LIBSHARE_REQUIRE_SLURM", who="testing"),
    Setting("fuzz_seed", "the seed a fuzz test replays (a failing one prints its seed)", None, int,
            env="LIBSHARE_FUZZ_SEED", shown_default="each fuzz test's own", who="testing"),
    Setting("fuzz_mutants", "how many mutants the SPIR-V fuzz test tries", 1000, Number(int, 1, 1 << 30),
            env="LIBSHARE_FUZZ_MUTANTS", who="testing"),
    Setting("compiler_cores", "the cores a vetting compiler runs on, from its arbiter", None, _cores,
            env="LIBSHARE_COMPILER_CORES", shown_default="every core", who="internal"),
)
"""The settings table (see the module's docstring)."""

SETTINGS: dict[str, Setting] = {s.name: s for s in TABLE}
"""The rows by name."""

_BY_VARIABLE = {s.env: s for s in TABLE if s.env}


# -------------------------------------------------------------------- reading

_UNSET = object()


def _environment(setting: Setting, env: Mapping[str, str] | None):
    """The setting as the environment sets it, parsed and checked, or _UNSET."""
    if setting.env is None:
        return _UNSET
    text = (os.environ if env is None else env).get(setting.env)
    if text is None or not text.strip():
        return _UNSET
    return setting.check(text, setting.env)


def configured(name: str, env: Mapping[str, str] | None = None):
    """Setting ``name`` as the environment (``env``, else this process's) sets it, parsed and checked;
    None when its variable is unset or blank. InvalidSubmission naming the variable when it is bad."""
    found = _environment(SETTINGS[name], env)
    return None if found is _UNSET else found


def value(name: str, override=None, *, env: Mapping[str, str] | None = None):
    """Setting ``name``: ``override`` (an argument or a flag's value, checked) when not None, else the
    environment's (:func:`configured`), else the table's default."""
    setting = SETTINGS[name]
    if override is not None:
        return setting.check(override)
    found = _environment(setting, env)
    return setting.fallback() if found is _UNSET else found


def default(name: str):
    """The table's default of setting ``name``."""
    return SETTINGS[name].fallback()


# -------------------------------------------------------------------- the docs' table

BEGIN = "<!-- settings-table-begin -->"
END = "<!-- settings-table-end -->"


def markdown() -> str:
    """docs/configuration.md's settings table, from :data:`TABLE` (an operator's and a user's rows)."""
    def code(text: str | None, prefix: str = "") -> str:
        return f"`{prefix}{text}`" if text else ""

    lines = ["| environment variable | flag | file key | default | bounds | what it sets |",
             "| --- | --- | --- | --- | --- | --- |"]
    for s in TABLE:
        if s.listed:
            cells = [code(s.env), code(s.flag), code(s.file_key, "defaults."), s.describe_default(),
                     s.describe_bounds(), s.meaning]
            lines.append("|" + "|".join(f" {cell} " if cell else " " for cell in cells) + "|")
    return "\n".join(lines)


def update_markdown(text: str) -> str:
    """``text`` (a document with the table's markers) with the table between them written anew."""
    start, end = text.find(BEGIN), text.find(END)
    if start < 0 or end < start:
        raise ValueError(f"the document has no {BEGIN} ... {END} markers")
    return f"{text[:start + len(BEGIN)]}\n{markdown()}\n{text[end:]}"

"""Real compute shaders (tests/corpus/, tools/corpus.py) through libshare and through a device of
their own, on the same seeded inputs.

For each shader of the corpus (compiled as its project compiles it, with the sizes, push
constants, workgroup counts and specialization constants its manifest entry gives):

* the module is valid SPIR-V for its project's target environment (spirv-val), runs clean on a
  private device with every optional feature enabled, under the Khronos validation layer when it
  is installed, and changes some binding: the corpus itself is sound;
* through libshare (one embedded session for all, and one daemon): accepted, and every binding
  holds the bytes the private device left in it (or values within the manifest's tolerance,
  where it states one); or, for a shader whose manifest entry lists a ``known_refusal``,
  refused for that reason. A refusal names what it refuses (a reason from ``tools.corpus.REASONS``,
  never "invalid SPIR-V" for a module spirv-val accepts). A shader refused and not on the list
  fails, and so does one on the list that is now accepted: the list stays true.
"""

from __future__ import annotations

import contextlib
import os
import shutil

import pytest

from tests.arbiter.conftest import run_daemon
from tools import corpus

ENTRIES = corpus.entries()
NAMES = [e["name"] for e in ENTRIES]


def _layer_installed() -> bool:
    try:
        import vulkan

        return any(p.layerName == "VK_LAYER_KHRONOS_validation" for p in vulkan.vkEnumerateInstanceLayerProperties())
    except Exception:  # noqa: BLE001 - no loader: the device fixtures skip or fail on their own
        return False


@pytest.fixture(scope="module")
def direct(vulkan_device_name):
    """A private device (the one the arbiters open), under the validation layer when installed."""
    with corpus.Direct(validate=_layer_installed(), selector=os.environ.get("LIBSHARE_DEVICE")) as device:
        yield device


@pytest.fixture(scope="module")
def direct_results(direct):
    """Each shader's direct run, made once for both sessions: {name: (first run, repeat equal)}."""
    cache = {}

    def result(entry):
        if entry["name"] not in cache:
            data = corpus.inputs(entry)
            first = direct.run(entry, data)
            again = direct.run(entry, data) if first.accepted else None
            cache[entry["name"]] = (first, again is not None and again.outputs == first.outputs)
        return cache[entry["name"]]

    return result


@pytest.fixture(scope="module")
def embedded(vulkan_device_name):
    import libshare

    with libshare.connect(name="corpus", mode="embedded") as session:
        yield session


@pytest.fixture(scope="module")
def through_daemon(vulkan_device_name, tmp_path_factory):
    import libshare

    with contextlib.contextmanager(run_daemon)(tmp_path_factory.mktemp("corpus") / "pipe") as (_, pipe_dir):
        with libshare.connect(name="corpus", mode="daemon", pipe_directory=pipe_dir) as session:
            yield session


def _check(entry: dict, outcome: corpus.Outcome, direct_results) -> None:
    known = entry.get("known_refusal")
    if not outcome.accepted:
        heading = corpus.reason(outcome.refusal)
        assert heading != "other", f"{entry['name']}: a refusal that names nothing known: {outcome.refusal}"
        assert "invalid spir-v" not in outcome.refusal.lower(), \
            f"{entry['name']}: spirv-val accepts the module, libshare calls it invalid: {outcome.refusal}"
        assert known, f"{entry['name']} refused and not on the known list: {outcome.refusal}"
        assert heading == known["reason"], \
            f"{entry['name']}: refused for {heading!r} ({outcome.refusal}), listed for {known['reason']!r}"
        return
    assert not known, f"{entry['name']} is accepted now: take it off the known refusals ({known})"
    first, deterministic = direct_results(entry)
    if not first.accepted or outcome.outputs is None:
        return  # nothing to compare (a resource the harness does not bind)
    assert deterministic or entry.get("tolerance") is not None, \
        f"{entry['name']}: two direct runs differ; give it a tolerance in the manifest"
    difference = corpus.compare(entry, first.outputs, outcome.outputs)
    assert not difference, f"{entry['name']}: libshare's result differs from the direct run's: {difference}"


@pytest.mark.parametrize("name", NAMES)
def test_corpus_module_is_sound(name, direct_results):
    """The corpus's own check: valid SPIR-V for its target, clean under the validation layer."""
    entry = next(e for e in ENTRIES if e["name"] == name)
    if shutil.which("spirv-val"):
        assert corpus.spirv_val(entry) == "", f"{name} is not valid SPIR-V for {entry['target_env']}"
    first, _ = direct_results(entry)
    assert first.messages == [], f"{name}: the validation layer reports: {first.messages[:3]}"
    if first.accepted:  # the run does something: a comparison of untouched inputs would prove nothing
        assert first.outputs != corpus.inputs(entry), f"{name}: the run leaves every binding as it was"


@pytest.mark.parametrize("name", NAMES)
def test_corpus_embedded(name, embedded, direct_results):
    entry = next(e for e in ENTRIES if e["name"] == name)
    _check(entry, corpus.run_libshare(embedded, entry), direct_results)


@pytest.mark.parametrize("name", NAMES)
def test_corpus_daemon(name, through_daemon, direct_results):
    entry = next(e for e in ENTRIES if e["name"] == name)
    _check(entry, corpus.run_libshare(through_daemon, entry), direct_results)

"""The plugin's ledger (libshare/k8s/_ledger.py): allocations written whole, read back checked."""

from __future__ import annotations

import json
import logging

import pytest

from libshare.k8s import allocate, parse_shares
from libshare.k8s._ledger import Ledger, state_path

RESOURCE = "libshare.io/vulkan"
SHARES = {share.id: share for share in parse_shares("4", memory_per_share=64 << 20)}


def _ledger(path, shares=SHARES, resource=RESOURCE) -> Ledger:
    return Ledger(path, resource, shares)


def _groups(ledger: Ledger) -> list[str]:
    return [allocation.group for allocation in ledger.allocations()]


def test_the_ledger_sits_where_a_restarting_kubelet_leaves_it(tmp_path):
    path = state_path(tmp_path / "dp" / "kubelet.sock", "libshare-vulkan.sock")
    assert path == tmp_path / "dp" / "libshare" / "libshare-vulkan.json"  # a directory: the kubelet keeps it


def test_allocations_outlive_the_ledger_and_superseded_groups_are_lifted(tmp_path):
    path = tmp_path / "libshare" / "ledger.json"
    ledger = _ledger(path)
    old, other = allocate(SHARES, ["share-0", "share-1"]), allocate(SHARES, ["share-2"])
    ledger.add([old, other])
    assert _groups(ledger) == sorted([old.group, other.group]) and not ledger.lifted
    assert [p.name for p in path.parent.iterdir()] == [path.name]  # written whole: no temporary left
    assert path.stat().st_mode & 0o777 == 0o600

    again = _ledger(path)  # a restarted plugin
    assert again.allocations() == ledger.allocations()
    new = allocate(SHARES, ["share-3", "share-1"])  # some of the old group's devices
    again.add([new])
    assert _groups(again) == sorted([other.group, new.group]) and again.lifted == {old.group}
    third = _ledger(path)
    assert third.lifted == {old.group}  # not yet told to an arbiter: a plugin restart still lifts it
    third.told([old.group])
    assert not _ledger(path).lifted and _groups(_ledger(path)) == sorted([other.group, new.group])
    third.add([old])  # allocated once more: current again, no longer lifted
    assert old.group in _groups(third) and new.group not in _groups(third)


def test_a_ledger_that_cannot_be_written_changes_nothing(tmp_path):
    blocked = tmp_path / "file"
    blocked.write_text("")
    ledger = _ledger(blocked / "ledger.json")  # its directory cannot be made
    with pytest.raises(OSError):
        ledger.add([allocate(SHARES, ["share-0"])])
    assert ledger.allocations() == [] and not ledger.lifted


def _write(path, **changes):
    entry = {"devices": ["share-0"], "group": allocate(SHARES, ["share-0"]).group, "percent": 25,
             "memory": 64 << 20}
    data = {"version": 1, "resource": RESOURCE, "lifted": [], "allocations": [entry]}
    for key, value in changes.items():
        if key in entry:
            entry[key] = value
        else:
            data[key] = value
    path.write_text(json.dumps(data))


@pytest.mark.parametrize("changes, complaint", [
    ({"version": 2}, "not a version 1 ledger"),
    ({"resource": "example.com/gpu"}, "not of 'libshare.io/vulkan'"),
    ({"group": "k8s-" + "0" * 24}, "not the group of its devices"),
    ({"devices": ["share-1", "share-0"]}, "sorted set"),
    ({"devices": []}, "sorted set"),
    ({"percent": 101}, "compute share"),
    ({"percent": True}, "compute share"),
    ({"memory": -1}, "a memory of"),
    ({"memory": "64M"}, "a memory of"),
    ({"lifted": ["../../etc"]}, "not one this plugin names"),
    ({"lifted": "k8s-"}, "list of str"),
    ({"allocations": [{"devices": ["share-0"]}]}, "no field 'percent'"),
])
def test_a_bad_ledger_is_ignored(tmp_path, caplog, changes, complaint):
    path = tmp_path / "ledger.json"
    _write(path, **changes)
    with caplog.at_level(logging.ERROR, logger="libshare.k8s"):
        ledger = _ledger(path)
    assert ledger.allocations() == [] and not ledger.lifted
    assert complaint in caplog.text


@pytest.mark.parametrize("text", [b"", b"{", b"\xff\xfe", b"[" * 100000, b" " * (2 << 20), b"null"])
def test_a_ledger_that_is_not_one_is_ignored(tmp_path, text):
    path = tmp_path / "ledger.json"
    path.write_bytes(text)
    assert _ledger(path).allocations() == []


def test_a_device_in_two_groups_is_a_bad_ledger(tmp_path, caplog):
    path = tmp_path / "ledger.json"
    one, both = allocate(SHARES, ["share-0"]), allocate(SHARES, ["share-0", "share-1"])
    _ledger(path).add([one])
    data = json.loads(path.read_text())
    data["allocations"].append({"devices": list(both.devices), "group": both.group, "percent": 50, "memory": None})
    path.write_text(json.dumps(data))
    assert _ledger(path).allocations() == [] and "in another group too" in caplog.text


def test_allocations_of_devices_no_longer_advertised_are_lifted(tmp_path):
    path = tmp_path / "ledger.json"
    kept, gone = allocate(SHARES, ["share-0"]), allocate(SHARES, ["share-2", "share-3"])
    _ledger(path).add([kept, gone])
    fewer = {share.id: share for share in parse_shares("3")}  # share-3 is no more; share-0 has no memory now
    ledger = _ledger(path, shares=fewer)
    assert ledger.allocations() == [kept] and ledger.lifted == {gone.group}  # kept as the container was told

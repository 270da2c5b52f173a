"""Shares: how they are written, and what an allocation of some of them gives."""

from __future__ import annotations

from fractions import Fraction

import pytest

from libshare.k8s import Options, Share, allocate, group_name, parse_shares


def _by_id(shares):
    return {share.id: share for share in shares}


def test_equal_shares():
    hundred = parse_shares("100")
    assert len(hundred) == 100 and hundred[0].id == "share-00" and hundred[-1].id == "share-99"
    assert {share.percent for share in hundred} == {1}
    three = _by_id(parse_shares("3", memory_per_share=3 << 30))
    assert allocate(three, ["share-1"]).percent == 33  # 100/3 %, rounded down: the arbiter takes whole percents
    everything = allocate(three, ["share-0", "share-1", "share-2"])
    assert (everything.percent, everything.memory) == (100, 9 << 30)
    (single,) = parse_shares("1")
    assert (single.id, single.percent, single.memory) == ("share-0", 100, None)


def test_listed_shares_with_and_without_memory():
    shares = parse_shares("50%:8G, 25%, 15%:512M, 10%", memory_per_share=1 << 30)
    assert [(s.id, s.percent, s.memory) for s in shares] == [
        ("share-0", 50, 8 << 30), ("share-1", 25, 1 << 30), ("share-2", 15, 512 << 20), ("share-3", 10, 1 << 30)]
    assert allocate(_by_id(shares), ["share-0", "share-2"]).memory == (8 << 30) + (512 << 20)
    (whole,) = parse_shares("100%")
    assert whole.percent == Fraction(100)
    unlimited = _by_id(parse_shares("60%,40%"))
    assert allocate(unlimited, ["share-0", "share-1"]).memory is None  # no share has memory: no limit


def test_shares_with_and_without_memory_are_not_mixed(tmp_path):
    """Reviewed: with 60%:1G,40% a container given both shares had no memory limit at all (the share
    without memory lifted the other's 1G). Memory is all or nothing: a mixed list is refused where it
    is written, where the plugin is set up, and an allocation of shares built by hand."""
    with pytest.raises(ValueError, match=r"mixed \(share-1 without\)"):
        parse_shares("60%:1G,40%")
    mixed = [Share("share-0", Fraction(60), 1 << 30), Share("share-1", Fraction(40))]
    with pytest.raises(ValueError, match="mixed"):
        Options(mixed, pipe_directory=tmp_path)
    with pytest.raises(ValueError, match="mixed"):
        allocate(_by_id(mixed), ["share-1", "share-0"])
    assert allocate(_by_id(mixed), ["share-0"]).memory == 1 << 30  # alone, each is what it says
    assert allocate(_by_id(mixed), ["share-1"]).memory is None
    given = _by_id(parse_shares("60%:1G,40%", memory_per_share=256 << 20))  # the rest given memory: the sum
    assert allocate(given, ["share-0", "share-1"]).memory == (1 << 30) + (256 << 20)


@pytest.mark.parametrize("text, complaint", [
    ("0", "1 to 100"), ("101", "1 to 100"), ("60%,50%", "add up to 110"), ("50", None), ("25%,,25%", "percentages"),
    ("2.5%", "whole percentage"), ("0%", "whole percentage"), ("50%:0", "more than 0"), ("50%:lots", "not a memory"),
    ("ten", "whole percentage"), ("", "percentages"), ("²", "whole percentage"), ("50²%", "whole percentage"),
    ("١٠", "whole percentage"), ("1_0", "whole percentage"), ("9" * 400, "whole percentage|1 to 100"),
])
def test_bad_shares_are_refused(text, complaint):
    if complaint is None:
        assert len(parse_shares(text)) == 50  # a bare number is a count, not a percentage
        return
    with pytest.raises(ValueError, match=complaint):
        parse_shares(text)


def test_groups_follow_the_device_set():
    assert group_name(["share-1", "share-0"]) == group_name(["share-0", "share-1"])
    assert group_name(["share-0"]) != group_name(["share-0", "share-1"])
    assert len(group_name([f"share-{i:02d}" for i in range(100)])) <= 64  # the arbiter's bound on a group name


def test_options_are_checked(tmp_path):
    shares = parse_shares("2")
    options = Options(shares, pipe_directory=tmp_path, kubelet_socket=tmp_path / "dp" / "kubelet.sock")
    assert options.endpoint == tmp_path / "dp" / "libshare-vulkan.sock" and options.host_pipe_directory == tmp_path
    for bad in ({"resource_name": "vulkan"}, {"resource_name": "a/b/c"}, {"socket_name": "kubelet.sock"},
                {"socket_name": "../x.sock"}, {"period": 0}):
        with pytest.raises(ValueError):
            Options(shares, pipe_directory=tmp_path, **bad)
    with pytest.raises(ValueError):
        Options([], pipe_directory=tmp_path)

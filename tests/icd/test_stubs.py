"""The commands the driver refuses: each answered as a typed stub of its own prototype (libshare/icd/_stubs.py).

loader.c's table lines point a command the driver does not implement at a marker (ls_icd_refused,
ls_icd_nothing); the lookup answers the generated stub of that name (stubs.c). These tests check the
committed stubs.c is what the generator writes from loader.c and the Vulkan header (so a new marker line
without its stub fails here), that the generator refuses a marker of the wrong kind or a command the header
lacks, and, in the built driver, that every marker's command is answered at its own address (never a
marker's) and that every refused one answers VK_ERROR_FEATURE_NOT_PRESENT when called with its own
arguments. tests/icd/test_c_program.py calls some through vkGetDeviceProcAddr under the sanitizers.
"""

from __future__ import annotations

import ctypes

import pytest

from libshare.icd import _stubs, library_path

VK_ERROR_FEATURE_NOT_PRESENT = -8


def loader_text() -> str:
    return _stubs.LOADER.read_text()


def header_text() -> str:
    return _stubs.HEADER.read_text()


def test_the_committed_stubs_are_what_the_generator_writes():
    assert _stubs.OUTPUT.read_text() == _stubs.render(loader_text(), header_text()), \
        "stubs.c is stale: run python libshare/icd/_stubs.py"


def test_a_new_marker_line_needs_its_stub():
    text = loader_text().replace('ENTRY("vkCreateQueryPool", ls_icd_CreateQueryPool)',
                                 'ENTRY("vkCreateQueryPool", ls_icd_refused)')
    assert "vkCreateQueryPool" in _stubs.markers(text) and "vkCreateQueryPool" not in _stubs.markers(loader_text())
    rendered = _stubs.render(text, header_text())
    assert "stub_vkCreateQueryPool(" in rendered and rendered != _stubs.OUTPUT.read_text()


def test_the_generator_refuses_a_marker_of_the_wrong_kind_or_an_unknown_command():
    wrong_kind = loader_text().replace('ENTRY("vkCreateImage", ls_icd_refused)', 'ENTRY("vkCreateImage", ls_icd_nothing)')
    assert wrong_kind != loader_text()
    with pytest.raises(ValueError, match="vkCreateImage returns VkResult"):
        _stubs.render(wrong_kind, header_text())
    unknown = loader_text() + '\nENTRY("vkCreateNothingAtAll", ls_icd_refused),\n'
    with pytest.raises(ValueError, match="vkCreateNothingAtAll"):
        _stubs.render(unknown, header_text())


def test_every_marker_command_is_its_own_stub_in_the_driver():
    driver = ctypes.CDLL(str(library_path()))
    lookup = driver.vk_icdGetInstanceProcAddr
    lookup.restype, lookup.argtypes = ctypes.c_void_p, [ctypes.c_void_p, ctypes.c_char_p]
    wanted = _stubs.markers(loader_text())
    prototypes = _stubs.prototypes(header_text())
    addresses = {name: lookup(None, name.encode()) for name in wanted}
    assert all(addresses.values()), addresses
    assert len(set(addresses.values())) == len(wanted)  # the two markers' addresses would repeat
    refused = [name for name, marker in wanted.items() if marker == "ls_icd_refused"]
    assert refused
    for name in refused:
        parameters = prototypes[name][1]
        assert all("float" not in p for p in parameters), name  # every argument passed as a zero integer
        stub = ctypes.CFUNCTYPE(ctypes.c_int32, *[ctypes.c_uint64] * len(parameters))(addresses[name])
        assert stub(*[0] * len(parameters)) == VK_ERROR_FEATURE_NOT_PRESENT, name

"""Texel views: the ``view`` request, which makes a VkBufferView over part of a client's own buffer.

A kernel's texel buffer (``layout(r32f) uniform imageBuffer``: a storage texel buffer;
``uniform samplerBuffer``: a uniform texel buffer) reads and writes a buffer as texels of a format.
A dispatch binds it a *view*: a range of one of the client's buffers and a format of
``libshare.protocol.texels``. The client asks for one (``Session.texel_view``) with ``buffer_id``,
``format``, ``offset`` and ``size`` (bytes; default: the whole texels from the offset to the
buffer's end), and the arbiter checks, before any VkBufferView exists:

* the buffer is the client's own and live (``client.buffers``: another client's id, or a freed
  one, is no buffer of this client; a view names memory only through its owner's table);
* the format is one the device supports in a buffer view for at least one kind of texel buffer
  (``bufferFeatures``); the view may serve the kinds it supports (its *uses*, which the engine
  checks against the binding a dispatch puts it at: engine/validate.c);
* the offset is a multiple of the device's ``minTexelBufferOffsetAlignment``; the size is a
  whole number of texels, at most ``maxTexelBufferElements`` of them, and offset + size is
  within the buffer;
* the client holds fewer than :data:`VIEWS_PER_CLIENT` views.

The view is then registered in the engine's table of the client (``LS_KIND_VIEW``), where it
holds its buffer (engine/objects.c, "Views"): freeing a buffer frees its views first, and no
view outlives the memory under it. A device's robustBufferAccess bounds every texel access to
the view: a read past its end reads zeros, a write there is dropped. A reattaching session asks
again for each view it kept, with the ``id`` it had (client/reattach.py).
"""

from __future__ import annotations

from libshare.errors import InvalidSubmission, QuotaExceeded
from libshare.protocol import wire as protocol
from libshare.protocol.texels import TEXEL_FORMATS
from libshare.arbiter.serve.clients import Client, ViewRecord

__all__ = ["VIEWS_PER_CLIENT", "VIEW_FIELDS", "make_view"]

VIEWS_PER_CLIENT = 1024
"""Texel views a client holds at once, freed ones still in use included."""
_BYTES = protocol.integer(0, (1 << 40))

VIEW_FIELDS = {"buffer_id": (protocol.integer(0, (1 << 63) - 1), True),
               "format": (protocol.choice(*TEXEL_FORMATS), True),
               "offset": (_BYTES, False), "size": (protocol.integer(1, 1 << 40), False),
               "id": (protocol.integer(1, (1 << 31) - 1), False)}
"""The ``view`` request's fields (its ``op`` aside: requests.py)."""


def make_view(drainer, client: Client, fields: dict, require_attached) -> dict:
    """Check a ``view`` request of ``client`` and make the view (a control task); its reply's fields.
    Raises InvalidSubmission naming what it refuses, QuotaExceeded past :data:`VIEWS_PER_CLIENT`."""
    device = drainer.device
    require_attached(client)
    buffer = client.buffers.get(fields["buffer_id"])
    if buffer is None:
        raise InvalidSubmission(f"no buffer {fields['buffer_id']} of this session to view (a view names a live "
                                "buffer of the session's own)")
    name = fields["format"]
    texel = TEXEL_FORMATS[name]
    if not device.texel_formats.get(name):
        raise InvalidSubmission(f"texel format {name} is not supported in a buffer view by {device.name}; it "
                                f"supports {', '.join(device.texel_formats) or 'none'}")
    offset = fields.get("offset", 0)
    alignment = device.texel_offset_alignment
    if offset % alignment:
        raise InvalidSubmission(f"a texel view's offset must be a multiple of {alignment} bytes on {device.name} "
                                f"(got {offset})")
    if offset >= buffer.size:
        raise InvalidSubmission(f"a texel view's offset {offset} is past its buffer's {buffer.size} bytes")
    most = min((buffer.size - offset) // texel.texel_bytes, device.max_texel_elements)
    size = fields.get("size", most * texel.texel_bytes)
    if size % texel.texel_bytes or not 0 < size // texel.texel_bytes <= most:
        raise InvalidSubmission(f"a texel view of {name} from offset {offset} spans 1 to {most} whole texels of "
                                f"{texel.texel_bytes} bytes (got {size} bytes; its buffer has {buffer.size}, the "
                                f"device views at most {device.max_texel_elements} texels)")
    if len(client.views) + client.releasing[ViewRecord] >= VIEWS_PER_CLIENT:
        raise QuotaExceeded(f"a session holds at most {VIEWS_PER_CLIENT} texel views; free one first")
    view_id = client.new_id(fields.get("id"))  # before the view: a refused id leaves nothing
    device_view = device.create_view(buffer.device_buffer, texel.vk_format, offset, size)
    record = ViewRecord(view_id, buffer.id, name, device_view)
    try:
        drainer.adopt(client, record)
    except BaseException:
        device.destroy_view(device_view)
        raise
    return {"view_id": view_id, "offset": offset, "size": size}

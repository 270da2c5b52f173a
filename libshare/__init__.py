"""libshare: many processes sharing one Vulkan device through a small arbiter.

The public API is re-exported here; everything else is internal.
"""

from libshare.client.session import Session
from libshare.client.completions import Ticket
from libshare.client.connect import connect
from libshare.client.buffers import Buffer
from libshare.client.buffers import Program
from libshare.client.buffers import TexelView
from libshare.client.groups import BindGroup
from libshare.client.lists import CommandList
from libshare.compiling import compile
from libshare import manager
from libshare import shaders
from libshare.errors import AccessDenied
from libshare.errors import AlreadyServing
from libshare.errors import ArbiterLost
from libshare.errors import ArbiterRestarted
from libshare.errors import BufferLost
from libshare.errors import ArbiterUnavailable
from libshare.errors import ClientTerminated
from libshare.errors import CompileError
from libshare.errors import ConfigError
from libshare.errors import InvalidSubmission
from libshare.errors import LibshareError
from libshare.errors import ProtocolError
from libshare.errors import Quarantined
from libshare.errors import QuotaExceeded
from libshare.errors import RingCorrupted
from libshare.errors import RingFull
from libshare.errors import ServerFault
from libshare.errors import ServerNotReady
from libshare.errors import SessionClosed
from libshare.errors import StartFailed
from libshare.errors import Timeout
from libshare.errors import TooManyClients
from libshare.errors import VulkanUnavailable

__version__ = "0.1.0"

__all__ = [
    "Buffer",
    "Program",
    "TexelView",
    "BindGroup",
    "CommandList",
    "Session",
    "Ticket",
    "compile",
    "connect",
    "manager",
    "shaders",
    "AccessDenied",
    "AlreadyServing",
    "ArbiterLost",
    "ArbiterRestarted",
    "BufferLost",
    "ArbiterUnavailable",
    "ClientTerminated",
    "CompileError",
    "ConfigError",
    "InvalidSubmission",
    "LibshareError",
    "ProtocolError",
    "Quarantined",
    "QuotaExceeded",
    "RingCorrupted",
    "RingFull",
    "ServerFault",
    "ServerNotReady",
    "SessionClosed",
    "StartFailed",
    "Timeout",
    "TooManyClients",
    "VulkanUnavailable",
]

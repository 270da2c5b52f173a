"""libshare: many processes sharing one Vulkan device through a small arbiter.

The public API is re-exported here; everything else is internal.
"""

from ._session import Session as Session
from ._session import Ticket as Ticket
from ._session import connect as connect
from ._buffers import Buffer as Buffer
from ._buffers import Program as Program
from . import manager as manager
from . import shaders as shaders
from .errors import AccessDenied as AccessDenied
from .errors import ArbiterLost as ArbiterLost
from .errors import ArbiterRestarted as ArbiterRestarted
from .errors import BufferLost as BufferLost
from .errors import ArbiterUnavailable as ArbiterUnavailable
from .errors import ClientTerminated as ClientTerminated
from .errors import InvalidSubmission as InvalidSubmission
from .errors import LibshareError as LibshareError
from .errors import ProtocolError as ProtocolError
from .errors import Quarantined as Quarantined
from .errors import QuotaExceeded as QuotaExceeded
from .errors import RingCorrupted as RingCorrupted
from .errors import RingFull as RingFull
from .errors import ServerFault as ServerFault
from .errors import ServerNotReady as ServerNotReady
from .errors import SessionClosed as SessionClosed
from .errors import Timeout as Timeout
from .errors import TooManyClients as TooManyClients
from .errors import VulkanUnavailable as VulkanUnavailable

__version__ = "0.1.0"

__all__ = [
    "Buffer",
    "Program",
    "Session",
    "Ticket",
    "connect",
    "manager",
    "shaders",
    "AccessDenied",
    "ArbiterLost",
    "ArbiterRestarted",
    "BufferLost",
    "ArbiterUnavailable",
    "ClientTerminated",
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
    "Timeout",
    "TooManyClients",
    "VulkanUnavailable",
]

"""A Kubernetes device plugin for libshare: pods ask for shares of one arbiter's device.

``python -m libshare.k8s`` (or ``libshare-k8s-device-plugin``) implements the kubelet's
device-plugin API v1beta1 over gRPC: it registers a resource (``libshare.io/vulkan``) with the
kubelet and advertises one kubelet "device" per share of the arbiter at its pipe directory
(``_shares.py``: how shares are written, what an allocation of some gives a container). The
service, its health (the arbiter's ``get_server_status``) and its re-registration when the
kubelet restarts are in ``_plugin.py``, the allocations it keeps across its own restarts in
``_ledger.py``; the gRPC stubs are generated from the Kubernetes
``proto/api.proto`` on first import (``_stubs``). Needs ``grpcio``, ``grpcio-tools`` and
``protobuf``: ``pip install 'libshare[k8s]'``. Deployment: ``contrib/kubernetes/``.
"""

from libshare.k8s._plugin import API_VERSION, HEALTHY, KUBELET_SOCKET, UNHEALTHY, DevicePlugin, Options
from libshare.k8s._shares import DEFAULT_RESOURCE, Allocation, Share, allocate, group_name, parse_shares
from libshare.k8s._cli import main

__all__ = ["API_VERSION", "DEFAULT_RESOURCE", "HEALTHY", "KUBELET_SOCKET", "UNHEALTHY", "Allocation",
           "DevicePlugin", "Options", "Share", "allocate", "group_name", "main", "parse_shares"]

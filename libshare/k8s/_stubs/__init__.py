"""The kubelet device-plugin API (v1beta1) in Python: generated from ``../proto/api.proto`` on first import.

Nothing generated is committed or shipped. The first import in an environment runs protoc (the
copy inside ``grpcio-tools``, so the code matches the ``protobuf`` runtime installed beside it)
and writes ``api_pb2.py`` and ``api_pb2_grpc.py`` into a cache directory named after the SHA-256
of the proto file and the grpcio-tools, grpcio and protobuf versions; later imports load them from
there, and a change of any of the four generates afresh. That directory is then part of this
package's ``__path__``, so ``from libshare.k8s._stubs import api_pb2`` works, and so does the
import the generated ``api_pb2_grpc.py`` makes of its sibling.

The cache is ``LIBSHARE_K8S_STUB_CACHE``, else ``$XDG_CACHE_HOME/libshare/k8s-stubs``, else
``~/.cache/libshare/k8s-stubs``. Code is only ever loaded from a directory that this uid owns
and nobody else may write; when the cache cannot be made so (a read-only root file system, a
directory of another owner), the stubs are generated into a private temporary directory,
imported, and the directory removed.
"""

from __future__ import annotations

import hashlib
import importlib
import os
import shutil
import stat
import tempfile
from pathlib import Path

from libshare import settings as _settings

__all__ = ["api_pb2", "api_pb2_grpc"]

PROTO = Path(__file__).resolve().parent.parent / "proto" / "api.proto"
_PACKAGE_PATH = Path(*__name__.split("."))  # where protoc must see the proto so imports say libshare.k8s._stubs
_OUTPUTS = ("api_pb2.py", "api_pb2_grpc.py")


class StubsUnavailable(ImportError):
    """grpcio-tools is missing, or protoc refused the proto file."""


def _versions() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return ", ".join(f"{name} {version(name)}" for name in ("grpcio-tools", "grpcio", "protobuf"))
    except PackageNotFoundError as exc:
        raise StubsUnavailable(f"{exc.name} is not installed; the Kubernetes device plugin needs "
                               "grpcio, grpcio-tools and protobuf: pip install 'libshare[k8s]'") from None


def _key(proto: bytes) -> str:
    return hashlib.sha256(proto + b"\0" + _versions().encode()).hexdigest()[:32]


def _cache_root() -> Path:
    return _settings.value("k8s_stub_cache")  # LIBSHARE_K8S_STUB_CACHE, else under $XDG_CACHE_HOME


def _private(path: Path) -> bool:
    """True when ``path`` is a real directory of this uid that no other user may write."""
    try:
        info = os.lstat(path)
    except OSError:
        return False
    return (stat.S_ISDIR(info.st_mode) and info.st_uid == os.geteuid()
            and not info.st_mode & (stat.S_IWGRP | stat.S_IWOTH))


def _generate(proto: bytes, into: Path) -> None:
    """Run protoc on ``proto`` (placed where its generated imports come out right) into ``into``."""
    try:
        from grpc_tools import protoc
    except ImportError as exc:
        raise StubsUnavailable(f"grpcio-tools is not installed ({exc}); the Kubernetes device plugin "
                               "needs grpcio, grpcio-tools and protobuf: pip install 'libshare[k8s]'") from None
    with tempfile.TemporaryDirectory(prefix="libshare-proto-") as staging:
        source = Path(staging) / _PACKAGE_PATH / "api.proto"
        source.parent.mkdir(parents=True)
        source.write_bytes(proto)
        status = protoc.main(["protoc", f"-I{staging}", f"--python_out={into}", f"--grpc_python_out={into}",
                              str(source)])
    if status != 0:
        raise StubsUnavailable(f"protoc failed on {PROTO} (status {status}; its message is on stderr)")


def _cached(proto: bytes) -> Path | None:
    """The cache directory holding the generated stubs (generating them there first), or None
    when no cache directory can be trusted."""
    root = _cache_root()
    try:
        root.mkdir(mode=0o700, parents=True, exist_ok=True)
    except OSError:
        return None
    if not _private(root):
        return None
    final = root / _key(proto)
    if not _private(final):
        if final.exists() or final.is_symlink():
            return None  # not ours to load or to remove
        try:
            work = Path(tempfile.mkdtemp(prefix=".tmp-", dir=root))
        except OSError:
            return None
        try:
            _generate(proto, work)
            os.rename(work, final)  # atomic: another process either published first or sees ours whole
        except OSError:
            pass  # another process published the same stubs first
        finally:
            shutil.rmtree(work, ignore_errors=True)
        if not _private(final):
            return None
    generated = final / _PACKAGE_PATH
    return generated if all((generated / name).is_file() for name in _OUTPUTS) else None


def _load() -> tuple:
    proto = PROTO.read_bytes()
    directory = _cached(proto)
    if directory is not None:
        __path__.append(str(directory))
        return importlib.import_module(f"{__name__}.api_pb2"), importlib.import_module(f"{__name__}.api_pb2_grpc")
    with tempfile.TemporaryDirectory(prefix="libshare-stubs-") as private:
        _generate(proto, Path(private))
        __path__.append(str(Path(private) / _PACKAGE_PATH))
        try:
            return (importlib.import_module(f"{__name__}.api_pb2"),
                    importlib.import_module(f"{__name__}.api_pb2_grpc"))
        finally:
            __path__.pop()  # the modules are loaded; the directory goes


api_pb2, api_pb2_grpc = _load()

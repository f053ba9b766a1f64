"""A stand-in for NCCL's profiler plugin loader (NCCL 2.30 ``src/plugin/profiler.cc``): loads
``libnccl-profiler-lightrail.so`` with ``dlopen``, looks up ``ncclProfiler_v5`` (or ``_v6``,
``_v4``) with ``dlsym`` and calls init / startEvent / stopEvent / finalize with descriptors laid
out as NCCL's, in the order NCCL calls them for ``ncclAllReduce`` (GroupApi start, CollApi
start, CollApi stop, then at group end the GroupApi stop) and ``ncclSend``/``ncclRecv`` in a
group. Each ``load`` works on its own copy of the library, so that several instances in one
test process behave as the plugins of several processes (one per rank).

Run as a script (``python -m tests.nccl_harness PLUGIN SOCKET``), it plays one all-reduce on a
2-rank communicator ``dp`` as rank 0 and exits 0: the refusal test runs it in a child process.
"""

from __future__ import annotations

import ctypes
import itertools
import os
import shutil
import sys
import tempfile
import threading
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PLUGIN = ROOT / "agents" / "nccl" / "build" / "libnccl-profiler-lightrail.so"

# event type bits (NCCL's nccl_profiler.h)
GROUP = 1 << 0
COLL = 1 << 1
P2P = 1 << 2
PROXY_OP = 1 << 3
GROUP_API = 1 << 8
COLL_API = 1 << 9
P2P_API = 1 << 10
KERNEL_LAUNCH = 1 << 11

LOGGER = ctypes.CFUNCTYPE(None, ctypes.c_int, ctypes.c_ulong, ctypes.c_char_p, ctypes.c_int,
                          ctypes.c_char_p, ctypes.c_char_p)
"""``ncclDebugLogger_t``; the plugin always logs ``fmt="%s"`` and the text as the one
variadic argument, which the x86-64 and AArch64 Linux ABIs pass as a sixth argument."""


class _CollApi(ctypes.Structure):
    _fields_ = [("func", ctypes.c_char_p), ("count", ctypes.c_size_t),
                ("datatype", ctypes.c_char_p), ("root", ctypes.c_int),
                ("stream", ctypes.c_void_p), ("graphCaptured", ctypes.c_bool)]


class _P2pApi(ctypes.Structure):
    _fields_ = [("func", ctypes.c_char_p), ("count", ctypes.c_size_t),
                ("datatype", ctypes.c_char_p), ("stream", ctypes.c_void_p),
                ("graphCaptured", ctypes.c_bool)]


class _ProxyOp(ctypes.Structure):
    _fields_ = [("pid", ctypes.c_int), ("channelId", ctypes.c_uint8), ("peer", ctypes.c_int),
                ("nSteps", ctypes.c_int), ("chunkSize", ctypes.c_int), ("isSend", ctypes.c_int)]


class _UnionV5(ctypes.Union):
    _fields_ = [("collApi", _CollApi), ("p2pApi", _P2pApi), ("proxyOp", _ProxyOp),
                ("_v6", ctypes.c_uint8 * 104)]  # v6's largest member (ceColl) fits


class DescrV5(ctypes.Structure):
    """``ncclProfilerEventDescr_v5_t`` / ``_v6_t`` (the members the harness fills)."""

    _anonymous_ = ("u",)
    _fields_ = [("type", ctypes.c_uint64), ("parentObj", ctypes.c_void_p),
                ("rank", ctypes.c_int), ("u", _UnionV5)]


class _CollV4(ctypes.Structure):
    _fields_ = [("seqNumber", ctypes.c_uint64), ("func", ctypes.c_char_p),
                ("sendBuff", ctypes.c_void_p), ("recvBuff", ctypes.c_void_p),
                ("count", ctypes.c_size_t), ("root", ctypes.c_int),
                ("datatype", ctypes.c_char_p), ("nChannels", ctypes.c_uint8),
                ("nWarps", ctypes.c_uint8), ("algo", ctypes.c_char_p),
                ("proto", ctypes.c_char_p)]


class _P2pV4(ctypes.Structure):
    _fields_ = [("func", ctypes.c_char_p), ("buff", ctypes.c_void_p),
                ("datatype", ctypes.c_char_p), ("count", ctypes.c_size_t),
                ("peer", ctypes.c_int), ("nChannels", ctypes.c_uint8)]


class _UnionV4(ctypes.Union):
    _fields_ = [("coll", _CollV4), ("p2p", _P2pV4)]


class DescrV4(ctypes.Structure):
    """``ncclProfilerEventDescr_v4_t``."""

    _anonymous_ = ("u",)
    _fields_ = [("type", ctypes.c_uint8), ("parentObj", ctypes.c_void_p),
                ("rank", ctypes.c_int), ("u", _UnionV4)]


_VOIDPP = ctypes.POINTER(ctypes.c_void_p)
_INTP = ctypes.POINTER(ctypes.c_int)
_STOP = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_void_p)
_RECORD = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_void_p, ctypes.c_int, ctypes.c_void_p)
_FINALIZE = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_void_p)


class ProfilerV5(ctypes.Structure):
    """``ncclProfiler_v5_t`` (and ``_v6_t``)."""

    _fields_ = [
        ("name", ctypes.c_char_p),
        ("init", ctypes.CFUNCTYPE(ctypes.c_int, _VOIDPP, ctypes.c_uint64, _INTP, ctypes.c_char_p,
                                  ctypes.c_int, ctypes.c_int, ctypes.c_int, LOGGER)),
        ("startEvent", ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_void_p, _VOIDPP,
                                        ctypes.POINTER(DescrV5))),
        ("stopEvent", _STOP), ("recordEventState", _RECORD), ("finalize", _FINALIZE),
    ]


class ProfilerV4(ctypes.Structure):
    """``ncclProfiler_v4_t``."""

    _fields_ = [
        ("name", ctypes.c_char_p),
        ("init", ctypes.CFUNCTYPE(ctypes.c_int, _VOIDPP, _INTP, ctypes.c_char_p, ctypes.c_uint64,
                                  ctypes.c_int, ctypes.c_int, ctypes.c_int, LOGGER)),
        ("startEvent", ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_void_p, _VOIDPP,
                                        ctypes.POINTER(DescrV4))),
        ("stopEvent", _STOP), ("recordEventState", _RECORD), ("finalize", _FINALIZE),
    ]


_TUNER_INIT = ctypes.CFUNCTYPE(ctypes.c_int, _VOIDPP, ctypes.c_uint64, ctypes.c_size_t,
                               ctypes.c_size_t, LOGGER, ctypes.c_void_p, ctypes.c_void_p)
_TUNER_GET = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_void_p, ctypes.c_int, ctypes.c_size_t,
                              ctypes.c_int, ctypes.c_void_p, ctypes.c_int, ctypes.c_int,
                              ctypes.c_int, _INTP)


class TunerV5(ctypes.Structure):
    """``ncclTuner_v5_t``."""

    _fields_ = [("name", ctypes.c_char_p), ("init", _TUNER_INIT), ("getCollInfo", _TUNER_GET),
                ("finalize", _FINALIZE)]


class TunerV6(ctypes.Structure):
    """``ncclTuner_v6_t`` (``getChunkSize`` last)."""

    _fields_ = [*TunerV5._fields_, ("getChunkSize", ctypes.c_void_p)]


NUM_ALGORITHMS = 7
"""NCCL 2.30's cost table: Tree, Ring, CollNetDirect, CollNetChain, NVLS, NVLSTree, PAT."""
NUM_PROTOCOLS = 3
IGNORE = -1.0
FUNC = {"Broadcast": 0, "AllGather": 2, "ReduceScatter": 3, "AllReduce": 4, "SendRecv": 5}
"""``ncclFunc_t`` values."""


@dataclass(eq=False)
class Comm:
    """One communicator as NCCL holds it: the plugin's context."""

    name: str
    nranks: int
    rank: int
    context: ctypes.c_void_p


_copies = itertools.count()


@dataclass(eq=False)
class Plugin:
    """One loaded instance of the plugin (one process's), with NCCL's event mask and the lines
    it logged through NCCL's logger."""

    version: int = 5
    path: Path = PLUGIN
    echo: bool = False
    """Print each logged line at once (for a child process that the plugin may end)."""
    mask: ctypes.c_int = field(default_factory=ctypes.c_int)
    logs: list[str] = field(default_factory=list)

    def __post_init__(self) -> None:
        tmp = Path(tempfile.mkdtemp(prefix="lightrail-nccl-"))
        copy = tmp / f"libnccl-profiler-lightrail-{next(_copies)}.so"
        shutil.copy(self.path, copy)
        self._lib = ctypes.CDLL(str(copy), mode=os.RTLD_NOW | os.RTLD_LOCAL)
        shutil.rmtree(tmp)
        symbol = f"ncclProfiler_v{self.version}"
        api_type = ProfilerV4 if self.version == 4 else ProfilerV5
        self.api = api_type.in_dll(self._lib, symbol)
        self._lock = threading.Lock()

        def logger(level: int, flags: int, file: bytes | None, line: int, fmt: bytes | None,
                   text: bytes | None) -> None:
            del flags, file, line
            assert fmt == b"%s"
            line_text = f"{'WARN' if level == 2 else 'INFO'} {(text or b'').decode()}"
            with self._lock:
                self.logs.append(line_text)
            if self.echo:
                print(line_text, flush=True)

        self._logger = LOGGER(logger)  # kept alive as long as the plugin

    def init(self, name: str, nranks: int, rank: int, comm_hash: int = 0) -> Comm:
        """``ncclProfiler->init`` as ``ncclProfilerPluginInit`` calls it at communicator init."""
        ctx = ctypes.c_void_p()
        encoded = name.encode()
        if self.version == 4:
            err = self.api.init(ctypes.byref(ctx), ctypes.byref(self.mask), encoded, comm_hash,
                                1, nranks, rank, self._logger)
        else:
            err = self.api.init(ctypes.byref(ctx), comm_hash, ctypes.byref(self.mask), encoded,
                                1, nranks, rank, self._logger)
        assert err == 0, f"init returned {err}"
        return Comm(name, nranks, rank, ctx)

    def _start(self, comm: Comm, descr: DescrV5 | DescrV4) -> ctypes.c_void_p:
        handle = ctypes.c_void_p()
        assert self.api.startEvent(comm.context, ctypes.byref(handle), ctypes.byref(descr)) == 0
        return handle

    def _stop(self, handle: ctypes.c_void_p) -> None:
        if handle.value:  # NCCL stops only events whose handle is set
            assert self.api.stopEvent(handle) == 0

    def collective(self, comm: Comm, func: str, count: int, datatype: str = "ncclFloat32",
                   *, captured: bool = False) -> None:
        """One ``ncclAllReduce``-like call outside a group, as NCCL 2.30 drives the profiler:
        GroupApi start, CollApi start (the gate: may block), CollApi stop, a proxy op of the
        proxy thread (never gated), GroupApi stop. v4: the Coll task event at launch."""
        if self.version == 4:
            d4 = DescrV4(type=COLL, rank=comm.rank)
            d4.coll.func, d4.coll.count, d4.coll.datatype = func.encode(), count, datatype.encode()
            self._stop(self._start(comm, d4))
            return
        group = self._start(comm, DescrV5(type=GROUP_API, rank=comm.rank))
        d = DescrV5(type=COLL_API, rank=comm.rank)
        d.collApi.func, d.collApi.count, d.collApi.datatype = (func.encode(), count,
                                                               datatype.encode())
        d.collApi.graphCaptured = captured
        self._stop(self._start(comm, d))
        self._stop(self._start(comm, DescrV5(type=PROXY_OP, rank=comm.rank)))
        self._stop(group)

    def send_recv(self, comm: Comm, count: int, datatype: str = "ncclFloat32") -> None:
        """``ncclGroupStart(); ncclSend(); ncclRecv(); ncclGroupEnd()`` (a pipeline stage
        exchanging activations and gradients with its peer). v4: the P2p task events."""
        group = (ctypes.c_void_p() if self.version == 4
                 else self._start(comm, DescrV5(type=GROUP_API, rank=comm.rank)))
        for func in ("Send", "Recv"):
            if self.version == 4:
                d4 = DescrV4(type=P2P, rank=comm.rank)
                d4.p2p.func, d4.p2p.count, d4.p2p.datatype = (func.encode(), count,
                                                              datatype.encode())
                self._stop(self._start(comm, d4))
                continue
            d = DescrV5(type=P2P_API, rank=comm.rank)
            d.p2pApi.func, d.p2pApi.count, d.p2pApi.datatype = (func.encode(), count,
                                                                datatype.encode())
            self._stop(self._start(comm, d))
        self._stop(group)

    def finalize(self, comm: Comm) -> None:
        """``ncclProfiler->finalize`` at ``ncclCommDestroy``."""
        assert self.api.finalize(comm.context) == 0

    def tuned(self, comm_hash: int, nnodes: int, func: str,
              table: list[list[float]], version: int = 6) -> list[list[float]]:
        """The cost table after the tuner side's ``getCollInfo`` for ``func`` on the
        communicator ``comm_hash`` spanning ``nnodes`` hosts (NCCL: tuner init after the
        profiler's, then getCollInfo per collective, then finalize)."""
        api = (TunerV6 if version == 6 else TunerV5).in_dll(self._lib,
                                                            f"ncclTunerPlugin_v{version}")
        ctx = ctypes.c_void_p()
        assert api.init(ctypes.byref(ctx), comm_hash, 4, nnodes, self._logger, None, None) == 0
        flat = (ctypes.c_float * (NUM_ALGORITHMS * NUM_PROTOCOLS))(
            *(v for row in table for v in row))
        channels = ctypes.c_int(0)
        assert api.getCollInfo(ctx, FUNC[func], 1 << 20, 1, ctypes.cast(flat, ctypes.c_void_p),
                               NUM_ALGORITHMS, NUM_PROTOCOLS, 0, ctypes.byref(channels)) == 0
        assert api.finalize(ctx) == 0
        assert channels.value == 0  # the channel count stays NCCL's
        return [list(flat[a * NUM_PROTOCOLS:(a + 1) * NUM_PROTOCOLS])
                for a in range(NUM_ALGORITHMS)]


def _main(argv: list[str]) -> int:
    """Rank 0 of communicator ``dp`` (2 ranks) does one all-reduce, printing what it logs."""
    plugin = Plugin(path=Path(argv[0]), echo=True)
    os.environ["LIGHTRAIL_NCCL_SOCKET"] = argv[1]
    comm = plugin.init("dp", 2, 0)
    plugin.collective(comm, "AllReduce", 1024)
    plugin.finalize(comm)
    return 0


if __name__ == "__main__":
    sys.exit(_main(sys.argv[1:]))

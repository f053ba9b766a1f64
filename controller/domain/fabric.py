"""The fabric inventory: hosts, GPUs, NIC endpoints, switches and the wiring between them.

Pure data, no I/O. Built from a validated config (``lightrail.controller.config``) or one of the
built-in
fabrics. In a rail-optimised fabric (Opus, "photonic rails") NIC *r* of every host is on rail *r*
and every rail ends on its own optical circuit switch. On an N x N switch an endpoint's Tx fibre
lands on an ingress port and its Rx fibre on an egress port; on a duplex switch both on one port.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from lightrail.drivers.base import SwitchCapabilities, SwitchKind, SwitchSpec


class FabricError(ValueError):
    """The inventory is inconsistent; the message names the field and the value."""


@dataclass(frozen=True, slots=True, order=True)
class EndpointId:
    """A host NIC port: ``host`` name and ``nic`` index on that host."""

    host: str
    nic: int

    def __str__(self) -> str:
        return f"{self.host}/nic{self.nic}"


@dataclass(frozen=True, slots=True)
class Host:
    """A server with ``gpu_count`` GPUs in one ``failure_domain``; ``spare`` hosts run no job
    until failover needs them."""

    name: str
    failure_domain: str
    gpu_count: int
    spare: bool = False


@dataclass(frozen=True, slots=True)
class Endpoint:
    """A NIC port wired to a switch. ``tx_port`` is the ingress its Tx fibre lands on,
    ``rx_port`` the egress its Rx fibre lands on (equal on a duplex switch). ``gpu`` is the GPU
    whose traffic this NIC carries (its rail's NIC)."""

    endpoint_id: EndpointId
    gpu: int
    rail: int
    switch_id: str
    tx_port: int
    rx_port: int


@dataclass(frozen=True, slots=True)
class Switch:
    """An optical circuit switch (or silicon-photonic switch) as the controller knows it.

    ``model`` selects the driver; ``options`` carries driver settings (address, credentials
    or the environment variables holding them, emulation parameters) verbatim from config;
    they are left out of ``repr`` (a password may be among them).
    """

    switch_id: str
    model: str
    capabilities: SwitchCapabilities
    rail: int | None
    options: Mapping[str, str | int | float | bool] = field(default_factory=dict, repr=False)

    @property
    def reconfiguration_delay_s(self) -> float:
        """The reconfiguration delay (delta) of this switch in seconds."""
        return self.capabilities.settle_time_s

    @property
    def spec(self) -> SwitchSpec:
        """What the switch's driver is built from (``lightrail.drivers.base.SwitchSpec``): the
        one place the controller's switch record becomes a driver's input."""
        return SwitchSpec(self.switch_id, self.model, self.capabilities, self.options)


@dataclass(frozen=True, slots=True)
class Fabric:
    """A validated inventory. Lookups are dictionaries built once at construction."""

    name: str
    hosts: Mapping[str, Host]
    switches: Mapping[str, Switch]
    endpoints: Mapping[EndpointId, Endpoint]
    _by_gpu: Mapping[tuple[str, int], Endpoint] = field(repr=False, compare=False)

    @staticmethod
    def build(
        name: str,
        hosts: Iterable[Host],
        switches: Iterable[Switch],
        endpoints: Iterable[Endpoint],
    ) -> Fabric:
        """Validate and index an inventory.

        Raises ``FabricError`` naming the offending field when a name is duplicated, a wiring
        refers to an unknown host or switch, a port is out of range or on the wrong side, or two
        endpoints share a switch port.
        """
        host_map = _index_hosts(hosts)
        switch_map = _index_switches(switches)
        ep_map: dict[EndpointId, Endpoint] = {}
        by_gpu: dict[tuple[str, int], Endpoint] = {}
        used: dict[tuple[str, int], EndpointId] = {}
        for ep in endpoints:
            where = f"wiring[{ep.endpoint_id}]"
            if ep.endpoint_id in ep_map:
                raise FabricError(f"{where}: endpoint wired twice")
            _check_wiring(where, ep, host_map, switch_map)
            for port in {ep.tx_port, ep.rx_port}:
                prev = used.get((ep.switch_id, port))
                if prev is not None:
                    raise FabricError(
                        f"{where}: port {ep.switch_id}:{port} already wired to {prev}"
                    )
                used[(ep.switch_id, port)] = ep.endpoint_id
            gpu_key = (ep.endpoint_id.host, ep.gpu)
            if gpu_key in by_gpu:
                raise FabricError(
                    f"{where}.gpu: GPU {ep.gpu} of {ep.endpoint_id.host} has two NICs"
                )
            ep_map[ep.endpoint_id] = ep
            by_gpu[gpu_key] = ep
        return Fabric(name, host_map, switch_map, ep_map, by_gpu)

    def endpoint_of_gpu(self, host: str, gpu: int) -> Endpoint:
        """The NIC endpoint carrying ``gpu`` of ``host``; ``KeyError`` when it is not wired."""
        return self._by_gpu[(host, gpu)]

    def has_gpu(self, host: str, gpu: int) -> bool:
        """True when ``host`` exists and its ``gpu`` is wired to a switch."""
        return (host, gpu) in self._by_gpu

    @property
    def rails(self) -> tuple[int, ...]:
        """The rail numbers present, ascending."""
        return tuple(sorted({e.rail for e in self.endpoints.values()}))


def _index_hosts(hosts: Iterable[Host]) -> dict[str, Host]:
    """Hosts by name; ``FabricError`` for a duplicate name or a negative GPU count."""
    host_map: dict[str, Host] = {}
    for h in hosts:
        if h.name in host_map:
            raise FabricError(f"hosts: duplicate host name {h.name!r}")
        if h.gpu_count < 0:
            raise FabricError(f"hosts[{h.name}].gpus: must be >= 0, got {h.gpu_count}")
        host_map[h.name] = h
    return host_map


def _index_switches(switches: Iterable[Switch]) -> dict[str, Switch]:
    """Switches by id; ``FabricError`` for a duplicate id."""
    switch_map: dict[str, Switch] = {}
    for s in switches:
        if s.switch_id in switch_map:
            raise FabricError(f"switches: duplicate switch id {s.switch_id!r}")
        switch_map[s.switch_id] = s
    return switch_map


def _check_wiring(
    where: str, ep: Endpoint, host_map: Mapping[str, Host], switch_map: Mapping[str, Switch]
) -> None:
    """One endpoint's own fields: a known host with that GPU, a known switch, Tx on an ingress
    and Rx on an egress port (one port on a duplex switch). Raises ``FabricError`` naming the
    field under ``where``."""
    host = host_map.get(ep.endpoint_id.host)
    if host is None:
        raise FabricError(f"{where}.host: unknown host {ep.endpoint_id.host!r}")
    if not 0 <= ep.gpu < host.gpu_count:
        raise FabricError(f"{where}.gpu: {ep.gpu} not in 0..{host.gpu_count - 1}")
    sw = switch_map.get(ep.switch_id)
    if sw is None:
        raise FabricError(f"{where}.switch: unknown switch {ep.switch_id!r}")
    caps = sw.capabilities
    if not caps.is_ingress(ep.tx_port):
        raise FabricError(f"{where}.tx_port: {ep.tx_port} is not an ingress port")
    if not caps.is_egress(ep.rx_port):
        raise FabricError(f"{where}.rx_port: {ep.rx_port} is not an egress port")
    if caps.kind is SwitchKind.DUPLEX and ep.tx_port != ep.rx_port:
        raise FabricError(f"{where}.rx_port: a duplex port carries Tx and Rx")


def rail_fabric(
    name: str,
    hosts: int,
    gpus_per_host: int,
    *,
    delay_s: float,
    model: str = "emulated",
    spares: int = 0,
    hosts_per_domain: int | None = None,
    switch_options: Mapping[str, Mapping[str, str | int | float | bool]] | None = None,
    models: Mapping[str, str] | None = None,
) -> Fabric:
    """A rail-optimised fabric: ``hosts + spares`` hosts of ``gpus_per_host`` GPUs, one NIC per
    GPU, rail *g* = NIC *g* of every host, one N x N OCS per rail with N = hosts + spares.

    Host *i* (0-based) lands on ingress *i+1* and egress *N+i+1* of every rail's switch
    (Opus testbed wiring). ``hosts_per_domain`` groups hosts into failure domains (default: one).
    ``switch_options`` and ``models`` give a switch (by id, ``ocs-rail<r>``) driver options and
    its own model (default ``model``).
    """
    total = hosts + spares
    per_domain = hosts_per_domain or total
    host_list = [
        Host(
            name=f"host{i}",
            failure_domain=f"domain{i // per_domain}",
            gpu_count=gpus_per_host,
            spare=i >= hosts,
        )
        for i in range(total)
    ]
    caps = SwitchCapabilities(
        kind=SwitchKind.NXN, port_count=total, atomic_bulk=True, settle_time_s=delay_s
    )
    opts = switch_options or {}
    switches = [
        Switch(switch_id=f"ocs-rail{r}", model=(models or {}).get(f"ocs-rail{r}", model),
               capabilities=caps, rail=r, options=dict(opts.get(f"ocs-rail{r}", {})))
        for r in range(gpus_per_host)
    ]
    endpoints = [
        Endpoint(
            endpoint_id=EndpointId(h.name, g),
            gpu=g,
            rail=g,
            switch_id=f"ocs-rail{g}",
            tx_port=i + 1,
            rx_port=total + i + 1,
        )
        for i, h in enumerate(host_list)
        for g in range(gpus_per_host)
    ]
    return Fabric.build(name, host_list, switches, endpoints)


BUILTIN_FABRICS = {
    "demo-4x2": lambda delay_s: rail_fabric("demo-4x2", 4, 2, delay_s=delay_s),
    "rail-16x8": lambda delay_s: rail_fabric("rail-16x8", 16, 8, delay_s=delay_s),
}
"""Built-in fabrics by name: the demo's 4 hosts x 2 GPUs (2 rails, the Opus testbed shape) and
16 hosts x 8 GPUs (8 rails) for 128-rank schedules. Each takes the reconfiguration delay in s."""

MAX_RAIL_HOSTS = 65_536
"""The most hosts a ``rail:HOSTSxGPUS`` fabric may have (65,536: 524,288 GPUs at 8 per host,
beyond any cluster built; a larger number is a typo, not a fabric)."""
MAX_GPUS_PER_HOST = 64
"""The most GPUs per host of a ``rail:HOSTSxGPUS`` fabric (one NIC and one rail per GPU)."""
DEFAULT_GPUS_PER_HOST = 8
"""GPUs per host of a rail fabric sized from a job (HGX / DGX servers: 8 GPUs, 8 rail NICs)."""
MAX_RECONFIGURATION_DELAY_MS = 600_000.0
"""The largest reconfiguration delay a fabric or switch of the config may have, ms (10 min:
slower than any OCS; a larger value is a typo)."""

_RAIL_SPEC = re.compile(r"rail[:-]([0-9]+)x([0-9]+)")  # ASCII digits only


@dataclass(frozen=True, slots=True)
class RailShape:
    """The shape of a rail fabric (``rail_fabric``): ``hosts`` x ``gpus_per_host``, one NIC
    and one rail OCS per GPU index; ``name`` is the fabric's name (a built-in name, or
    ``rail-HOSTSxGPUS``)."""

    name: str
    hosts: int
    gpus_per_host: int

    @property
    def gpus(self) -> int:
        """GPUs (ranks) the fabric holds."""
        return self.hosts * self.gpus_per_host

    @property
    def option(self) -> str:
        """How to ask for this fabric on the command line: its built-in name, or
        ``rail:HOSTSxGPUS``."""
        if self.name in BUILTIN_FABRICS:
            return self.name
        return f"rail:{self.hosts}x{self.gpus_per_host}"

    def fabric(self, delay_s: float) -> Fabric:
        """The fabric, every switch with reconfiguration delay ``delay_s`` (s)."""
        return rail_fabric(self.name, self.hosts, self.gpus_per_host, delay_s=delay_s)


BUILTIN_RAIL_SHAPES = {
    "demo-4x2": RailShape("demo-4x2", 4, 2),
    "rail-16x8": RailShape("rail-16x8", 16, 8),
}
"""The shapes of ``BUILTIN_FABRICS``."""


def rail_shape(text: str) -> RailShape:
    """The rail fabric ``text`` names: a built-in name (``demo-4x2``, ``rail-16x8``) or
    ``rail:HOSTSxGPUS`` (e.g. ``rail:1152x8``: 1,152 hosts of 8 GPUs, 8 rail OCSes of 1,152
    ports each), with 1 <= HOSTS <= ``MAX_RAIL_HOSTS`` and 1 <= GPUS <= ``MAX_GPUS_PER_HOST``.
    A spec equal to a built-in shape is that built-in (``rail:16x8`` is ``rail-16x8``).

    Raises ``FabricError`` naming the value and what is wrong with it.
    """
    shape = BUILTIN_RAIL_SHAPES.get(text)
    if shape is not None:
        return shape
    m = _RAIL_SPEC.fullmatch(text)
    if m is None:
        raise FabricError(
            f"fabric {text!r}: expected a built-in fabric ({', '.join(BUILTIN_RAIL_SHAPES)}) "
            "or rail:HOSTSxGPUS, e.g. rail:1152x8")
    hosts, gpus = int(m.group(1)), int(m.group(2))
    if not 1 <= hosts <= MAX_RAIL_HOSTS:
        raise FabricError(f"fabric {text!r}: hosts must be 1..{MAX_RAIL_HOSTS}, got {hosts}")
    if not 1 <= gpus <= MAX_GPUS_PER_HOST:
        raise FabricError(
            f"fabric {text!r}: GPUs per host must be 1..{MAX_GPUS_PER_HOST}, got {gpus}")
    for builtin in BUILTIN_RAIL_SHAPES.values():
        if (builtin.hosts, builtin.gpus_per_host) == (hosts, gpus):
            return builtin
    return RailShape(f"rail-{hosts}x{gpus}", hosts, gpus)


def rail_shape_for(world_size: int, gpus_per_host: int = DEFAULT_GPUS_PER_HOST) -> RailShape:
    """The rail fabric a job of ``world_size`` ranks runs on when none is named: ``demo-4x2``
    up to 8 ranks, ``rail-16x8`` up to 128 (the built-in choice, unchanged), and above that a
    fabric exactly the job's size, so ranks fill hosts in blocks (tensor parallelism on
    NVLink): ``gpus_per_host`` GPUs per host when it divides the world size, else the largest
    number of GPUs per host below it that does, hosts = world / GPUs per host.

    Raises ``FabricError`` for a world size < 1, ``gpus_per_host`` outside
    1..``MAX_GPUS_PER_HOST``, or a job that needs more than ``MAX_RAIL_HOSTS`` hosts.
    """
    if world_size < 1:
        raise FabricError(f"world size must be >= 1, got {world_size}")
    if not 1 <= gpus_per_host <= MAX_GPUS_PER_HOST:
        raise FabricError(
            f"GPUs per host must be 1..{MAX_GPUS_PER_HOST}, got {gpus_per_host}")
    for builtin in BUILTIN_RAIL_SHAPES.values():
        if world_size <= builtin.gpus:
            return builtin
    gpus = max(g for g in range(1, gpus_per_host + 1) if world_size % g == 0)
    hosts = world_size // gpus
    if hosts > MAX_RAIL_HOSTS:
        need = math.ceil(world_size / MAX_RAIL_HOSTS)
        raise FabricError(
            f"a job of {world_size} ranks needs {hosts} hosts of {gpus} GPUs, more than "
            f"{MAX_RAIL_HOSTS} (MAX_RAIL_HOSTS); at least {need} GPUs per host would be needed")
    return rail_shape(f"rail:{hosts}x{gpus}")

"""Controller configuration: one schema, used by the daemon and ``lightrail check-config``.

YAML in, validated by pydantic models with ``extra="forbid"``: unknown keys and wrong types are
rejected, and ``ConfigError`` lists each problem with its field path (``fabric.switches.0.ports``)
and the offending value. A missing file section takes its documented default, so an empty file
(or no file) gives the embedded demo configuration.
"""

from __future__ import annotations

import os
import socket
from pathlib import Path
from typing import Annotated, Any, Literal

import yaml
from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    model_validator,
)

from lightrail.controller.domain.fabric import (
    BUILTIN_FABRICS,
    MAX_RECONFIGURATION_DELAY_MS,
    Endpoint,
    EndpointId,
    Fabric,
    FabricError,
    Host,
    Switch,
    rail_fabric,
)
from lightrail.drivers.base import SwitchCapabilities, SwitchKind


class ConfigError(ValueError):
    """The configuration is invalid. ``problems`` holds one line per problem, each starting
    with the field path."""

    def __init__(self, source: str, problems: list[str]) -> None:
        self.source = source
        self.problems = problems
        super().__init__(f"{source}: invalid configuration:\n  " + "\n  ".join(problems))


class _Strict(BaseModel):
    # strict: no silent coercion (``true`` is not 1.0, "5" is not 5); finite floats only.
    model_config = ConfigDict(extra="forbid", frozen=True, strict=True, allow_inf_nan=False)


def _check_host_port(value: str) -> str:
    host, _, port = value.rpartition(":")
    if not host or not port.isdecimal() or not 0 <= int(port) <= 65535:
        raise ValueError(f"expected HOST:PORT with a port in 0..65535, got {value!r}")
    return value


HostPort = Annotated[str, AfterValidator(_check_host_port)]

WILDCARD_HOSTS = frozenset({"0.0.0.0", "::", "[::]", ""})
"""Hosts that bind every interface: a listen address, never one a client can dial."""


def _check_advertise(value: str) -> str:
    host, _, port = value.rpartition(":")
    if host in WILDCARD_HOSTS:
        raise ValueError(f"{value!r} binds every interface; advertise an address clients can "
                         "dial (this host's name or IP)")
    if int(port) == 0:
        raise ValueError(f"{value!r}: advertise the port clients dial, not 0")
    return value


AdvertiseAddress = Annotated[str, AfterValidator(_check_host_port),
                             AfterValidator(_check_advertise)]
MAX_GPUS = 1 << 17  # 131,072: far beyond one OCS tier; keeps check-config fast


MIN_POWER_POLL_INTERVAL_S = 0.5
"""The shortest power poll interval (seconds) other than 0 (off): a device answers its power
readings between reconfigurations, so a faster poll would compete with them."""


def _check_power_poll_interval(value: float) -> float:
    if 0 < value < MIN_POWER_POLL_INTERVAL_S:
        raise ValueError(f"0 turns power polling off, else at least "
                         f"{MIN_POWER_POLL_INTERVAL_S:g} s, got {value:g}")
    return value


class ControllerSection(_Strict):
    """The daemon itself. ``tls``: TLS on the gRPC port (``ControllerTlsSection``; none:
    plaintext, and a listen address beyond loopback is logged as a warning at start).
    ``operators``: who may make mutating operator calls (``OperatorConfig``; none: only
    callers on loopback may, logged as a warning at start). README "Security"."""

    replica_id: str = Field(default_factory=socket.gethostname, min_length=1)
    listen: HostPort = "127.0.0.1:50051"
    tls: ControllerTlsSection | None = None
    operators: list[OperatorConfig] = Field(default_factory=list)
    advertise: AdvertiseAddress | None = Field(
        default=None,
        description="the address (HOST:PORT) this replica publishes in etcd while it leads, "
                    "where standbys redirect agents and operators; default: the listen "
                    "address with the port bound (this host's name when listen binds every "
                    "interface)")
    metrics_listen: HostPort = "127.0.0.1:9464"
    power_poll_interval_s: Annotated[float, AfterValidator(_check_power_poll_interval)] = Field(
        default=10.0, ge=0, le=3600,
        description="how often the leader reads the optical power of the ports that carry a "
                    "cross-connect (lightrail_port_power_dbm), seconds; 0 turns polling off")
    admission_timeout_s: float = Field(default=30.0, gt=0, le=24 * 3600)
    device_wait_s: float = Field(
        default=2.0, ge=0, le=3600,
        description="how long a phase may wait for a switch its driver cannot reach before it "
                    "is refused DEVICE_FAILURE naming the switch, seconds (below "
                    "admission_timeout_s; 0: at once); phases on confirmed circuits and on "
                    "other switches are not affected")
    job_idle_expiry_s: float | None = Field(
        default=600.0, gt=0, le=30 * 24 * 3600,
        description="unregister a job with no open phase stream, waiting call or watch for "
                    "this long, seconds (its client is gone: its holds are released, its "
                    "circuits stay); null turns expiry off")
    shutdown_timeout_s: float = Field(default=10.0, gt=0, le=600)
    provisioning: bool = Field(
        default=True,
        description="switch to the next phase's circuits as soon as the current one is "
                    "released, on a learned or declared schedule (Opus)")
    learn_iterations: int = Field(
        default=2, ge=1,
        description="how many times a transition must repeat before it is provisioned")
    reconfigure_or_not: bool = Field(
        default=False,
        description="decide per phase whether new circuits pay for their reconfiguration "
                    "delay (PCCL), using the callers' byte-count hints and the cost model")
    link_gbps: float = Field(default=100.0, gt=0, le=100_000,
                             description="rail link bandwidth for the cost model, Gb/s")
    link_alpha_us: float = Field(default=5.0, ge=0, le=1_000_000,
                                 description="per-hop latency for the cost model, µs")
    heartbeat_interval_s: float = Field(
        default=1.0, gt=0, le=60,
        description="how often host agents send a health heartbeat")
    heartbeat_deadline_s: float = Field(
        default=3.0, gt=0, le=600,
        description="a host silent this long counts as failed (all its GPUs fail over)")
    recovery_grace_s: float = Field(
        default=10.0, ge=0, le=3600,
        description="after a restart, how long the hosts of a recovered job have to come "
                    "back: a host not heard from by then is declared dead and its ranks stop "
                    "keeping the job's circuits frozen (a live host's ranks stay frozen until "
                    "they resync or its heartbeat deadline passes: no timer is a go-ahead)")

    @model_validator(mode="after")
    def _device_wait_below_timeout(self) -> ControllerSection:
        if self.device_wait_s >= self.admission_timeout_s:
            raise ValueError(
                f"device_wait_s: {self.device_wait_s:g} s must be below admission_timeout_s "
                f"({self.admission_timeout_s:g} s), or a phase would time out before it is "
                "told which switch it waits for")
        return self

    @model_validator(mode="after")
    def _operators_identifiable(self) -> ControllerSection:
        seen: set[str] = set()
        for i, op in enumerate(self.operators):
            if op.name in seen:
                raise ValueError(f"operators.{i}.name: {op.name!r} is listed twice")
            seen.add(op.name)
            if op.subject is not None and (self.tls is None or self.tls.client_ca_file is None):
                raise ValueError(
                    f"operators.{i}.subject: {op.subject!r} needs controller.tls.client_ca_file "
                    "(client certificates are verified, and their subjects known, only then)")
        return self


def _check_readable_file(value: str) -> str:
    path = Path(value)
    if not path.is_file():
        raise ValueError(f"no such file: {value!r}")
    if not os.access(path, os.R_OK):
        raise ValueError(f"file not readable: {value!r}")
    return value


ReadableFile = Annotated[str, AfterValidator(_check_readable_file)]
"""A path (relative to the working directory) to a file that exists and is readable now."""


class ControllerTlsSection(_Strict):
    """TLS on the controller's gRPC port (AgentService, OperatorService, health): ``cert_file``
    and ``key_file`` (PEM) are the server certificate, which must name every host clients dial
    (the listen or advertised host, as DNS or IP subjectAltName); with ``client_ca_file`` (PEM)
    every client must present a certificate signed by that CA (mTLS: host agents, the CLI,
    job clients), and an operator may be identified by its certificate's subject CN
    (``OperatorConfig.subject``)."""

    cert_file: ReadableFile
    key_file: ReadableFile
    client_ca_file: ReadableFile | None = None


def _check_sha256_hex(value: str) -> str:
    if len(value) != 64 or any(c not in "0123456789abcdef" for c in value):
        raise ValueError("expected the SHA-256 of the token as 64 lowercase hex digits "
                         "(printf %s \"$TOKEN\" | sha256sum), got "
                         f"{len(value)} characters")
    return value


Sha256Hex = Annotated[str, AfterValidator(_check_sha256_hex)]


class OperatorConfig(_Strict):
    """One operator who may make mutating operator calls (Failover, Drain): ``name`` (in the
    audit log), identified by ``token_sha256`` (the SHA-256, hex, of the bearer token it
    presents: ``authorization: Bearer <token>``; the token itself is never stored) and/or
    ``subject`` (the subject CN of its client certificate; needs
    ``controller.tls.client_ca_file``)."""

    name: str = Field(min_length=1)
    token_sha256: Sha256Hex | None = None
    subject: str | None = Field(default=None, min_length=1)

    @model_validator(mode="after")
    def _one_identity(self) -> OperatorConfig:
        if self.token_sha256 is None and self.subject is None:
            raise ValueError(f"operator {self.name!r}: give token_sha256 or subject (or both)")
        return self


class EtcdTlsSection(_Strict):
    """TLS to every etcd member: ``ca_file`` (PEM) verifies the members' certificates (each must
    name the host its endpoint dials); ``cert_file`` and ``key_file`` (PEM, both or neither) are
    the client certificate that etcd's ``--client-cert-auth`` requires."""

    ca_file: ReadableFile
    cert_file: ReadableFile | None = None
    key_file: ReadableFile | None = None

    @model_validator(mode="after")
    def _cert_with_key(self) -> EtcdTlsSection:
        if self.cert_file is not None and self.key_file is None:
            raise ValueError(f"cert_file {self.cert_file!r} is given without key_file: a client "
                             "certificate needs its private key")
        if self.key_file is not None and self.cert_file is None:
            raise ValueError(f"key_file {self.key_file!r} is given without cert_file: a private "
                             "key needs its client certificate")
        return self


class EtcdSection(_Strict):
    """Where state lives: every member of the etcd cluster (``endpoints``, all used: calls fail
    over between them), TLS to them when ``tls`` is set. ``embedded: true`` starts a private
    single-member etcd (demo only)."""

    endpoints: list[HostPort] = Field(default_factory=lambda: ["127.0.0.1:2379"], min_length=1)
    tls: EtcdTlsSection | None = None
    lease_ttl_s: float = Field(default=10.0, ge=2, le=3600)
    embedded: bool = False


class HostConfig(_Strict):
    name: str = Field(min_length=1)
    failure_domain: str = "default"
    gpus: int = Field(ge=0)
    spare: bool = False


OptionValue = str | int | float | bool


class SwitchConfig(_Strict):
    id: str = Field(min_length=1)
    model: str = "emulated"
    kind: Literal["nxn", "duplex"] = "nxn"
    ports: int = Field(gt=0, le=MAX_GPUS,
                       description="N: an N x N switch has ingress 1..N, egress N+1..2N")
    rail: int | None = Field(default=None, ge=0)
    reconfiguration_delay_ms: float = Field(default=10.0, ge=0, le=MAX_RECONFIGURATION_DELAY_MS)
    max_batch: int | None = Field(default=None, gt=0)
    options: dict[str, OptionValue] = Field(default_factory=dict)


class WiringConfig(_Strict):
    host: str
    nic: int = Field(ge=0)
    gpu: int = Field(ge=0)
    rail: int = Field(ge=0)
    switch: str
    tx_port: int = Field(gt=0)
    rx_port: int = Field(gt=0)


class RailFabricConfig(_Strict):
    """A generated rail-optimised fabric (``lightrail.controller.domain.fabric.rail_fabric``): one
    NIC per GPU,
    rail g = NIC g of every host, one N x N OCS per rail with N = hosts + spares."""

    hosts: int = Field(gt=0, le=MAX_GPUS)
    gpus_per_host: int = Field(gt=0, le=64)
    spares: int = Field(default=0, ge=0, le=MAX_GPUS)
    hosts_per_domain: int | None = Field(default=None, gt=0)
    model: str = "emulated"
    models: dict[str, str] = Field(
        default_factory=dict, description="driver model per switch id (default: model)")
    switch_options: dict[str, dict[str, OptionValue]] = Field(
        default_factory=dict, description="driver options per switch id (ocs-rail<r>)")


class FabricSection(_Strict):
    """Exactly one of: ``builtin`` (demo-4x2, rail-16x8), ``rail`` (generated) or an inline
    inventory (``name``, ``hosts``, ``switches``, ``wiring``). Nothing given: demo-4x2."""

    builtin: Literal["demo-4x2", "rail-16x8"] | None = None
    rail: RailFabricConfig | None = None
    reconfiguration_delay_ms: float = Field(default=10.0, ge=0, le=MAX_RECONFIGURATION_DELAY_MS)
    name: str | None = None
    hosts: list[HostConfig] = Field(default_factory=list)
    switches: list[SwitchConfig] = Field(default_factory=list)
    wiring: list[WiringConfig] = Field(default_factory=list)

    @model_validator(mode="after")
    def _one_source(self) -> FabricSection:
        inline = bool(self.hosts or self.switches or self.wiring)
        given = [n for n, v in (("builtin", self.builtin is not None),
                                ("rail", self.rail is not None),
                                ("hosts/switches/wiring", inline)) if v]
        if self.rail is not None and (
                (self.rail.hosts + self.rail.spares) * self.rail.gpus_per_host > MAX_GPUS):
            raise ValueError(f"rail: more than {MAX_GPUS} GPUs")
        if len(given) > 1:
            raise ValueError(f"give one of builtin, rail or hosts/switches/wiring, not "
                             f"{' and '.join(given)}")
        if inline and not self.name:
            raise ValueError("name: required for an inline fabric")
        return self


def _check_topic_prefix(value: str) -> str:
    if not value or value.startswith("/") or value.endswith("/") or "//" in value:
        raise ValueError(f"expected topic levels joined by '/', no leading, trailing or empty "
                         f"level, got {value!r}")
    if any(c in value for c in "+#\0"):
        raise ValueError(f"a topic prefix may not hold the wildcards + or # (or NUL), "
                         f"got {value!r}")
    return value


class MqttTlsSection(EtcdTlsSection):
    """TLS to the MQTT broker: ``ca_file`` (PEM) verifies the broker's certificate;
    ``cert_file`` and ``key_file`` (PEM, both or neither) are a client certificate."""


class MqttSection(_Strict):
    """Events out and device alarms in over MQTT (README "Events and alarms (MQTT)"); the
    section absent: no MQTT. The leader publishes under ``topic_prefix`` (default
    ``lightrail/<fabric name>``) and subscribes to ``<topic_prefix>/alarms/+``. Credentials:
    ``username`` or ``username_env`` (an environment variable's name) and ``password_env`` or
    ``password_file`` (e.g. a systemd credential, ``$CREDENTIALS_DIRECTORY/mqtt-password``),
    read at start; never written in this file."""

    host: str = Field(min_length=1, description="the broker's host name or IP address")
    port: int = Field(default=1883, ge=1, le=65535)
    topic_prefix: Annotated[str, AfterValidator(_check_topic_prefix)] | None = Field(
        default=None, description="topics go under this; default lightrail/<fabric name>")
    client_id: str | None = Field(
        default=None, min_length=1, max_length=128,
        description="MQTT client identifier; default lightrail-<replica_id>")
    keepalive_s: int = Field(
        default=30, ge=5, le=3600,
        description="MQTT keepalive, seconds: the broker publishes the offline status (the "
                    "last will) after 1.5 x this of silence")
    username: str | None = Field(default=None, min_length=1)
    username_env: str | None = Field(default=None, min_length=1,
                                     description="environment variable holding the username")
    password_env: str | None = Field(default=None, min_length=1,
                                     description="environment variable holding the password")
    password_file: str | None = Field(default=None, min_length=1,
                                      description="file holding the password (first line)")
    tls: MqttTlsSection | None = None
    buffer_events: int = Field(
        default=1000, ge=1, le=1_000_000,
        description="events kept while the broker is away; beyond this the oldest are "
                    "dropped (lightrail_mqtt_events_dropped_total)")

    @model_validator(mode="after")
    def _one_source_each(self) -> MqttSection:
        if self.username is not None and self.username_env is not None:
            raise ValueError(f"give username or username_env, not both (got {self.username!r} "
                             f"and {self.username_env!r})")
        if self.password_env is not None and self.password_file is not None:
            raise ValueError(f"give password_env or password_file, not both (got "
                             f"{self.password_env!r} and {self.password_file!r})")
        if (self.password_env or self.password_file) and not (self.username
                                                              or self.username_env):
            raise ValueError("a password needs username or username_env")
        return self


class LoggingSection(_Strict):
    level: Literal["debug", "info", "warning", "error"] = "info"
    format: Literal["json", "console"] = "json"


class Config(_Strict):
    """The whole file."""

    controller: ControllerSection = Field(default_factory=ControllerSection)
    etcd: EtcdSection = Field(default_factory=EtcdSection)
    fabric: FabricSection = Field(default_factory=FabricSection)
    logging: LoggingSection = Field(default_factory=LoggingSection)
    mqtt: MqttSection | None = None


_SECRET_WORDS = ("password", "token", "secret")
"""A field whose path has one of these in a name may hold a credential (a switch's
``options.password``, an operator's ``token_sha256`` that may be a token pasted by mistake):
its value is never shown in an error."""


def _is_secret(loc: tuple[int | str, ...]) -> bool:
    return any(isinstance(p, str) and any(w in p.lower() for w in _SECRET_WORDS)
               and not p.endswith("_env") for p in loc)


def _format(exc: ValidationError) -> list[str]:
    lines = []
    for err in exc.errors():
        path = ".".join(str(p) for p in err["loc"]) or "(top level)"
        value = err.get("input")
        shown = ("" if isinstance(value, dict)
                 else " (value not shown)" if _is_secret(err["loc"])
                 else f" (got {value!r})")
        lines.append(f"{path}: {err['msg']}{shown}")
    return lines


def parse_config(data: Any, source: str = "<config>") -> Config:
    """Validate a parsed YAML document. Raises ``ConfigError`` listing every problem."""
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise ConfigError(source, [f"(top level): expected a mapping, got {type(data).__name__}"])
    try:
        cfg = Config.model_validate(data)
    except ValidationError as exc:
        raise ConfigError(source, _format(exc)) from None
    try:
        build_fabric(cfg.fabric)
    except FabricError as exc:
        raise ConfigError(source, [f"fabric.{exc}"]) from None
    return cfg


def load_config(path: Path | None) -> Config:
    """Read and validate a YAML file (None: all defaults, the embedded demo fabric).

    Raises ``ConfigError`` for an unreadable file, bad YAML, unknown keys, wrong types and an
    inconsistent fabric.
    """
    if path is None:
        return parse_config({}, "<defaults>")
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise ConfigError(str(path), [f"(file): cannot read: {exc.strerror}"]) from None
    except UnicodeDecodeError as exc:
        raise ConfigError(str(path), [f"(file): not UTF-8 text (byte {exc.start})"]) from None
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise ConfigError(str(path), [f"(yaml): {exc}"]) from None
    return parse_config(data, str(path))


def build_fabric(section: FabricSection) -> Fabric:
    """The ``Fabric`` a validated section describes. Raises ``FabricError``."""
    delay_s = section.reconfiguration_delay_ms / 1000.0
    inline = bool(section.hosts or section.switches or section.wiring)
    if section.builtin is not None or (section.rail is None and not inline):
        return BUILTIN_FABRICS[section.builtin or "demo-4x2"](delay_s)
    if section.rail is not None:
        r = section.rail
        return rail_fabric(section.name or f"rail-{r.hosts}x{r.gpus_per_host}", r.hosts,
                           r.gpus_per_host, delay_s=delay_s, model=r.model, spares=r.spares,
                           hosts_per_domain=r.hosts_per_domain, switch_options=r.switch_options,
                           models=r.models)
    hosts = [Host(h.name, h.failure_domain, h.gpus, h.spare) for h in section.hosts]
    switches = [
        Switch(
            switch_id=s.id,
            model=s.model,
            capabilities=SwitchCapabilities(
                kind=SwitchKind(s.kind),
                port_count=s.ports,
                atomic_bulk=True,
                settle_time_s=s.reconfiguration_delay_ms / 1000.0,
                max_batch=s.max_batch,
            ),
            rail=s.rail,
            options=dict(s.options),
        )
        for s in section.switches
    ]
    endpoints = [
        Endpoint(EndpointId(w.host, w.nic), w.gpu, w.rail, w.switch, w.tx_port, w.rx_port)
        for w in section.wiring
    ]
    return Fabric.build(section.name or "fabric", hosts, switches, endpoints)

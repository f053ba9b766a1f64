"""The security rules that need no socket (issue 10, section 6): the operator check's decisions
on a stand-in gRPC context (a peer beyond loopback cannot be made on a test machine's
loopback), loopback peers as gRPC names them, the ``controller.tls``/``controller.operators``
schema, config errors that never show a credential, and the client's TLS files."""

from __future__ import annotations

from collections.abc import MutableMapping, Sequence
from pathlib import Path
from typing import Any, NoReturn

import grpc
import pytest

from lightrail.agents.channel import ClientTls, ClientTlsError, tls_hint
from lightrail.controller.api.auth import (
    OperatorAuth,
    OperatorIdentity,
    is_loopback_peer,
    token_sha256,
)
from lightrail.controller.config import ConfigError, parse_config
from lightrail.controller.domain.fabric import rail_fabric

TOKEN = "s3cr3t-operator-token"


class Aborted(Exception):
    def __init__(self, code: grpc.StatusCode, details: str) -> None:
        super().__init__(f"{code.name}: {details}")
        self.code = code
        self.details = details


class FakeContext:
    """The three things ``OperatorAuth.require`` reads from a ``ServicerContext``, and its
    ``abort``."""

    def __init__(self, peer: str, metadata: Sequence[tuple[str, str]] = (),
                 subject: str | None = None) -> None:
        self._peer = peer
        self._metadata = tuple(metadata)
        self._auth = {} if subject is None else {"x509_common_name": [subject.encode()]}

    def peer(self) -> str:
        return self._peer

    def invocation_metadata(self) -> tuple[tuple[str, str], ...]:
        return self._metadata

    def auth_context(self) -> dict[str, list[bytes]]:
        return self._auth

    async def abort(self, code: grpc.StatusCode, details: str) -> NoReturn:
        raise Aborted(code, details)


def bearer(token: str) -> list[tuple[str, str]]:
    return [("authorization", f"Bearer {token}")]


async def require(auth: OperatorAuth, ctx: FakeContext, call: str = "Drain") -> str:
    return await auth.require(ctx, call)  # type: ignore[arg-type]


@pytest.mark.parametrize(("peer", "loopback"), [
    ("ipv4:127.0.0.1:5000", True), ("ipv4:127.3.4.5:1", True), ("ipv6:[::1]:5000", True),
    ("ipv6:%5B::1%5D:5000", True), ("ipv6:[::ffff:127.0.0.1]:5000", True),
    ("unix:/run/lightrail/agent.sock", True), ("ipv4:10.1.2.3:5000", False),
    ("ipv6:[2001:db8::1]:5000", False), ("ipv6:[::ffff:10.0.0.1]:5000", False),
    ("dns:example:1", False), ("ipv4:not-an-ip:1", False),
])
def test_loopback_peers(peer: str, loopback: bool) -> None:
    assert is_loopback_peer(peer) is loopback


async def test_no_operators_means_loopback_only() -> None:
    auth = OperatorAuth([])
    assert await require(auth, FakeContext("ipv4:127.0.0.1:4000")) == "loopback"
    with pytest.raises(Aborted) as info:
        await require(auth, FakeContext("ipv4:10.0.0.7:4000", bearer(TOKEN)), "Failover")
    assert info.value.code is grpc.StatusCode.PERMISSION_DENIED
    assert info.value.details.startswith("Failover: no operator is configured")
    assert "ipv4:10.0.0.7:4000" in info.value.details
    assert TOKEN not in info.value.details


async def test_tokens_and_subjects_name_operators() -> None:
    auth = OperatorAuth([OperatorIdentity("ops", token_sha256=token_sha256(TOKEN)),
                         OperatorIdentity("alice", subject="alice")])
    remote = "ipv4:10.0.0.7:4000"
    assert await require(auth, FakeContext(remote, bearer(TOKEN))) == "ops"
    assert await require(auth, FakeContext(remote, subject="alice")) == "alice"
    # a token wins over the certificate: an agent's certificate plus the operator's token
    assert await require(auth, FakeContext(remote, bearer(TOKEN), subject="agent-1")) == "ops"
    cases = [
        (FakeContext(remote, bearer("wrong")), grpc.StatusCode.UNAUTHENTICATED,
         "Drain: the bearer token matches no operator"),
        (FakeContext(remote, subject="agent-1"), grpc.StatusCode.PERMISSION_DENIED,
         "Drain: client certificate subject CN 'agent-1' is not an operator"),
        (FakeContext(remote), grpc.StatusCode.UNAUTHENTICATED,
         "Drain needs an operator identity"),
        # configured operators: loopback is no identity
        (FakeContext("ipv4:127.0.0.1:1"), grpc.StatusCode.UNAUTHENTICATED,
         "Drain needs an operator identity"),
        (FakeContext(remote, [("authorization", f"Basic {TOKEN}")]),
         grpc.StatusCode.UNAUTHENTICATED, "Drain needs an operator identity"),
    ]
    for ctx, code, message in cases:
        with pytest.raises(Aborted) as info:
            await require(auth, ctx)
        assert (info.value.code, info.value.details[:len(message)]) == (code, message)
        assert TOKEN not in info.value.details and "wrong" not in info.value.details


def test_duplicate_operator_names_are_refused() -> None:
    with pytest.raises(ValueError, match="listed twice"):
        OperatorAuth([OperatorIdentity("a", subject="x"), OperatorIdentity("a", subject="y")])


def _problems(doc: dict[str, object]) -> list[str]:
    with pytest.raises(ConfigError) as info:
        parse_config(doc)
    return info.value.problems


def test_controller_tls_and_operators_schema(tmp_path: Path) -> None:
    pem = tmp_path / "c.pem"
    pem.write_text("-----BEGIN CERTIFICATE-----\n")
    ok = parse_config({"controller": {
        "tls": {"cert_file": str(pem), "key_file": str(pem), "client_ca_file": str(pem)},
        "operators": [{"name": "alice", "subject": "alice"},
                      {"name": "ops", "token_sha256": token_sha256(TOKEN)}]}})
    assert ok.controller.tls is not None
    assert [o.name for o in ok.controller.operators] == ["alice", "ops"]
    missing = str(tmp_path / "missing.pem")
    assert _problems({"controller": {"tls": {"cert_file": missing, "key_file": str(pem)}}}) == [
        f"controller.tls.cert_file: Value error, no such file: {missing!r} (got {missing!r})"]
    [problem] = _problems({"controller": {"operators": [{"name": "a", "subject": "a"}]}})
    assert "operators.0.subject: 'a' needs controller.tls.client_ca_file" in problem
    [problem] = _problems({"controller": {"operators": [{"name": "a"}]}})
    assert problem.startswith("controller.operators.0: ")
    assert "give token_sha256 or subject" in problem
    [problem] = _problems({"controller": {"operators": [
        {"name": "a", "token_sha256": token_sha256("x")},
        {"name": "a", "token_sha256": token_sha256("y")}]}})
    assert "operators.1.name: 'a' is listed twice" in problem
    # a token pasted where its hash belongs is refused and never shown
    [problem] = _problems({"controller": {"operators": [{"name": "a", "token_sha256": TOKEN}]}})
    assert problem.startswith("controller.operators.0.token_sha256: ")
    assert "64 lowercase hex digits" in problem
    assert TOKEN not in problem


def test_listen_defaults_are_loopback() -> None:
    ccfg = parse_config({}).controller
    assert ccfg.listen.startswith("127.0.0.1:")
    assert ccfg.metrics_listen.startswith("127.0.0.1:")
    assert ccfg.tls is None and ccfg.operators == []


def test_config_errors_never_show_a_password() -> None:
    problems = _problems({"fabric": {"rail": {"hosts": 2, "gpus_per_host": 1, "switch_options": {
        "ocs-rail0": {"password": ["hunter2-leak"], "password_env": ["ENV_NAME_SHOWN"]}}}}})
    text = "\n".join(problems)
    assert "hunter2-leak" not in text
    assert "password.str: Input should be a valid string (value not shown)" in text
    assert "ENV_NAME_SHOWN" in text  # the name of a variable is no secret


def test_switch_options_stay_out_of_repr() -> None:
    fabric = rail_fabric("f", 2, 1, delay_s=0.0,
                         switch_options={"ocs-rail0": {"password": "hunter2-leak"}})
    switch = fabric.switches["ocs-rail0"]
    assert switch.options["password"] == "hunter2-leak"
    assert "hunter2-leak" not in repr(switch)
    assert "hunter2-leak" not in repr(switch.spec)


def test_client_tls_files(tmp_path: Path) -> None:
    pem = tmp_path / "ca.pem"
    pem.write_text("-----BEGIN CERTIFICATE-----\nAAAA\n-----END CERTIFICATE-----\n")
    key = tmp_path / "key.pem"
    key.write_text("-----BEGIN PRIVATE KEY-----\nSECRETKEYBYTES\n-----END PRIVATE KEY-----\n")
    tls = ClientTls.from_files(pem, pem, key)
    assert tls.key_pem is not None and b"SECRETKEYBYTES" in tls.key_pem
    assert "SECRETKEYBYTES" not in repr(tls)
    with pytest.raises(ClientTlsError, match="--tls-cert is given without --tls-key"):
        ClientTls.from_files(pem, pem, None)
    with pytest.raises(ClientTlsError, match="--tls-key is given without --tls-cert"):
        ClientTls.from_files(pem, None, key)
    with pytest.raises(ClientTlsError, match=r"--tls-ca: cannot read '.*nope.pem': No such file"):
        ClientTls.from_files(tmp_path / "nope.pem")
    text = tmp_path / "notes.txt"
    text.write_text("hello")
    with pytest.raises(ClientTlsError, match=r"--tls-ca: '.*notes\.txt' is not a PEM file"):
        ClientTls.from_files(text)


def test_tls_hints() -> None:
    closed = "failed to connect to all addresses; last error: UNAVAILABLE: ipv4:1: Socket closed"
    assert "may require TLS" in tls_hint(closed, None)
    tls = ClientTls(None, None, None)
    assert "client certificate" in tls_hint(closed, tls)
    assert tls_hint("Socket closed", None) == ""  # a stream that broke later: no TLS guess
    assert "does not name the host" in tls_hint("Hostname Verification Check failed.", tls)
    assert "does not speak TLS" in tls_hint("SSL_ERROR_SSL: WRONG_VERSION_NUMBER", tls)
    assert tls_hint("Connection refused", tls) == ""


async def test_start_warnings_and_tls_setup_errors(tmp_path: Path) -> None:
    """Plaintext beyond loopback and no operators are logged as warnings at start; a TLS file
    that is no certificate fails with the files named."""
    from structlog.testing import capture_logs

    from lightrail.controller.app import TlsSetupError, _bind, _operator_auth
    from lightrail.controller.config import (
        ControllerSection,
        ControllerTlsSection,
        OperatorConfig,
    )

    def warnings(logs: Sequence[MutableMapping[str, Any]]) -> list[object]:
        return [e["event"] for e in logs if e["log_level"] == "warning"]

    for listen, expected in (("127.0.0.1:0", []), ("localhost:0", []),
                             ("0.0.0.0:0", ["grpc_plaintext_beyond_loopback"])):
        server = grpc.aio.server()
        with capture_logs() as logs:
            assert _bind(server, ControllerSection(listen=listen)) > 0
        await server.stop(None)
        assert warnings(logs) == expected, listen
    with capture_logs() as logs:
        _operator_auth(ControllerSection())
        _operator_auth(ControllerSection(operators=[OperatorConfig(name="a",
                                                                   token_sha256="0" * 64)]))
    assert warnings(logs) == ["no_operators_configured"]
    junk = tmp_path / "junk.pem"
    junk.write_text("not a certificate")
    tls = ControllerTlsSection(cert_file=str(junk), key_file=str(junk))
    server = grpc.aio.server()
    with pytest.raises(TlsSetupError, match=r"controller.tls: cannot serve 127.0.0.1:0 with "
                                            r"cert_file '.*junk.pem' and key_file"):
        _bind(server, ControllerSection(listen="127.0.0.1:0", tls=tls))
    await server.stop(None)

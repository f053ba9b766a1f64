"""Driver credentials from the environment or systemd's credentials directory
(``lightrail.drivers.credentials.CredentialEnviron``), as the TL1/RESTCONF drivers look them
up."""

from __future__ import annotations

from pathlib import Path

import pytest

from lightrail.drivers.credentials import CredentialEnviron


@pytest.fixture
def creds(tmp_path: Path) -> Path:
    (tmp_path / "POLATIS_PASSWORD").write_text("from-file\n", encoding="utf-8")
    (tmp_path / "TWO_LINES").write_text("a\nb\n\n", encoding="utf-8")
    return tmp_path


def test_environment_first_then_the_credentials_directory(creds: Path) -> None:
    env = CredentialEnviron({"POLATIS_USER": "admin", "CREDENTIALS_DIRECTORY": str(creds)})
    assert env["POLATIS_USER"] == "admin"
    assert env["POLATIS_PASSWORD"] == "from-file"  # one trailing newline removed
    assert env["TWO_LINES"] == "a\nb\n"
    assert env.get("MISSING") is None
    both = CredentialEnviron({"POLATIS_PASSWORD": "from-env"}, directory=creds)
    assert both["POLATIS_PASSWORD"] == "from-env"
    assert set(env) >= {"POLATIS_USER", "POLATIS_PASSWORD", "TWO_LINES"}


def test_no_directory_no_path_tricks_no_values_in_repr(creds: Path) -> None:
    assert CredentialEnviron({}).get("POLATIS_PASSWORD") is None
    env = CredentialEnviron({}, directory=creds / "sub")
    (creds / "sub").mkdir()
    for name in ("../POLATIS_PASSWORD", ".", "..", ""):
        assert env.get(name) is None, name
    shown = repr(CredentialEnviron({"P": "secret-value"}, directory=creds))
    assert "secret-value" not in shown and "from-file" not in shown

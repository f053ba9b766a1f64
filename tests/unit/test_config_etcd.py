"""The ``etcd`` section: every endpoint kept, TLS files checked with the field and value named,
and the store the daemon connects with (``app.connect_store``) built from all of it."""

from __future__ import annotations

from pathlib import Path

import pytest

from lightrail.controller.app import connect_store
from lightrail.controller.config import ConfigError, parse_config
from lightrail.controller.store.client import TlsFiles


def pem_files(tmp_path: Path) -> dict[str, str]:
    files = {}
    for name in ("ca", "cert", "key"):
        path = tmp_path / f"{name}.pem"
        path.write_text("-----BEGIN PLACEHOLDER-----\n")
        files[name] = str(path)
    return files


def test_every_endpoint_and_the_tls_files_reach_the_store(tmp_path: Path) -> None:
    f = pem_files(tmp_path)
    cfg = parse_config({"etcd": {
        "endpoints": ["10.0.0.1:2379", "10.0.0.2:2379", "etcd-3.example:2379"],
        "tls": {"ca_file": f["ca"], "cert_file": f["cert"], "key_file": f["key"]},
    }})
    store = connect_store(cfg.etcd)
    assert store.endpoints == ("10.0.0.1:2379", "10.0.0.2:2379", "etcd-3.example:2379")
    assert store.tls == TlsFiles(Path(f["ca"]), Path(f["cert"]), Path(f["key"]))


def test_tls_with_only_a_ca_and_no_tls_at_all(tmp_path: Path) -> None:
    f = pem_files(tmp_path)
    only_ca = parse_config({"etcd": {"tls": {"ca_file": f["ca"]}}})
    assert connect_store(only_ca.etcd).tls == TlsFiles(Path(f["ca"]))
    assert connect_store(parse_config({}).etcd).tls is None


@pytest.mark.parametrize(
    ("tls", "expected"),
    [
        ({"ca_file": "{d}/missing.pem"},
         "etcd.tls.ca_file: Value error, no such file: '{d}/missing.pem'"),
        ({"ca_file": "{ca}", "cert_file": "{d}/nope.pem", "key_file": "{key}"},
         "etcd.tls.cert_file: Value error, no such file: '{d}/nope.pem'"),
        ({"ca_file": "{ca}", "cert_file": "{cert}"},
         "etcd.tls: Value error, cert_file '{cert}' is given without key_file"),
        ({"ca_file": "{ca}", "key_file": "{key}"},
         "etcd.tls: Value error, key_file '{key}' is given without cert_file"),
        ({"cert_file": "{cert}", "key_file": "{key}"}, "etcd.tls.ca_file: Field required"),
        ({"ca_file": "{ca}", "crt": "{cert}"}, "etcd.tls.crt: Extra inputs are not permitted"),
    ],
)
def test_bad_tls_names_the_field_and_value(
    tmp_path: Path, tls: dict[str, str], expected: str
) -> None:
    f = pem_files(tmp_path)
    subst = {"d": str(tmp_path), **f}
    data = {"etcd": {"tls": {k: v.format(**subst) for k, v in tls.items()}}}
    with pytest.raises(ConfigError) as info:
        parse_config(data)
    assert any(p.startswith(expected.format(**subst)) for p in info.value.problems), (
        info.value.problems
    )

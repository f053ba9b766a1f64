"""``EtcdStore.grant_lease``'s arguments are checked before anything is sent (no etcd here)."""

from __future__ import annotations

import pytest

from lightrail.controller.store.etcd import EtcdStore


@pytest.mark.parametrize(("kwargs", "message"), [
    ({"ttl_s": 0}, "ttl_s must be >= 1, not 0"),
    ({"ttl_s": 10, "renewals_per_ttl": 2}, "renewals_per_ttl must be >= 3, not 2"),
    ({"ttl_s": 10, "renewals_per_ttl": 0}, "renewals_per_ttl must be >= 3, not 0"),
])
async def test_grant_lease_refuses_bad_arguments_naming_them(
    kwargs: dict[str, int], message: str
) -> None:
    store = EtcdStore.connect("127.0.0.1:1")  # never opened: the check comes first
    with pytest.raises(ValueError, match=message):
        await store.grant_lease(**kwargs)

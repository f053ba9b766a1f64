"""Shared settings of the property-based tests (issue 10, section 5): derandomized (the same
examples on every run), no example database, no deadline, bounded for CI.
``LIGHTRAIL_FUZZ_EXAMPLES=<n>`` runs n examples per test instead (a longer campaign)."""

from __future__ import annotations

import os

from hypothesis import HealthCheck, settings

FUZZ_EXAMPLES_ENV = "LIGHTRAIL_FUZZ_EXAMPLES"


def fuzz_settings(ci_examples: int) -> settings:
    """Hypothesis settings running ``ci_examples`` examples per test (or the count in
    ``LIGHTRAIL_FUZZ_EXAMPLES``), derandomized, without a database or deadline. Function-scoped
    fixtures are shared by every example of a test on purpose (one controller, one device)."""
    return settings(
        max_examples=int(os.environ.get(FUZZ_EXAMPLES_ENV, str(ci_examples))),
        derandomize=True,
        database=None,
        deadline=None,
        suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow,
                               HealthCheck.data_too_large],
    )

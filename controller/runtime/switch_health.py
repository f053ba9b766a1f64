"""The state of each switch as operators see it (issue 14, "Switch health you can see"): one
rule, used by ``lightrail switches``, ``lightrail status`` and the operator API.

States, most telling first: ``maintenance`` (an operator took it out of service), ``unreachable``
(its driver cannot reach it: ``DeviceUnreachable`` / ``DeviceTimeout`` on its last command;
phases that need it are refused after ``controller.device_wait_s``), ``degraded`` (it answers,
but its last command failed, or some of its ports await a read-back), ``up``.
"""

from __future__ import annotations

import enum

from lightrail.controller.runtime.reconciler import DeviceContact


class SwitchState(enum.Enum):
    """What ``switch_state`` says of a switch."""

    UP = "up"
    UNREACHABLE = "unreachable"
    DEGRADED = "degraded"
    MAINTENANCE = "maintenance"


def switch_state(contact: DeviceContact, *, maintenance: bool, unreachable: bool,
                 unknown_ports: bool) -> SwitchState:
    """The state of a switch from how its device last answered (``contact``), whether an
    operator put it in maintenance, whether the coordinator holds it unreachable, and whether
    some of its ports are in an unknown state (a failed apply or an alarm, until a
    read-back)."""
    if maintenance:
        return SwitchState.MAINTENANCE
    if unreachable or contact.reachable is False:
        return SwitchState.UNREACHABLE
    failed_last = contact.last_error_unix_s is not None and (
        contact.last_ok_unix_s is None or contact.last_error_unix_s > contact.last_ok_unix_s)
    if failed_last or unknown_ports:
        return SwitchState.DEGRADED
    return SwitchState.UP

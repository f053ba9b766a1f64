"""Reconfigure or not: whether a phase should switch to its own circuits or run on the circuits
already on the rail. Pure: no I/O, no clock.

Rule (PCCL: A. Vijaya Kumar, A. Devraj, R. Singh, "PCCL: Photonic circuit-switched collective
communication for distributed ML", arXiv:2509.15450, 2025 - reconfigure only when the
congestion and dilation saved outweigh the reconfiguration delay; with Opus's provisioning,
X. Ding et al., arXiv:2602.12521, 2026 - the switch starts at the previous phase's release, so
part of δ hides in the compute gap):

    δ_exposed = max(0, δ - compute_gap)
    switch  <=>  δ_exposed + t_new < t_current

Ties stay on the current circuits (switching costs a reconfiguration for nothing).
"""

from __future__ import annotations

import math
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class ReconfigureDecision:
    """One reconfigure-or-not decision and the numbers behind it (all in seconds).

    ``switch``: True to switch to the new circuits. ``current_circuits_time_s``: the phase's
    time on the circuits already there (``inf`` when it cannot run on them at all);
    ``new_circuits_time_s``: its time on its own circuits, δ excluded; ``delta_s``: the
    reconfiguration delay δ; ``compute_gap_s``: the compute before the phase that δ can hide in;
    ``delta_hidden_s`` / ``delta_exposed_s``: the part of δ hidden / left on the critical path;
    ``time_if_switch_s`` = δ_exposed + t_new; ``time_if_stay_s`` = t_current;
    ``reason``: one human-readable line.
    """

    switch: bool
    current_circuits_time_s: float
    new_circuits_time_s: float
    delta_s: float
    compute_gap_s: float
    delta_hidden_s: float
    delta_exposed_s: float
    time_if_switch_s: float
    time_if_stay_s: float
    reason: str

    @property
    def saving_s(self) -> float:
        """Time the chosen option saves over the other one (>= 0; ``inf`` when staying is
        impossible)."""
        return abs(self.time_if_stay_s - self.time_if_switch_s)

    @property
    def phase_time_s(self) -> float:
        """The phase's time on the critical path after the compute gap, as decided."""
        return self.time_if_switch_s if self.switch else self.time_if_stay_s


def format_duration(seconds: float) -> str:
    """``seconds`` as a short human string in µs, ms or s (``inf`` as "impossible")."""
    if math.isinf(seconds):
        return "impossible"
    a = abs(seconds)
    if a < 1e-3:
        return f"{seconds * 1e6:.3g} µs"
    if a < 1.0:
        return f"{seconds * 1e3:.3g} ms"
    return f"{seconds:.3g} s"


def _check(name: str, value: float, *, allow_inf: bool = False) -> None:
    if math.isnan(value) or value < 0 or (math.isinf(value) and not allow_inf):
        kind = "a number >= 0" if allow_inf else "finite and >= 0"
        raise ValueError(f"decide: {name} must be {kind}, got {value}")


def decide(
    current_circuits_time_s: float,
    new_circuits_time_s: float,
    delta_s: float,
    compute_gap_s: float,
) -> ReconfigureDecision:
    """Decide whether a phase switches to its own circuits (PCCL's reconfigure-or-not, with
    Opus-style provisioning hiding δ in the compute gap).

    Arguments, all in seconds and >= 0: ``current_circuits_time_s`` (may be ``math.inf``: the
    phase cannot run on the current circuits, so it must switch), ``new_circuits_time_s``
    (finite), ``delta_s`` (δ, finite), ``compute_gap_s`` (finite). Switches when
    ``max(0, δ - gap) + t_new < t_current``. Raises ``ValueError`` naming the argument on a NaN,
    a negative value, or an infinite value where it is not allowed.
    """
    _check("current_circuits_time_s", current_circuits_time_s, allow_inf=True)
    _check("new_circuits_time_s", new_circuits_time_s)
    _check("delta_s", delta_s)
    _check("compute_gap_s", compute_gap_s)
    hidden = min(delta_s, compute_gap_s)
    exposed = delta_s - hidden
    if_switch = exposed + new_circuits_time_s
    if_stay = current_circuits_time_s
    switch = if_switch < if_stay
    f = format_duration
    delta_part = (f"δ {f(delta_s)} ({f(hidden)} hidden in the {f(compute_gap_s)} compute gap, "
                  f"{f(exposed)} exposed)")
    if math.isinf(if_stay):
        reason = (f"switch: the phase cannot run on the current circuits; {delta_part} + "
                  f"{f(new_circuits_time_s)} on new circuits")
    elif switch:
        reason = (f"switch: {delta_part} + {f(new_circuits_time_s)} on new circuits = "
                  f"{f(if_switch)} < {f(if_stay)} on current circuits")
    else:
        reason = (f"stay: {f(if_stay)} on current circuits <= {delta_part} + "
                  f"{f(new_circuits_time_s)} on new circuits = {f(if_switch)}")
    return ReconfigureDecision(
        switch=switch,
        current_circuits_time_s=current_circuits_time_s,
        new_circuits_time_s=new_circuits_time_s,
        delta_s=delta_s,
        compute_gap_s=compute_gap_s,
        delta_hidden_s=hidden,
        delta_exposed_s=exposed,
        time_if_switch_s=if_switch,
        time_if_stay_s=if_stay,
        reason=reason,
    )

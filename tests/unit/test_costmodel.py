"""The fabric cost model against its closed forms, and the reconfigure-or-not decision at both
extremes of the reconfiguration delay (lightrail.controller.core.costmodel,
lightrail.controller.core.decision)."""

from __future__ import annotations

import itertools
import math

import pytest

from lightrail.controller.core.costmodel import (
    Algorithm,
    Circuit,
    CostModelError,
    Flow,
    LinkModel,
    PowerCostConfig,
    Stage,
    Tier,
    Topology,
    UnreachableError,
    direct_all_to_all_s,
    estimate_all_to_all_on_matchings,
    estimate_collective,
    estimate_rail_fabric,
    halving_doubling_all_reduce_s,
    hierarchical_stages,
    hop_count,
    pipelined_broadcast_s,
    reconfiguration_delay_s,
    ring_all_gather_s,
    ring_all_reduce_s,
    ring_reduce_scatter_s,
    round_cost,
)
from lightrail.controller.core.decision import decide
from lightrail.controller.domain.model import Collective
from lightrail.drivers.base import SwitchCapabilities, SwitchKind

LINK = LinkModel()  # alpha = 5 µs, 100 Gb/s
A, B = LINK.alpha_s, LINK.beta_s_per_byte
S = 64e6  # bytes
AR, RS, AG, A2A, BC, P2P = (
    Collective.ALL_REDUCE, Collective.REDUCE_SCATTER, Collective.ALL_GATHER,
    Collective.ALL_TO_ALL, Collective.BROADCAST, Collective.SEND_RECV,
)
EPS = Topology.packet_switched()


def chain(nodes: list[int]) -> Topology:
    """Bidirectional pairs between neighbours: nodes[0] <-> nodes[1] <-> ... (a PP chain)."""
    cs = []
    for a, b in itertools.pairwise(nodes):
        cs += [Circuit(a, b), Circuit(b, a)]
    return Topology.of_circuits(cs)


# --- link model ------------------------------------------------------------------------------


def test_link_defaults_are_5us_and_100gbps() -> None:
    assert LINK.alpha_s == pytest.approx(5e-6)
    assert LINK.beta_s_per_byte == pytest.approx(8e-11)
    assert LinkModel.from_gbps(400, 1e-6).beta_s_per_byte == pytest.approx(2e-11)
    assert LINK.bandwidth_gbps == pytest.approx(100.0)


@pytest.mark.parametrize(("alpha", "beta"), [(-1.0, 1e-9), (1e-6, 0.0), (math.nan, 1e-9),
                                             (1e-6, math.inf)])
def test_link_rejects_bad_constants(alpha: float, beta: float) -> None:
    with pytest.raises(CostModelError, match="LinkModel"):
        LinkModel(alpha, beta)


# --- closed forms on matching circuits -------------------------------------------------------


@pytest.mark.parametrize("n", [2, 3, 4, 7, 16])
def test_ring_all_reduce_on_a_ring_of_circuits_is_the_closed_form(n: int) -> None:
    nodes = list(range(n))
    est = estimate_collective(Topology.ring(nodes), AR, nodes, S, LINK, Algorithm.RING)
    expected = 2 * (n - 1) * A + 2 * (n - 1) / n * S * B
    assert est.time_s == pytest.approx(expected)
    assert ring_all_reduce_s(n, S, LINK) == pytest.approx(expected)
    assert est.dilation == 1
    assert est.congestion == 1
    assert est.rounds == 2 * (n - 1)


def test_best_algorithm_on_a_ring_of_circuits_is_the_ring() -> None:
    nodes = [0, 1, 2, 3]
    est = estimate_collective(Topology.ring(nodes), AR, nodes, S, LINK)
    assert est.algorithm is Algorithm.RING  # halving/doubling would be forwarded over the ring
    assert est.time_s == pytest.approx(ring_all_reduce_s(4, S, LINK))


@pytest.mark.parametrize("coll", [RS, AG])
def test_ring_reduce_scatter_and_all_gather_closed_forms(coll: Collective) -> None:
    n = 8
    nodes = list(range(n))
    est = estimate_collective(Topology.ring(nodes), coll, nodes, S, LINK, Algorithm.RING)
    expected = (n - 1) * A + (n - 1) / n * S * B
    assert est.time_s == pytest.approx(expected)
    assert ring_reduce_scatter_s(n, S, LINK) == pytest.approx(expected)
    assert ring_all_gather_s(n, S, LINK) == pytest.approx(expected)


def test_halving_doubling_on_a_packet_switch_is_the_closed_form() -> None:
    n = 8
    nodes = list(range(n))
    est = estimate_collective(EPS, AR, nodes, S, LINK, Algorithm.HALVING_DOUBLING)
    expected = 2 * 3 * A + 2 * (n - 1) / n * S * B
    assert est.time_s == pytest.approx(expected)
    assert halving_doubling_all_reduce_s(n, S, LINK) == pytest.approx(expected)
    # same bytes as the ring, fewer latency terms: the packet switch picks halving/doubling
    best = estimate_collective(EPS, AR, nodes, S, LINK)
    assert best.algorithm is Algorithm.HALVING_DOUBLING
    assert best.time_s < ring_all_reduce_s(n, S, LINK)


def test_halving_doubling_needs_a_power_of_two() -> None:
    with pytest.raises(CostModelError, match="power of two"):
        halving_doubling_all_reduce_s(6, S, LINK)
    with pytest.raises(CostModelError, match="does not implement"):
        estimate_collective(EPS, AR, list(range(6)), S, LINK, Algorithm.HALVING_DOUBLING)


def test_direct_all_to_all_on_a_packet_switch_is_the_closed_form() -> None:
    n = 4
    est = estimate_collective(EPS, A2A, list(range(n)), S, LINK)
    expected = (n - 1) * A + (n - 1) / n * S * B
    assert est.algorithm is Algorithm.DIRECT
    assert est.time_s == pytest.approx(expected)
    assert direct_all_to_all_s(n, S, LINK) == pytest.approx(expected)


def test_all_to_all_on_time_multiplexed_matchings_adds_k_delta() -> None:
    n, delta = 4, 10e-3
    est = estimate_all_to_all_on_matchings(list(range(n)), S, LINK, delta)
    expected = (n - 1) * A + (n - 1) / n * S * B + (n - 1) * delta
    assert est.time_s == pytest.approx(expected)
    assert est.transfer_s == pytest.approx(expected - (n - 1) * delta)
    assert est.reconfigurations == n - 1
    assert direct_all_to_all_s(n, S, LINK, reconfigurations=n - 1, delta_s=delta) == \
        pytest.approx(expected)


def test_all_to_all_forwarded_over_a_ring_pays_dilation_and_congestion() -> None:
    n = 4
    nodes = list(range(n))
    est = estimate_collective(Topology.ring(nodes), A2A, nodes, S, LINK)
    # round s: every flow takes s hops and every ring circuit carries s flows of S/n
    expected = sum(s * A + s * S / n * B for s in range(1, n))
    assert est.time_s == pytest.approx(expected)
    assert est.dilation == n - 1
    assert est.congestion == n - 1
    assert est.time_s > direct_all_to_all_s(n, S, LINK)


def test_pipelined_broadcast_closed_form() -> None:
    nodes = list(range(8))
    est = estimate_collective(Topology.ring(nodes), BC, nodes, S, LINK)
    assert est.algorithm is Algorithm.PIPELINED_RING
    assert est.time_s == pytest.approx(pipelined_broadcast_s(8, S, LINK))
    chunks = est.rounds - (8 - 2)
    assert est.time_s == pytest.approx((8 - 2 + chunks) * (A + S / chunks * B))
    # pipelining approaches S·β for large messages, far below (n-1)·S·β store-and-forward
    assert S * B < est.time_s < 1.25 * S * B < 7 * S * B
    assert pipelined_broadcast_s(2, S, LINK) == pytest.approx(A + S * B)


def test_send_recv_is_one_flow() -> None:
    est = estimate_collective(chain([3, 5]), P2P, [3, 5], S, LINK)
    assert est.time_s == pytest.approx(A + S * B)
    with pytest.raises(CostModelError, match="exactly 2"):
        estimate_collective(EPS, P2P, [0, 1, 2], S, LINK)


def test_one_participant_costs_nothing() -> None:
    est = estimate_collective(Topology.of_circuits(()), AR, [0], S, LINK)
    assert est.time_s == 0.0
    assert ring_all_reduce_s(1, S, LINK) == 0.0


# --- dilation and congestion ----------------------------------------------------------------


def test_all_reduce_on_pair_circuits_has_dilation_and_costs_more() -> None:
    """The same ring all-reduce over 4 hosts on PP-style pair circuits 0<->1<->2<->3: the
    logical edge 3 -> 0 is forwarded 3 hops (dilation 3), no circuit is shared."""
    nodes = [0, 1, 2, 3]
    on_pairs = estimate_collective(chain(nodes), AR, nodes, S, LINK, Algorithm.RING)
    assert on_pairs.dilation == 3
    assert on_pairs.congestion == 1
    expected = 2 * 3 * (3 * A + S / 4 * B)
    assert on_pairs.time_s == pytest.approx(expected)
    assert on_pairs.time_s > ring_all_reduce_s(4, S, LINK)
    assert hop_count(chain(nodes), 3, 0) == 3
    assert hop_count(Topology.ring(nodes), 1, 0) == 3
    assert hop_count(EPS, 1, 0) == 1
    assert hop_count(EPS, 2, 2) == 0


def test_disconnected_pairs_are_unreachable() -> None:
    pairs = Topology.of_circuits([Circuit(0, 1), Circuit(1, 0), Circuit(2, 3), Circuit(3, 2)])
    with pytest.raises(UnreachableError, match="from node 1 to node 2") as info:
        estimate_collective(pairs, AR, [0, 1, 2, 3], S, LINK)
    assert (info.value.src, info.value.dst) == (1, 2)


def test_two_flows_sharing_a_circuit_double_the_beta_term() -> None:
    line = Topology.of_circuits([Circuit(0, 1), Circuit(1, 2)])
    one = round_cost(line, [Flow(1, 2, S)], LINK)
    two = round_cost(line, [Flow(0, 2, S), Flow(1, 2, S)], LINK)
    assert one.time_s == pytest.approx(A + S * B)
    assert two.congestion == 2
    assert two.dilation == 2
    assert two.max_load_bytes == pytest.approx(2 * S)
    assert two.time_s == pytest.approx(2 * A + 2 * S * B)
    # on a packet switch two senders into one receiver share its downlink the same way
    incast = round_cost(EPS, [Flow(0, 2, S), Flow(1, 2, S)], LINK)
    assert incast.time_s == pytest.approx(A + 2 * S * B)
    assert incast.congestion == 2


def test_ring_in_the_wrong_order_is_congested() -> None:
    """Logical ring 0 -> 2 -> 1 -> 3 -> 0 on the circuits 0 -> 1 -> 2 -> 3 -> 0."""
    circuits = Topology.ring([0, 1, 2, 3])
    est = estimate_collective(circuits, AR, [0, 2, 1, 3], S, LINK, Algorithm.RING)
    assert est.dilation == 3  # 2 -> 1 goes 2 -> 3 -> 0 -> 1
    assert est.congestion >= 2
    assert est.time_s > ring_all_reduce_s(4, S, LINK)


def test_round_cost_rejects_bad_bytes() -> None:
    with pytest.raises(CostModelError, match="nbytes"):
        round_cost(EPS, [Flow(0, 1, -1.0)], LINK)
    with pytest.raises(CostModelError, match="duplicate"):
        estimate_collective(EPS, AR, [0, 0], S, LINK)
    with pytest.raises(CostModelError, match="loop"):
        Circuit(2, 2)


# --- reconfiguration delay, hierarchy, power -------------------------------------------------


def caps(settle_s: float) -> SwitchCapabilities:
    return SwitchCapabilities(SwitchKind.NXN, 16, True, settle_s)


def test_reconfiguration_delay_is_the_slowest_switch() -> None:
    assert reconfiguration_delay_s([caps(0.01), caps(0.025)]) == pytest.approx(0.025)
    assert reconfiguration_delay_s([]) == 0.0


def test_hierarchical_all_reduce_splits_bytes_over_rails() -> None:
    stages = hierarchical_stages(AR, S, hosts=16, ranks_per_host=4)
    assert stages == (Stage(Tier.SCALE_UP, RS, 4, S), Stage(Tier.RAIL, AR, 16, S / 4),
                      Stage(Tier.SCALE_UP, AG, 4, S))
    assert hierarchical_stages(AR, S, hosts=1, ranks_per_host=2) == (
        Stage(Tier.SCALE_UP, AR, 2, S),)
    assert hierarchical_stages(AG, S, hosts=4, ranks_per_host=1) == (
        Stage(Tier.RAIL, AG, 4, S),)
    with pytest.raises(CostModelError, match="hosts"):
        hierarchical_stages(AR, S, hosts=0, ranks_per_host=1)


def test_rail_fabric_power_and_cost() -> None:
    small = estimate_rail_fabric(16, 8)
    assert small.electrical.switch_tiers == 1
    assert small.electrical.switch_ports == 16 * 8
    assert small.electrical.switch_transceivers == 16 * 8
    assert small.photonic.switch_ports == 16 * 8
    assert small.photonic.switch_transceivers == 0
    assert small.photonic.nic_transceivers == small.electrical.nic_transceivers == 128
    big = estimate_rail_fabric(256, 8)  # 2,048 GPUs, Opus's largest simulation
    assert big.electrical.switch_tiers == 2
    assert big.electrical.switch_ports == 3 * 256 * 8
    assert big.power_ratio > small.power_ratio > 1
    assert big.cost_ratio > 1
    cfg = PowerCostConfig(transceiver_power_w=0.0)
    assert estimate_rail_fabric(16, 8, cfg).photonic.power_w == pytest.approx(128 * 0.5)
    with pytest.raises(CostModelError, match="hosts/rails"):
        estimate_rail_fabric(0, 8)
    with pytest.raises(CostModelError, match="ocs_port_power_w"):
        PowerCostConfig(ocs_port_power_w=-1.0)


# --- reconfigure or not ----------------------------------------------------------------------


def test_microsecond_delay_switches_whenever_new_circuits_are_better() -> None:
    """Silicon photonics (δ = 4 µs): a phase switches as soon as its own circuits are faster,
    even with no compute gap to hide in."""
    t_current = estimate_collective(chain([0, 1, 2, 3]), AR, [0, 1, 2, 3], S, LINK).time_s
    t_new = ring_all_reduce_s(4, S, LINK)
    d = decide(t_current, t_new, 4e-6, 0.0)
    assert d.switch
    assert d.delta_exposed_s == pytest.approx(4e-6)
    assert d.time_if_switch_s == pytest.approx(4e-6 + t_new)
    assert d.phase_time_s == pytest.approx(4e-6 + t_new)
    assert d.reason.startswith("switch:")
    # ... but not when the circuits are already as good (a tie stays)
    assert not decide(t_new, t_new, 4e-6, 0.0).switch


def test_huge_delay_stays_on_current_circuits() -> None:
    """A robotic patch panel (δ = 100 s): forwarding over the circuits already there wins."""
    t_current = estimate_collective(chain([0, 1, 2, 3]), AR, [0, 1, 2, 3], S, LINK).time_s
    t_new = ring_all_reduce_s(4, S, LINK)
    d = decide(t_current, t_new, 100.0, 0.01)
    assert not d.switch
    assert d.phase_time_s == pytest.approx(t_current)
    assert d.delta_hidden_s == pytest.approx(0.01)
    assert d.saving_s == pytest.approx(100.0 - 0.01 + t_new - t_current)
    assert d.reason.startswith("stay:")


def test_delay_hidden_in_the_compute_gap_is_free() -> None:
    d = decide(0.05, 0.04, 0.010, 0.020)
    assert d.switch
    assert d.delta_exposed_s == 0.0
    assert d.delta_hidden_s == pytest.approx(0.010)
    assert not decide(0.05, 0.04, 0.030, 0.015).switch  # 15 ms exposed + 40 > 50


def test_unusable_current_circuits_force_a_switch() -> None:
    d = decide(math.inf, 0.04, 100.0, 0.0)
    assert d.switch
    assert "cannot run" in d.reason


@pytest.mark.parametrize(("args", "name"), [
    ((math.nan, 1.0, 0.0, 0.0), "current_circuits_time_s"),
    ((1.0, math.inf, 0.0, 0.0), "new_circuits_time_s"),
    ((1.0, 1.0, -1e-3, 0.0), "delta_s"),
    ((1.0, 1.0, 0.0, -1.0), "compute_gap_s"),
])
def test_decide_rejects_bad_numbers(args: tuple[float, float, float, float], name: str) -> None:
    with pytest.raises(ValueError, match=name):
        decide(*args)

"""Torus fabric and slice allocator (Morphlux-style photonic stitching): correctness.

Every allocation is checked with ``verify_slice`` (shape honoured under the rewiring model) and
every state with ``TorusAllocator.check_invariants`` (no chip or fibre given twice, spares and
failed chips never handed out, ports only of the slice's own chips).
"""

from __future__ import annotations

import contextlib
import functools
import random

import pytest

from lightrail.controller.torus.allocator import (
    AllocationPolicy,
    ChipState,
    Fit,
    NoCapacityError,
    NoSpareError,
    SliceMode,
    SliceRequest,
    SliceRequestError,
    SparePolicy,
    TorusAllocator,
    UnknownSliceError,
    verify_slice,
)
from lightrail.controller.torus.model import (
    Axis,
    Chip,
    FailureDomainKind,
    ServerId,
    Shape,
    TorusError,
    TorusFabric,
)

NO_SPARES = SparePolicy(per_domain=0)
POLICIES = list(AllocationPolicy)


@functools.cache
def fabric_of(torus: str, rack: str) -> TorusFabric:
    """Fabrics are immutable: build each once for the whole module."""
    return TorusFabric.parse(torus, rack=rack)


def alloc_of(torus: str = "8x8x8", policy: AllocationPolicy = AllocationPolicy.LIGHTRAIL,
             spares: SparePolicy = NO_SPARES, rack: str = "4x4x4") -> TorusAllocator:
    return TorusAllocator(fabric_of(torus, rack), policy, spares=spares)


def req(shape: str | None = None, size: int | None = None, tenant: str = "t",
        slice_id: str | None = None) -> SliceRequest:
    return SliceRequest(tenant, size=size, shape=Shape.parse(shape) if shape else None,
                        slice_id=slice_id)


# --- fabric --------------------------------------------------------------------------------


def test_fabric_servers_racks_and_fibres() -> None:
    f = TorusFabric.parse("8x8x8")
    assert f.chip_count == 512 and f.server_count == 128 and str(f.server_grid) == "4x4x8"
    assert f.chips_of_server(ServerId(1, 2, 3)) == (
        Chip(2, 4, 3), Chip(3, 4, 3), Chip(2, 5, 3), Chip(3, 5, 3))
    assert f.server_of(Chip(3, 5, 3)) == ServerId(1, 2, 3)
    assert len(f.links) == 512 * 3
    # x and y faces carry 2 fibres, z faces 4 (one per chip)
    assert len(f.fibres_between(ServerId(0, 0, 0), ServerId(1, 0, 0))) == 2
    assert len(f.fibres_between(ServerId(0, 0, 0), ServerId(0, 1, 0))) == 2
    assert len(f.fibres_between(ServerId(0, 0, 0), ServerId(0, 0, 1))) == 4
    assert f.fibres_between(ServerId(0, 0, 0), ServerId(2, 0, 0)) == ()
    rack = f.rack_of(Chip(5, 1, 7))
    assert (rack.ix, rack.iy, rack.iz) == (1, 0, 1)
    assert len(f.chips_of_domain(rack)) == 64
    assert len(f.domains(FailureDomainKind.SERVER)) == 128
    assert f.distance(Chip(0, 0, 0), Chip(7, 7, 7)) == 3


def test_fabric_size_two_dimension_has_parallel_wires() -> None:
    f = TorusFabric.parse("4x2x1", rack="4x2x1")
    assert len(f.links_between_chips(Chip(0, 0, 0), Chip(0, 1, 0))) == 2
    assert len(f.links_between_chips(Chip(0, 0, 0), Chip(1, 0, 0))) == 1


@pytest.mark.parametrize(("dims", "rack", "field"), [
    ("5x4x4", "4x4x4", "dims"), ("4x4x4", "3x4x4", "rack"), ("8x8x8", "4x4x3", "rack"),
])
def test_fabric_rejects_bad_description(dims: str, rack: str, field: str) -> None:
    with pytest.raises(TorusError, match=field):
        TorusFabric(Shape.parse(dims), Shape.parse(rack))


@pytest.mark.parametrize("text", ["4x4x4x4", "axb", "0x2x2", "", "4x-1"])
def test_shape_parse_errors_name_the_field(text: str) -> None:
    with pytest.raises(TorusError, match="shape"):
        Shape.parse(text)


def test_shape_parse_and_rotations() -> None:
    assert Shape.parse("4x2") == Shape(4, 2, 1)
    assert [str(s) for s in Shape(2, 2, 4).rotations()] == ["2x2x4", "2x4x2", "4x2x2"]


# --- contiguous slices -----------------------------------------------------------------------


@pytest.mark.parametrize("policy", POLICIES)
def test_contiguous_slice_is_a_box_of_the_requested_shape(policy: AllocationPolicy) -> None:
    a = alloc_of(policy=policy)
    f = a.fabric
    for shape in ("4x4x1", "2x2x4", "8x2x1", "1x1x1", "3x2x5"):
        s = a.allocate(req(shape))
        assert s.mode is SliceMode.CONTIGUOUS
        assert sorted(s.placed.extents) == sorted(Shape.parse(shape).extents)
        assert list(s.chips) == f.box_chips(s.chips[0], s.placed)
        assert verify_slice(f, s) == []
    assert a.check_invariants() == []


def test_fixed_torus_bandwidth_counts_wires_inside_the_box() -> None:
    a = alloc_of(policy=AllocationPolicy.CONTIGUOUS_ONLY)
    small = a.allocate(req("2x2x1"))
    assert small.lanes == (1, 1, 0) and small.rings == (False, False, False)
    assert small.bandwidth_gbps_per_chip == 200.0
    plane = a.allocate(req("8x8x1"))  # spans x and y: wrap-around wires make rings
    assert plane.rings == (True, True, False)
    assert plane.bandwidth_gbps_per_chip == 400.0
    assert all(not c.photonic and c.hops == 1 for c in plane.circuits)


def test_photonic_switch_redirects_idle_lanes_inside_a_server() -> None:
    """Morphlux: a 2x2x1 slice in one server uses 2 of 6 lanes per chip on a fixed torus; the
    photonic switch turns the 4 idle lanes into parallel intra-server circuits."""
    base = alloc_of(policy=AllocationPolicy.CONTIGUOUS_ONLY).allocate(req("2x2x1"))
    light = alloc_of(policy=AllocationPolicy.LIGHTRAIL).allocate(req("2x2x1"))
    assert light.lanes == (3, 3, 0)
    assert light.bandwidth_gbps_per_chip == 3 * base.bandwidth_gbps_per_chip
    assert all(c.photonic and c.hops == 0 for c in light.circuits)


def test_best_fit_packs_against_busy_chips_and_first_fit_takes_the_first() -> None:
    first = alloc_of(policy=AllocationPolicy.CONTIGUOUS_ONLY)
    first.fit = Fit.FIRST_FIT
    assert first.allocate(req("2x2x1")).chips[0] == Chip(0, 0, 0)
    best = alloc_of(policy=AllocationPolicy.CONTIGUOUS_ONLY)
    a = best.allocate(req("8x8x1"))
    b = best.allocate(req("2x2x1"))
    # next to the busy plane, not in the middle of the free space
    assert {c.z for c in b.chips} <= {(a.chips[0].z + 1) % 8, (a.chips[0].z - 1) % 8}


# --- stitched slices -------------------------------------------------------------------------


def _l_shaped_free_space(policy: AllocationPolicy) -> TorusAllocator:
    """8x8x1 torus with only servers (0,0), (1,0) and (1,1) usable: an L of 12 chips, no free
    6x2 box."""
    a = alloc_of("8x8x1", policy=policy, rack="8x8x1")
    keep = {ServerId(0, 0, 0), ServerId(1, 0, 0), ServerId(1, 1, 0)}
    for chip in a.fabric.chips():
        if a.fabric.server_of(chip) not in keep:
            a.fail_chip(chip)
    return a


def test_stitched_slice_bends_around_busy_servers() -> None:
    a = _l_shaped_free_space(AllocationPolicy.LIGHTRAIL)
    assert a.largest_free_box() == 8
    s = a.allocate(req("6x2x1"))
    assert s.mode is SliceMode.STITCHED
    assert verify_slice(a.fabric, s) == []
    assert a.check_invariants() == []
    servers = {a.fabric.server_of(c) for c in s.chips}
    assert servers == {ServerId(0, 0, 0), ServerId(1, 0, 0), ServerId(1, 1, 0)}
    # every logical link of the 6x2 mesh has a circuit: intra-server or one fibre
    for i in range(s.placed.x):
        for j in range(s.placed.y):
            for axis, (di, dj) in ((Axis.X, (1, 0)), (Axis.Y, (0, 1))):
                if i + di < s.placed.x and j + dj < s.placed.y:
                    u, v = s.chip_at(i, j, 0), s.chip_at(i + di, j + dj, 0)
                    assert any({c.a, c.b} == {u, v} and c.axis is axis for c in s.circuits)
    assert a.largest_allocatable() == 0  # everything usable is now taken


def test_contiguous_only_rejects_what_stitching_places() -> None:
    a = _l_shaped_free_space(AllocationPolicy.CONTIGUOUS_ONLY)
    assert a.plan(req("6x2x1")) is None
    with pytest.raises(NoCapacityError, match=r"tenant='t' shape=6x2x1: no capacity"):
        a.allocate(req("6x2x1"))


def test_free_servers_joined_only_through_another_tenant_are_not_stitched() -> None:
    """8x2x1: a ring of 4 servers. Servers 1 and 3 belong to other tenants, 0 and 2 are free
    (8 chips), but no path of own ports joins 0 and 2, so a 4x2x1 slice cannot be made."""
    a = alloc_of("8x2x1", rack="8x2x1")
    by_server = {}
    for i in range(4):
        s = a.allocate(req("2x2x1", slice_id=f"s{i}"))
        (server,) = {a.fabric.server_of(c) for c in s.chips}
        by_server[server.sx] = s.slice_id
    a.release(by_server[0])
    a.release(by_server[2])
    assert a.free_count() == 8 and a.largest_free_box() == 4
    assert a.plan(req("4x2x1")) is None
    s = a.allocate(req("2x2x1"))  # one free server alone still works
    assert s.mode is SliceMode.CONTIGUOUS
    assert a.check_invariants() == []


# --- property test: many random sequences ------------------------------------------------------

SHAPES = ["1x1x1", "2x1x1", "2x2x1", "2x2x2", "4x2x1", "4x2x2", "4x4x1", "3x2x1", "2x2x4"]


@pytest.mark.parametrize("policy", POLICIES)
@pytest.mark.parametrize("seed", range(6))
def test_random_sequences_keep_every_invariant(policy: AllocationPolicy, seed: int) -> None:
    rng = random.Random(seed)
    torus = rng.choice(["4x4x4", "8x4x2", "4x4x2"])
    spares = SparePolicy(rng.choice(list(FailureDomainKind)), rng.choice([0, 1]))
    a = alloc_of(torus, policy, spares)
    total = a.fabric.chip_count
    spare_chips = set(a.chips_in(ChipState.SPARE))
    live: list[str] = []
    for step in range(120):
        roll = rng.random()
        if roll < 0.55:
            r = (req(rng.choice(SHAPES), slice_id=f"s{step}") if rng.random() < 0.7
                 else req(size=rng.choice([1, 2, 3, 4, 6, 8, 12]), slice_id=f"s{step}"))
            try:
                s = a.allocate(r)
            except (NoCapacityError, SliceRequestError):
                continue
            live.append(s.slice_id)
            assert not set(s.chips) & spare_chips, "a spare was given to a tenant"
        elif roll < 0.9 and live:
            sid = live.pop(rng.randrange(len(live)))
            released = a.release(sid)
            assert all(a.state_of(c) is not ChipState.ALLOCATED or a.owner_of(c) != sid
                       for c in released.chips)
        elif policy is AllocationPolicy.LIGHTRAIL:
            chip = Chip(*(rng.randrange(n) for n in a.fabric.dims.extents))
            with contextlib.suppress(NoSpareError):
                a.fail_chip(chip)
        spare_chips = set(a.chips_in(ChipState.SPARE))
        assert a.check_invariants() == []
        owned = [c for s in a.slices.values() for c in s.chips if c not in s.failed]
        assert len(owned) == len(set(owned)), "a chip given twice"
        counts = {state: len(a.chips_in(state)) for state in ChipState}
        assert sum(counts.values()) == total
        assert counts[ChipState.ALLOCATED] == len(owned)
        assert a.free_count() == counts[ChipState.FREE]
    for sid in live:
        a.release(sid)
    assert a.slices == {}
    assert len(a.chips_in(ChipState.ALLOCATED)) == 0


def test_departures_free_chips_and_restore_spares() -> None:
    a = alloc_of(spares=SparePolicy(FailureDomainKind.RACK, 1))
    spares = a.chips_in(ChipState.SPARE)
    free = a.free_count()
    assert len(spares) == 8 and free == 504
    ids = []
    while True:
        try:
            ids.append(a.allocate(req("2x2x2")).slice_id)
        except NoCapacityError:
            break
    assert a.chips_in(ChipState.SPARE) == spares  # spares never handed out
    assert a.plan(req("2x2x2")) is None and a.free_count() < free // 4
    for sid in ids:
        a.release(sid)
    assert a.free_count() == free and a.chips_in(ChipState.SPARE) == spares
    assert a.check_invariants() == []


# --- failures and spares -----------------------------------------------------------------------


def test_spares_sit_in_the_far_corner_of_each_domain() -> None:
    a = alloc_of("4x4x4", spares=SparePolicy(FailureDomainKind.SERVER, 1))
    spares = a.chips_in(ChipState.SPARE)
    assert len(spares) == 16 and all(c.x % 2 == 1 and c.y % 2 == 1 for c in spares)
    with pytest.raises(SliceRequestError, match="per_domain"):
        alloc_of("4x4x4", spares=SparePolicy(FailureDomainKind.SERVER, 4))


def test_failed_chip_replaced_by_spare_of_same_server() -> None:
    a = alloc_of("4x4x4", spares=SparePolicy(FailureDomainKind.SERVER, 1))
    s = a.allocate(req("3x1x1"))
    failed = s.chips[0]
    rep = a.fail_chip(failed)
    assert rep is not None
    assert rep.same_domain and rep.failed == failed
    assert a.fabric.server_of(rep.spare) == a.fabric.server_of(failed)
    assert failed not in rep.slice.chips and rep.spare in rep.slice.chips
    assert rep.removed and rep.added and rep.borrowed == ()
    assert all(failed in (c.a, c.b) for c in rep.removed)
    assert all(rep.spare in (c.a, c.b) for c in rep.added)
    assert rep.slice.mode is SliceMode.STITCHED
    assert a.state_of(failed) is ChipState.FAILED
    assert a.state_of(rep.spare) is ChipState.ALLOCATED
    assert verify_slice(a.fabric, rep.slice) == []
    assert a.check_invariants() == []
    # the server's reserve is topped up from its free chips
    server_chips = a.fabric.chips_of_server(a.fabric.server_of(failed))
    assert sum(a.state_of(c) is ChipState.SPARE for c in server_chips) == 1


def test_failed_chip_replaced_from_the_same_rack_when_it_routes() -> None:
    a = alloc_of("8x8x8", spares=SparePolicy(FailureDomainKind.RACK, 1))
    s = a.allocate(req("4x4x2"))
    rack = a.fabric.rack_of(s.chips[0])
    corner = next(c for c in a.chips_in(ChipState.SPARE) if a.fabric.rack_of(c) == rack)
    victim = min(s.chips, key=lambda c: a.fabric.distance(c, corner))
    rep = a.fail_chip(victim)
    assert rep is not None and rep.same_domain and rep.spare == corner
    assert all(c.hops <= a.max_route_hops for c in rep.added)
    assert verify_slice(a.fabric, rep.slice) == []
    assert a.check_invariants() == []
    a.release(s.slice_id)
    assert a.check_invariants() == []
    assert a.state_of(victim) is ChipState.FAILED


def test_failure_without_spare_is_a_clear_error_and_keeps_the_slice() -> None:
    a = alloc_of("4x4x4")
    s = a.allocate(req("2x2x1"))
    with pytest.raises(NoSpareError, match=r"of slice 'slice-1': no spare"):
        a.fail_chip(s.chips[0])
    assert a.slices[s.slice_id].failed == (s.chips[0],)
    assert a.check_invariants() == []
    assert a.fail_chip(s.chips[0]) is None  # reported twice: one failure
    a.release(s.slice_id)
    assert a.state_of(s.chips[0]) is ChipState.FAILED
    a.repair_chip(s.chips[0])
    assert a.state_of(s.chips[0]) is ChipState.FREE


def test_fixed_torus_cannot_rewire_a_spare_in() -> None:
    a = alloc_of("4x4x4", AllocationPolicy.CONTIGUOUS_ONLY,
                 SparePolicy(FailureDomainKind.SERVER, 1))
    s = a.allocate(req("2x1x1"))
    with pytest.raises(NoSpareError, match="contiguous-only"):
        a.fail_chip(s.chips[0])


def test_failed_free_or_spare_chip_leaves_the_pool() -> None:
    a = alloc_of("4x4x4", spares=SparePolicy(FailureDomainKind.SERVER, 1))
    spare = a.chips_in(ChipState.SPARE)[0]
    assert a.fail_chip(spare) is None
    server = a.fabric.server_of(spare)
    assert sum(a.state_of(c) is ChipState.SPARE
               for c in a.fabric.chips_of_server(server)) == 1  # topped up
    free = a.chips_in(ChipState.FREE)[0]
    n = a.free_count()
    assert a.fail_chip(free) is None and a.free_count() == n - 1


# --- bad requests --------------------------------------------------------------------------------


@pytest.mark.parametrize(("request_", "message"), [
    (req("16x1x1"), r"shape: 16x1x1 is larger than the torus 8x8x8"),
    (req("9x9x1"), r"shape: 9x9x1 is larger"),
    (req(size=0), r"size: must be >= 1, got 0"),
    (req(size=513), r"size: 513 is more than the 512 tenant chips"),
    (req(size=11), r"size: 11 chips form no box"),
    (SliceRequest("t"), r"size/shape: give exactly one"),
    (SliceRequest("t", size=4, shape=Shape(2, 2, 1)), r"size/shape: give exactly one"),
    (req("2x2x1", tenant=""), r"tenant: must be a non-empty name"),
])
def test_bad_requests_name_the_field_and_value(request_: SliceRequest, message: str) -> None:
    a = alloc_of()
    with pytest.raises(SliceRequestError, match=message):
        a.allocate(request_)
    with pytest.raises(SliceRequestError, match=message):
        a.plan(request_)


def test_duplicate_slice_id_unknown_release_and_bad_chip() -> None:
    a = alloc_of("4x4x4")
    a.allocate(req("1x1x1", slice_id="x"))
    with pytest.raises(SliceRequestError, match="slice_id: 'x' is already live"):
        a.allocate(req("1x1x1", slice_id="x"))
    with pytest.raises(UnknownSliceError, match="slice_id: no live slice 'y'"):
        a.release("y")
    with pytest.raises(TorusError, match=r"chip: \(4,0,0\) is outside the torus"):
        a.fail_chip(Chip(4, 0, 0))


def test_no_capacity_names_the_request() -> None:
    a = alloc_of("4x4x4", AllocationPolicy.CONTIGUOUS_ONLY)
    a.allocate(req("4x4x2"))
    a.allocate(req("4x4x1"))
    with pytest.raises(NoCapacityError, match=r"size=32: no capacity: 16 free chips"):
        a.allocate(req(size=32))

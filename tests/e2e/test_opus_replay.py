"""End to end: ``bench/opus_replay.py --quick`` on the shared 16-GPU Opus folder (issue 13,
section 1, "Live"): the phase pattern through a real controller process on a real etcd, host
agents with one PhaseStream each and the emulated rails in a ``lightrail emulate`` process
over TL1 sockets, at every δ of the issue in both modes, beside Opus's CSVs.

Asserts structure and sanity, never a timing bound: every (δ, mode) row is there, no live
median iteration is shorter than the compute one rank does in it, and switching at
δ = 1000 ms costs more than at δ = 0 in both modes."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from lightrail.controller.store.etcd_server import EmbeddedEtcd

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))
import opus_live as live
import opus_replay as bench

FOLDER = Path(__file__).resolve().parents[2].parent / "shared" / "data" / bench.FOLDER

pytestmark = [
    pytest.mark.etcd,
    pytest.mark.skipif(not FOLDER.is_dir(), reason=f"{FOLDER} not present (shared data)"),
]


async def test_quick_live_table_on_the_16_gpu_pattern(
        etcd: EmbeddedEtcd, capsys: pytest.CaptureFixture[str]) -> None:
    rc, result = await bench.main_async(["--quick", "--json", str(FOLDER)],
                                        etcd_endpoint=etcd.endpoint)
    out = capsys.readouterr().out
    assert rc == 0, out
    assert result is not None
    doc = json.loads(out)
    assert doc["time_scale"] == bench.QUICK_TIME_SCALE

    expected = {(d, m) for d in live.DELAYS_MS for m in live.Mode}
    assert {(r.delay_ms, r.mode) for r in result.rows} == expected
    assert {(r["delay_ms"], r["mode"]) for r in doc["rows"]} == {
        (d, m.value) for d, m in expected}
    assert result.compute_s > 0
    assert result.gap_scale > 0 and doc["gap_scale"] > 0  # calibrated on Opus's no-controller
    assert result.reference.median_s > result.compute_s
    by = {(r.delay_ms, r.mode): r for r in result.rows}
    for r in result.rows:
        assert len(r.live.iteration_s) == 2
        assert r.live.median_s > result.compute_s, r
        assert r.opus is not None and r.opus_overhead_pct is not None, r  # Opus ran every δ
        assert r.live.provisioning is not None
    for mode in live.Mode:
        assert by[(1000.0, mode)].overhead_pct > by[(0.0, mode)].overhead_pct, mode
        # the circuits changed: PP pairs and DP pairs share every host's rail ports
        assert by[(1000.0, mode)].live.reconfigurations_per_iter > 0
    assert by[(0.0, live.Mode.PROVISIONING)].live.provisioning.learned  # type: ignore[union-attr]

    table = bench.format_table(result)
    assert f"time scale {bench.QUICK_TIME_SCALE:g}:" in table
    for d, m in expected:
        assert any(line.split()[:2] == [f"{d:g}", m.value] for line in table.splitlines())

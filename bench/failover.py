"""Failover benchmark (issue 5 §4): the timeline of many injected GPU failures.

A controller (in this process, on a private etcd) runs a job of 8 ranks on 4 hosts x 2 GPUs of
a rail fabric with a pool of spare hosts (one failure domain, every spare wired to both rails).
The rails are emulated Polatis switches in their own process (``lightrail emulate``), driven
over TL1 sockets as hardware would be.
Failures are injected one at a time, each on a GPU of the current placement:

* ``xid``: the host agent reports NVML XID 79 (fallen off the bus) on its health stream;
* ``heartbeat``: the host's health stream goes silent and the controller's watchdog fires after
  the heartbeat deadline (3 missed heartbeats of ``--heartbeat-ms``).

For each, the controller's PLACEMENT_CHANGED event carries its timeline from detection:
``planned`` (spare picked, job's collectives voided, rewire command issued: the control-plane
part, device delay excluded), ``device confirmed`` (the OCS confirmed the moved cross-connects:
includes the reconfiguration delay) and ``stored`` (new placement in etcd). The total adds, for
heartbeat loss, the detection delay (last heartbeat to watchdog). Prints p50/p99 per part.

LUMION reports about 1 s to swap and restart; Morphlux 1.1 s to rewire and start the job.
Run: ``.venv/bin/python bench/failover.py [--failures 40] [--delay-ms 25] [--heartbeat-ms 100]``.
"""

from __future__ import annotations

import argparse
import asyncio
import math
import time
from collections.abc import Sequence

import grpc
from support import description

from lightrail.agents.client import ControllerClient
from lightrail.controller.cli.embedded import embedded_config, running_controller, spawn_emulator
from lightrail.controller.config import FabricSection
from lightrail.controller.domain.events import JobEvent, JobEventKind
from lightrail.controller.domain.model import Collective, PhaseKey, ProcessGroup, RankPlacement
from lightrail.controller.logs import configure_logging
from lightrail.controller.store.etcd_server import EmbeddedEtcd
from lightrail.v1 import agent_pb2, agent_pb2_grpc


def pct(values: Sequence[float], q: float) -> float:
    s = sorted(values)
    return s[max(0, min(len(s) - 1, math.ceil(q * len(s)) - 1))] if s else float("nan")


async def next_placement(events: asyncio.Queue[JobEvent], timeout_s: float) -> JobEvent:
    while True:
        ev = await asyncio.wait_for(events.get(), timeout_s)
        if ev.kind is JobEventKind.PLACEMENT_CHANGED:
            return ev


async def run(
    failures: int, delay_ms: float, heartbeat_ms: float, mode: str
) -> dict[str, list[float]]:
    section = FabricSection.model_validate(
        {"rail": {"hosts": 4, "gpus_per_host": 2, "spares": 2 * failures},
         "reconfiguration_delay_ms": delay_ms})
    out: dict[str, list[float]] = {"planned": [], "confirmed": [], "stored": [], "total": []}
    async with EmbeddedEtcd() as etcd, spawn_emulator(section) as emulator:
        cfg = embedded_config(etcd.endpoint, emulator.section, admission_timeout_s=60)
        hb_s = heartbeat_ms / 1e3
        cfg = cfg.model_copy(update={"controller": cfg.controller.model_copy(update={
            "heartbeat_interval_s": hb_s, "heartbeat_deadline_s": 3 * hb_s})})
        async with running_controller(cfg) as rc, ControllerClient(rc.grpc_target) as client:
            place = [RankPlacement(r, f"host{r // 2}", r % 2) for r in range(8)]
            await client.register_job("bench", place)
            ring = PhaseKey(ProcessGroup.of(range(8)), Collective.ALL_REDUCE)
            await asyncio.gather(*(client.enter("bench", r, ring, timeout_s=30)
                                   for r in range(8)))
            queue: asyncio.Queue[JobEvent] = asyncio.Queue()

            async def pump() -> None:
                async for ev in client.watch("bench"):
                    queue.put_nowait(ev)

            watcher = asyncio.create_task(pump())
            await asyncio.sleep(0.05)
            current = list(place)
            async with grpc.aio.insecure_channel(rc.grpc_target) as ch:
                stub = agent_pb2_grpc.AgentServiceStub(ch)
                for i in range(failures):
                    # a GPU whose failure is recorded stays failed: pick a rank on a host that
                    # has not failed yet (ranks 0, 2, 4, 6 sit on distinct hosts)
                    victim = current[(2 * i) % 8] if mode != "xid" else current[i % 8]
                    call = stub.HealthStream()  # type: ignore[call-arg]
                    healthy = [agent_pb2.GpuHealth(gpu=g, state=agent_pb2.GPU_HEALTHY)
                               for g in range(2)]
                    await call.write(agent_pb2.HealthReport(host=victim.host, gpus=healthy))
                    await call.read()
                    if mode == "xid":
                        t0 = time.monotonic()
                        await call.write(agent_pb2.HealthReport(host=victim.host, gpus=[
                            agent_pb2.GpuHealth(gpu=victim.gpu, state=agent_pb2.GPU_FAILED,
                                                xid=79, has_xid=True)]))
                        ev = await next_placement(queue, 30)
                        t1 = time.monotonic()
                        detect = 0.0
                    else:
                        t0 = time.monotonic()  # the last heartbeat: silence from here on
                        call.cancel()
                        ev = await next_placement(queue, 30)
                        t1 = time.monotonic()
                        detect = max(0.0, (t1 - t0) - float(ev.fields["stored_s"]))
                    f = ev.fields
                    out["planned"].append(float(f["planned_s"]))
                    out["confirmed"].append(float(f["device_confirmed_s"]))
                    out["stored"].append(float(f["stored_s"]))
                    out["total"].append(detect + float(f["stored_s"]) if mode != "xid"
                                        else t1 - t0)
                    call.cancel()
                    if mode != "xid":  # a silent host fails both its GPUs: two events
                        ev = await next_placement(queue, 30)
                    new = [p for p in (ev.fields.get("placement") or "").split(";") if p]
                    current = [RankPlacement(int(p.split("=")[0]),
                                             p.split("=")[1].rsplit("/gpu", 1)[0],
                                             int(p.rsplit("/gpu", 1)[1])) for p in new]
                    current.sort(key=lambda p: p.rank)
            watcher.cancel()
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=description(__doc__))
    p.add_argument("--failures", type=int, default=40)
    p.add_argument("--delay-ms", type=float, default=25.0)
    p.add_argument("--heartbeat-ms", type=float, default=100.0)
    args = p.parse_args()
    configure_logging("error", "console")
    print(f"failover timeline, {args.delay_ms:g} ms OCS delay, {args.heartbeat_ms:g} ms "
          "heartbeat (deadline 3 heartbeats); ms from detection")
    print(f"{'mode':10} {'n':>4} {'part':28} {'p50 ms':>9} {'p99 ms':>9}")
    silent = min(max(4, args.failures // 4), args.failures // 2)  # two spares per silent host
    for mode, n in (("xid", args.failures), ("heartbeat", silent)):
        res = asyncio.run(run(n, args.delay_ms, args.heartbeat_ms, mode))
        labels = {"planned": "control plane (to command)", "confirmed": "switch confirmed",
                  "stored": "placement stored + notified",
                  "total": "total (incl. detection)" if mode != "xid" else "total (to event)"}
        for key, label in labels.items():
            v = res[key]
            print(f"{mode:10} {len(v):4d} {label:28} {pct(v, 0.5) * 1e3:9.2f} "
                  f"{pct(v, 0.99) * 1e3:9.2f}")
    print("reference: LUMION ~1 s to swap and restart; Morphlux 1.1 s to rewire and start")


if __name__ == "__main__":
    main()

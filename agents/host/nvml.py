"""The NVML health source: GPU health of this host read through NVML (NVIDIA Management
Library; Python binding ``nvidia-ml-py``, import name ``pynvml``), after the model of
``lightrail.agents.host.health`` (states, XID classification, ``HealthConfig``).

Signals of ``NvmlHealthSource``
- XID critical-error and double-bit-ECC events from an NVML event set, waited on in a worker
  thread with a timeout (``HealthConfig.event_wait_timeout_s``) so that shutdown is bounded.
- A poll every ``HealthConfig.poll_interval_s``: volatile uncorrected ECC count, GPU temperature,
  and for every active NVLink its state and error counters.
- Kernel log lines (``ingest_kernel_message``): ``NVRM: Xid (...)`` lines and "GPU has fallen
  off the bus" lines, for a journald/kmsg reader to feed.
- ``NVML_ERROR_GPU_IS_LOST`` from any call: fatal for that GPU. After it NVML answers "GPU is
  lost" at once on every call, so the GPU is never polled again (no hot loop) and is dropped
  from the event set; only ``restore`` (a record from the controller) can bring it back.
- Any other NVML error: the GPU's state is UNKNOWN (not HEALTHY) and its polls back off
  exponentially up to ``HealthConfig.error_backoff_max_s``.

The thresholds of the polls and their sources are documented with ``HealthConfig``.

Where NVML cannot be initialised ``NvmlHealthSource.open`` raises ``NvmlUnavailableError``
naming what to install; there is no silent fallback to emulated GPUs (a production agent would
report healthy fake GPUs): a machine without GPUs runs ``lightrail agent --health emulated``.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time
from collections.abc import Callable, Mapping

import structlog

from lightrail.agents.host.health import (
    DEFAULT_CONFIG,
    XID_FALLEN_OFF_BUS,
    EventSource,
    GpuHealth,
    GpuId,
    HealthConfig,
    HealthState,
    classify_xid,
    xid_reason,
)
from lightrail.agents.host.hub import HealthHub, HealthSubscription
from lightrail.agents.host.kernel import KernelReport, PciKey, parse_kernel_message, pci_key
from lightrail.agents.host.nvml_binding import (
    ECC_UNCORRECTED,
    ECC_VOLATILE,
    ERR_DRIVER_NOT_LOADED,
    ERR_FUNCTION_NOT_FOUND,
    ERR_GPU_IS_LOST,
    ERR_LIBRARY_NOT_FOUND,
    ERR_NO_PERMISSION,
    ERR_TIMEOUT,
    EVENT_DBE,
    EVENT_XID,
    EVENTS_WANTED,
    NVLINK_COUNTERS,
    NVLINK_CRC_DATA,
    NVLINK_CRC_FLIT,
    NVLINK_MAX_LINKS,
    NVLINK_RECOVERY,
    NVLINK_REPLAY,
    NVML_ERROR,
    NVML_HELP,
    TEMPERATURE_GPU,
    EventData,
    GpuLost,
    NvmlFault,
    NvmlModule,
    NvmlUnavailableError,
    Unsupported,
    call,
    describe,
    handle_key,
    installed_module,
    nvml_code,
)
from lightrail.agents.host.nvml_gpu import Finding, GpuMonitor, Link, worst_finding
from lightrail.controller.domain.timing import Backoff, Clock, Sleep, WallClock

_log = structlog.get_logger(__name__)


class NvmlHealthSource:
    """GPU health of this host read through NVML (see the module docstring for the signals,
    the XID classification and its sources).

    Lifecycle: ``open`` initialises NVML, discovers the GPUs (index, UUID, PCI bus id, active
    NVLinks) and starts the event thread; ``run`` opens if needed and polls every
    ``config.poll_interval_s`` until cancelled, then closes; ``close`` stops the event thread
    (bounded by ``config.event_wait_timeout_s``) and shuts NVML down. ``open`` raises
    ``NvmlUnavailableError`` when NVML cannot be initialised.

    Injection for tests: ``nvml`` (a fake exposing the ``NvmlModule`` functions and raising
    ``pynvml.NVMLError`` subclasses), ``wall_clock`` (event stamps), ``monotonic`` (poll and
    backoff schedule), ``sleep`` (between polls) and ``backoff_wait`` (the event thread's wait
    after an NVML error; returns True to stop).
    """

    def __init__(
        self,
        host: str,
        config: HealthConfig = DEFAULT_CONFIG,
        *,
        nvml: NvmlModule | None = None,
        wall_clock: WallClock = time.time,
        monotonic: Clock = time.monotonic,
        sleep: Sleep = asyncio.sleep,
        backoff_wait: Callable[[float], bool] | None = None,
    ) -> None:
        self._host = host
        self._config = config
        self._nvml: NvmlModule = nvml if nvml is not None else installed_module()
        self._monotonic = monotonic
        self._sleep = sleep
        self._hub = HealthHub(host, wall_clock=wall_clock)
        self._lock = threading.RLock()
        self._gpus: list[GpuMonitor] = []
        self._by_handle: dict[object, GpuMonitor] = {}
        self._by_pci: dict[PciKey, GpuMonitor] = {}
        self._stop = threading.Event()
        self._backoff_wait = backoff_wait if backoff_wait is not None else self._stop.wait
        self._thread: threading.Thread | None = None
        self._opened = False
        self._closed = False
        self._restored: dict[GpuId, GpuHealth] | None = None
        self._thread_error: BaseException | None = None
        self._log = _log.bind(host=host)
        self.event_wait_errors = 0
        """NVML errors seen by the event thread (other than timeouts)."""

    # ---- HealthSource

    @property
    def host(self) -> str:
        return self._host

    @property
    def config(self) -> HealthConfig:
        return self._config

    def events(self) -> HealthSubscription:
        """Health changes from now on (call inside the running event loop)."""
        return self._hub.subscribe()

    def snapshot(self) -> dict[GpuId, GpuHealth]:
        """Current health of every discovered GPU, by GPU."""
        return self._hub.snapshot()

    async def wait_alive(self) -> None:
        """A real host is alive while this agent runs (a hung host hangs the agent itself)."""
        return None

    def restore(self, unhealthy: Mapping[GpuId, GpuHealth]) -> None:
        """Make ``unhealthy`` the kept (latched) findings: each listed GPU keeps its state until
        the next ``restore`` without it; every other GPU loses its latched finding (a lost GPU
        is then polled again and, if still lost, fails again at once). An entry whose UUID
        differs from the device's is about a replaced GPU and is dropped. Before ``open`` the
        record is kept and applied at discovery."""
        with self._lock:
            if not self._opened:
                self._restored = dict(unhealthy)
                return
            self._apply_restore_locked(unhealthy)

    async def run(self) -> None:
        """Open if needed, then poll every ``config.poll_interval_s`` until cancelled; close on
        the way out. Raises ``NvmlUnavailableError`` when NVML cannot be initialised and
        ``RuntimeError`` when the event thread died of an unexpected exception."""
        if not self._opened:
            await self.open()
        try:
            while True:
                await asyncio.to_thread(self.poll_once)
                if self._thread_error is not None:
                    raise RuntimeError(
                        f"NVML event thread of host {self._host} died"
                    ) from self._thread_error
                await self._sleep(self._config.poll_interval_s)
        finally:
            await self.close()

    async def __aenter__(self) -> NvmlHealthSource:
        await self.open()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    # ---- lifecycle

    async def open(self) -> None:
        """Initialise NVML, discover the GPUs and start the event thread. Raises
        ``NvmlUnavailableError`` (naming the library and what to install) when NVML cannot be
        initialised; per-GPU discovery errors make that GPU FAILED (lost) or UNKNOWN instead."""
        if self._opened:
            return
        self._hub.attach_loop(asyncio.get_running_loop())
        await asyncio.to_thread(self._open_blocking)
        thread = threading.Thread(
            target=self._events_main, name=f"nvml-events-{self._host}", daemon=True
        )
        self._thread = thread
        thread.start()

    async def close(self) -> None:
        """Stop the event thread (waits at most ``event_wait_timeout_s`` plus one second) and
        shut NVML down. If the thread does not stop in time NVML is left initialised: freeing
        an event set a thread is still waiting on is unsafe, and the process is exiting."""
        if self._closed or not self._opened:
            self._closed = True
            return
        self._closed = True
        self._stop.set()
        thread = self._thread
        if thread is not None:
            await asyncio.to_thread(thread.join, self._config.event_wait_timeout_s + 1.0)
            if thread.is_alive():
                self._log.error("nvml_event_thread_did_not_stop",
                                timeout_s=self._config.event_wait_timeout_s + 1.0)
                return
        try:
            await asyncio.to_thread(self._nvml.nvmlShutdown)
        except NVML_ERROR as e:
            self._log.warning("nvml_shutdown_failed", error=describe(e))

    def _open_blocking(self) -> None:
        try:
            self._nvml.nvmlInit()
        except NVML_ERROR as e:
            code = nvml_code(e)
            if code == ERR_LIBRARY_NOT_FOUND:
                what = "the NVML library libnvidia-ml.so.1 was not found"
            elif code == ERR_DRIVER_NOT_LOADED:
                what = "the NVIDIA kernel driver is not loaded"
            elif code == ERR_NO_PERMISSION:
                what = "no permission to open the NVIDIA devices"
            elif code == ERR_FUNCTION_NOT_FOUND:
                what = "libnvidia-ml.so.1 is too old for nvidia-ml-py"
            else:
                what = "nvmlInit failed"
            raise NvmlUnavailableError(
                f"NVML unavailable on host {self._host}: {what} ({describe(e)}). {NVML_HELP}"
            ) from e
        try:
            count = int(self._nvml.nvmlDeviceGetCount())
        except NVML_ERROR as e:
            with contextlib.suppress(Exception):
                self._nvml.nvmlShutdown()
            raise NvmlUnavailableError(
                f"NVML on host {self._host} cannot count GPUs ({describe(e)}). {NVML_HELP}"
            ) from e
        with self._lock:
            for index in range(count):
                self._discover(index)
            self._opened = True
            if self._restored is not None:
                self._apply_restore_locked(self._restored)
                self._restored = None
        self._log.info("nvml_gpus_discovered", gpus=count,
                       lost=[g.gpu.index for g in self._gpus if g.lost])

    def _discover(self, index: int) -> None:
        gpu = self._hub.add_gpu(index, reason="not yet polled")
        log = self._log.bind(gpu=index)
        g = GpuMonitor(gpu=gpu, handle=None, uuid=None, pci=None, log=log)
        g.findings["poll"] = Finding(HealthState.UNKNOWN, "not yet polled", None,
                                      EventSource.NVML_POLL)
        self._gpus.append(g)
        try:
            g.handle = call(self._nvml.nvmlDeviceGetHandleByIndex, index)
            self._by_handle[handle_key(g.handle)] = g
            g.uuid = str(call(self._nvml.nvmlDeviceGetUUID, g.handle))
            self._hub.set_uuid(gpu, g.uuid)
            g.pci = pci_key(call(self._nvml.nvmlDeviceGetPciInfo, g.handle).busId)
            if g.pci is not None:
                self._by_pci[g.pci] = g
            g.log = log.bind(uuid=g.uuid)
            self._discover_links(g)
        except GpuLost:
            self._mark_lost_locked(g, "NVML: GPU is lost (at discovery)", None,
                                   EventSource.NVML_POLL)
        except (NvmlFault, Unsupported) as e:
            g.findings.pop("poll", None)
            g.findings["nvml"] = Finding(HealthState.UNKNOWN, f"NVML discovery failed: {e}",
                                          None, EventSource.NVML_POLL)
            g.log.warning("nvml_discovery_failed", error=str(e))
        self._refresh_locked(g)

    def _discover_links(self, g: GpuMonitor) -> None:
        for link in range(NVLINK_MAX_LINKS):
            try:
                active = call(self._nvml.nvmlDeviceGetNvLinkState, g.handle, link)
            except Unsupported:
                continue
            if active:
                g.links[link] = Link()
        if g.links:
            g.log.info("nvlinks_discovered", links=sorted(g.links))

    # ---- polling

    def poll_once(self) -> None:
        """Poll every GPU that is due: not lost, and past its backoff. Blocking (NVML calls);
        ``run`` calls it in a worker thread. Never polls a lost GPU."""
        now_s = self._monotonic()
        with self._lock:
            due = [g for g in self._gpus if not g.lost and g.handle is not None
                   and now_s >= g.next_poll_s]
        for g in due:
            self._poll_gpu(g, now_s)

    def _poll_gpu(self, g: GpuMonitor, now_s: float) -> None:
        findings: dict[str, Finding] = {}
        try:
            self._poll_temperature(g, findings)
            self._poll_ecc(g, findings)
            self._poll_nvlinks(g, now_s, findings)
        except GpuLost:
            with self._lock:
                self._mark_lost_locked(g, "NVML: GPU is lost", None, EventSource.NVML_POLL)
                self._refresh_locked(g)
            return
        except NvmlFault as e:
            g.errors_in_row += 1
            delay_s = self._backoff_s(g.errors_in_row, self._config.poll_interval_s)
            g.next_poll_s = now_s + delay_s
            g.log.warning("nvml_poll_failed", error=str(e), errors_in_row=g.errors_in_row,
                          next_poll_in_s=delay_s)
            with self._lock:
                g.findings.pop("poll", None)
                g.findings["nvml"] = Finding(HealthState.UNKNOWN, f"NVML error: {e}", None,
                                              EventSource.NVML_POLL)
                self._refresh_locked(g)
            return
        g.errors_in_row = 0
        g.next_poll_s = now_s
        g.last_poll_s = now_s
        with self._lock:
            if g.lost:
                return
            g.findings = findings
            self._refresh_locked(g)

    def _poll_temperature(self, g: GpuMonitor, findings: dict[str, Finding]) -> None:
        if not g.temperature_supported:
            return
        try:
            temp_c = float(call(self._nvml.nvmlDeviceGetTemperature, g.handle,
                                      TEMPERATURE_GPU))
        except Unsupported:
            g.temperature_supported = False
            return
        cfg = self._config
        if temp_c >= cfg.temperature_degraded_c:
            g.hot = True
        elif temp_c < cfg.temperature_degraded_c - cfg.temperature_hysteresis_c:
            g.hot = False
        if g.hot:
            findings["temperature"] = Finding(
                HealthState.DEGRADED,
                f"temperature {temp_c:.0f} °C (threshold {cfg.temperature_degraded_c:.0f} °C)",
                None, EventSource.NVML_POLL)

    def _poll_ecc(self, g: GpuMonitor, findings: dict[str, Finding]) -> None:
        if not g.ecc_supported:
            return
        try:
            count = int(call(self._nvml.nvmlDeviceGetTotalEccErrors, g.handle,
                                   ECC_UNCORRECTED, ECC_VOLATILE))
        except Unsupported:  # ECC disabled or not on this board
            g.ecc_supported = False
            return
        if count >= self._config.ecc_uncorrected_degraded_count:
            findings["ecc"] = Finding(
                HealthState.DEGRADED, f"{count} uncorrected ECC errors since driver load",
                None, EventSource.NVML_POLL)

    def _poll_nvlinks(self, g: GpuMonitor, now_s: float, findings: dict[str, Finding]) -> None:
        if not g.links:
            return
        cfg = self._config
        dt_s = now_s - g.last_poll_s if g.last_poll_s is not None else None
        bad: list[str] = []
        for link_id, link in sorted(g.links.items()):
            try:
                active = call(self._nvml.nvmlDeviceGetNvLinkState, g.handle, link_id)
            except Unsupported:
                active = link.active
            if link.active and not active:
                bad.append(f"NVLink {link_id} down")
            link.active = bool(active)
            deltas: dict[int, int] = {}
            for counter in NVLINK_COUNTERS:
                if counter in link.unsupported:
                    continue
                try:
                    value = int(call(self._nvml.nvmlDeviceGetNvLinkErrorCounter,
                                           g.handle, link_id, counter))
                except Unsupported:
                    link.unsupported.add(counter)
                    continue
                last = link.counters[counter]
                link.counters[counter] = value
                if last is not None and value >= last:
                    deltas[counter] = value - last
            replay = deltas.get(NVLINK_REPLAY, 0) + deltas.get(NVLINK_RECOVERY, 0)
            crc = deltas.get(NVLINK_CRC_FLIT, 0) + deltas.get(NVLINK_CRC_DATA, 0)
            if replay >= cfg.nvlink_replay_recovery_errors:
                bad.append(f"NVLink {link_id}: {replay} replay/recovery errors")
            if dt_s is not None and dt_s > 0 and crc / dt_s >= cfg.nvlink_crc_errors_per_s:
                bad.append(f"NVLink {link_id}: {crc / dt_s:.0f} CRC errors/s")
        if bad:
            g.nvlink_bad_until_s = now_s + cfg.nvlink_hold_s
            g.nvlink_reason = "; ".join(bad)
        if now_s < g.nvlink_bad_until_s or bad:
            findings["nvlink"] = Finding(HealthState.DEGRADED, g.nvlink_reason, None,
                                          EventSource.NVML_POLL)

    def _backoff_s(self, errors_in_row: int, base_s: float) -> float:
        """The wait after ``errors_in_row`` (>= 1) NVML errors in a row: ``base_s`` doubling up
        to ``config.error_backoff_max_s``."""
        policy = Backoff(initial_s=base_s, max_s=self._config.error_backoff_max_s)
        return policy.delay_s(errors_in_row - 1)

    # ---- NVML calls and findings

    def _mark_lost_locked(self, g: GpuMonitor, reason: str, xid: int | None,
                          source: EventSource) -> None:
        if not g.lost:
            g.lost = True
            g.log.error("gpu_lost", reason=reason, xid=xid, source=source.value)
        else:
            g.log.info("gpu_lost_again", reason=reason, xid=xid, source=source.value)
        self._latch_locked(g, Finding(HealthState.FAILED, reason, xid, source))

    def _latch_locked(self, g: GpuMonitor, finding: Finding) -> None:
        if g.latched is None or finding.state.severity > g.latched.state.severity:
            g.latched = finding

    def _refresh_locked(self, g: GpuMonitor) -> None:
        candidates = list(g.findings.values())
        if g.latched is not None:
            candidates.append(g.latched)
        worst = worst_finding(candidates)
        if worst is None:
            worst = Finding(HealthState.HEALTHY, "no fault found", None, EventSource.NVML_POLL)
        event = self._hub.set(g.gpu, worst.state, worst.reason, worst.xid, worst.source)
        if event is not None:
            g.log.info("gpu_health_changed", state=event.state.value, reason=event.reason,
                       xid=event.xid, source=event.source.value)

    def _apply_restore_locked(self, unhealthy: Mapping[GpuId, GpuHealth]) -> None:
        present = {g.gpu for g in self._gpus}
        for gpu in unhealthy:
            if gpu not in present:
                self._log.warning("restored_gpu_not_present", gpu=gpu.index)
        for g in self._gpus:
            entry: GpuHealth | None = unhealthy.get(g.gpu)
            if entry is not None and entry.uuid and g.uuid and entry.uuid != g.uuid:
                g.log.info("restored_record_for_replaced_gpu", recorded_uuid=entry.uuid)
                entry = None
            if entry is None or not entry.state.unhealthy:
                g.latched = None
                if g.lost:  # poll it again: if it is still lost it fails again at once
                    g.lost = False
                    g.next_poll_s = 0.0
            else:
                g.latched = Finding(entry.state, entry.reason, entry.xid, EventSource.RESTORED)
            self._refresh_locked(g)

    # ---- XIDs from events and the kernel log

    def ingest_kernel_message(self, line: str) -> KernelReport | None:
        """Apply one kernel log line (see ``parse_kernel_message``) to the GPU at its PCI
        address; returns what it said, or ``None`` when the line is not about a known GPU."""
        report = parse_kernel_message(line)
        if report is None:
            return None
        with self._lock:
            g = self._by_pci.get(report.pci)
            if g is None:
                self._log.warning("kernel_message_for_unknown_gpu", pci=report.pci, xid=report.xid)
                return None
            self._apply_xid_locked(g, report.xid, EventSource.KERNEL_LOG)
        return report

    def _apply_xid_locked(self, g: GpuMonitor, xid: int, source: EventSource) -> None:
        state = classify_xid(xid, self._config)
        if state is None:
            g.log.info("xid_without_health_impact", xid=xid, source=source.value)
            return
        if xid == XID_FALLEN_OFF_BUS:
            self._mark_lost_locked(g, xid_reason(xid), xid, source)
        else:
            self._latch_locked(g, Finding(state, xid_reason(xid), xid, source))
        self._refresh_locked(g)

    def _on_event(self, data: EventData) -> None:
        event_type = int(data.eventType)
        with self._lock:
            g = self._by_handle.get(handle_key(data.device))
            if g is None:
                self._log.warning("nvml_event_for_unknown_device", event_type=event_type)
                return
            if event_type & EVENT_XID:
                self._apply_xid_locked(g, int(data.eventData), EventSource.NVML_EVENT)
            elif event_type & EVENT_DBE:
                self._latch_locked(g, Finding(HealthState.FAILED, "double-bit ECC error event",
                                               None, EventSource.NVML_EVENT))
                self._refresh_locked(g)

    # ---- event thread

    def _create_event_set(self) -> tuple[object | None, int]:
        """A new event set with every GPU that is not lost registered; (set, registered)."""
        try:
            event_set = self._nvml.nvmlEventSetCreate()
        except NVML_ERROR as e:
            self._log.warning("nvml_event_set_create_failed", error=describe(e))
            return None, 0
        registered = 0
        with self._lock:
            gpus = [g for g in self._gpus if not g.lost and g.handle is not None]
        for g in gpus:
            try:
                supported = int(call(self._nvml.nvmlDeviceGetSupportedEventTypes, g.handle))
                mask = supported & EVENTS_WANTED
                if mask:
                    call(self._nvml.nvmlDeviceRegisterEvents, g.handle, mask, event_set)
                    registered += 1
            except GpuLost:
                with self._lock:
                    self._mark_lost_locked(g, "NVML: GPU is lost", None, EventSource.NVML_EVENT)
                    self._refresh_locked(g)
            except (Unsupported, NvmlFault) as e:
                g.log.warning("nvml_event_registration_failed", error=str(e))
        return event_set, registered

    def _free_event_set(self, event_set: object | None) -> None:
        if event_set is None:
            return
        try:
            self._nvml.nvmlEventSetFree(event_set)
        except NVML_ERROR as e:
            self._log.warning("nvml_event_set_free_failed", error=describe(e))

    def _events_main(self) -> None:
        """Wait for NVML events until stopped. A wait times out every ``event_wait_timeout_s``
        so the stop flag is seen; after an error the thread backs off exponentially (up to
        ``error_backoff_max_s``) so a GPU that answers "lost" at once cannot spin it, and a
        "GPU is lost" rebuilds the set without the lost GPU."""
        timeout_ms = max(1, round(self._config.event_wait_timeout_s * 1000))
        event_set: object | None = None
        rebuild = True
        failures = 0
        try:
            while not self._stop.is_set():
                if rebuild:
                    self._free_event_set(event_set)
                    event_set, registered = self._create_event_set()
                    rebuild = False
                    if event_set is None:
                        failures += 1
                        rebuild = True
                        if self._backoff_wait(self._backoff_s(failures, 1.0)):
                            break
                        continue
                    if registered == 0:
                        self._log.info("nvml_no_gpu_registered_for_events")
                        break
                try:
                    data = self._nvml.nvmlEventSetWait(event_set, timeout_ms)
                except NVML_ERROR as e:
                    code = nvml_code(e)
                    if code == ERR_TIMEOUT:
                        failures = 0
                        continue
                    failures += 1
                    self.event_wait_errors += 1
                    rebuild = code == ERR_GPU_IS_LOST
                    delay_s = self._backoff_s(failures, self._config.event_wait_timeout_s)
                    self._log.warning("nvml_event_wait_failed", error=describe(e),
                                      failures_in_row=failures, retry_in_s=delay_s)
                    if self._backoff_wait(delay_s):
                        break
                    continue
                failures = 0
                self._on_event(data)
        except Exception as e:  # surfaced by run(): an unexpected exit is an error
            self._thread_error = e
            self._log.exception("nvml_event_thread_crashed")
        finally:
            self._free_event_set(event_set)

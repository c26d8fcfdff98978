"""`python -m benchmarks.kernel.sustained`: vattn's call in a short burst and under sustained load, with the GPU's
clock, power and energy (NVML) read while it runs.

The bench times a few graph replays at a time, so a shape is timed in well under a second of load. On an H200
this kernel draws the board's 700 W within about half a second of sustained load: the driver's software power cap
(clock event 0x4) then takes the SM clock from 1980 to 1.35-1.67 GHz, and the long batches' per-layer times rise by
10-15% (benchmarks/NOTES.md P109). A busy server runs capped, so the figure that carries over to serving is the
sustained one, and what makes it faster is fewer joules a call as much as fewer cycles. Per shape and build: the
idle GPU rests, the call's graph is timed as the bench times it (burst), then replayed back to back for
`--seconds`; the second half of that is the sustained window (median us a call, the SM clock, the energy counter's
joules a call, the share of samples under the power cap). Builds alternate within each round (`--builds`:
measurement defines added to the backend's own, e.g. the lossy `q1:K8_QPARTS=1`)."""

from __future__ import annotations

import argparse
import statistics
import time

from benchmarks.kernel import harness
from benchmarks.kernel.shapes import select

DEFAULT_SHAPES = "16x35k,32x8k-hd128-gqa8,16x119k"
SW_POWER_CAP = 0x4  # NVML's clocks event reason: the driver holds the board at its power limit


def summarize(blocks: list[dict], calls_per_block: int, energy_mj: tuple[int, int]) -> dict:
    """The sustained window's figures from its blocks (each: us of its replays, SM MHz and clock event reasons
    sampled after it) and the energy counter (mJ) at the window's start and end."""
    calls = calls_per_block * len(blocks)
    return dict(sustained_us=statistics.median(b["us_per_call"] for b in blocks),
                sm_mhz=statistics.median(b["sm_mhz"] for b in blocks),
                power_capped_share=sum(bool(b["reasons"] & SW_POWER_CAP) for b in blocks) / len(blocks),
                mj_per_call=(energy_mj[1] - energy_mj[0]) / calls, calls=calls)


class Gpu:
    """NVML's view of the GPU torch runs on: SM clock, clock event reasons, total energy."""

    def __init__(self):
        import pynvml
        import torch

        p = torch.cuda.get_device_properties(torch.cuda.current_device())
        pynvml.nvmlInit()
        self.nvml = pynvml
        self.handle = pynvml.nvmlDeviceGetHandleByPciBusId(
            f"{p.pci_domain_id:08x}:{p.pci_bus_id:02x}:{p.pci_device_id:02x}.0")

    def sm_mhz(self) -> int:
        return self.nvml.nvmlDeviceGetClockInfo(self.handle, self.nvml.NVML_CLOCK_SM)

    def reasons(self) -> int:
        return self.nvml.nvmlDeviceGetCurrentClocksEventReasons(self.handle)

    def energy_mj(self) -> int:
        return self.nvml.nvmlDeviceGetTotalEnergyConsumption(self.handle)


def call_graph(shape, b):
    """The bench's call (plan + main + reduce, R replicas) captured once: (graph, its function, calls a replay,
    rel_err). The function holds the workspace, whose bound kernels the graph launches: keep it as long."""
    import vattn
    from benchmarks.kernel.bench import _workspace

    ws = _workspace(shape, b, None)

    def call(r):
        pl = vattn.plan(b.seq_lens, b.cu, num_kv_heads=shape.num_kv_heads, page_size=shape.page_size,
                        mode="balanced", workspace=ws)
        vattn.attention(*b.attention_args(r), plan=pl, out=b.out)

    def run():
        for r in range(b.replicas):
            call(r)

    call(0)  # the reference is replica 0's
    rel_err, _ = harness.check(b.out, b.reference())
    return harness.capture(run), run, b.replicas, rel_err


def measure_one(gpu: Gpu, graph, calls: int, seconds: float, rest: float, replays: int) -> dict:
    """Rest, burst, then `seconds` of back-to-back replays; the second half is the sustained window."""
    import torch

    time.sleep(rest)
    burst = harness._median_event_us(graph.replay, replays) / calls
    per_block = max(1, int(20_000 / max(burst * calls, 1)))  # ~20 ms of replays between samples
    blocks, start_energy, t_end = [], None, time.perf_counter() + seconds
    t_half = time.perf_counter() + seconds / 2
    while time.perf_counter() < t_end:
        if start_energy is None and time.perf_counter() >= t_half:
            torch.cuda.synchronize()
            start_energy, blocks = gpu.energy_mj(), []
        a, z = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        for _ in range(per_block):
            graph.replay()
        z.record()
        z.synchronize()
        blocks.append(dict(us_per_call=a.elapsed_time(z) * 1e3 / (per_block * calls), sm_mhz=gpu.sm_mhz(),
                           reasons=gpu.reasons()))
    end_energy = gpu.energy_mj()
    return dict(burst_us=burst, **summarize(blocks, per_block * calls, (start_energy, end_energy)))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--shapes", default=DEFAULT_SHAPES, help=f"comma-separated shape names (default {DEFAULT_SHAPES})")
    ap.add_argument("--builds", default="default",
                    help="';'-separated NAME[:DEFINE=INT,...]: main_sm90.cu defines added to the backend's build "
                         "(measurement builds; default: the backend's own)")
    ap.add_argument("--seconds", type=float, default=3.0, help="sustained replays a shape and build (default 3)")
    ap.add_argument("--rest", type=float, default=5.0, help="idle seconds before each burst (default 5)")
    ap.add_argument("--rounds", type=int, default=2, help="rounds of the builds in turns (default 2)")
    ap.add_argument("--replays", type=int, default=20, help="burst: timed graph replays (median)")
    ap.add_argument("--out", default="sustained.json", help="JSON list of records (default sustained.json)")
    a = ap.parse_args(argv)
    for field, value in (("--seconds", a.seconds), ("--rounds", a.rounds), ("--replays", a.replays)):
        if value <= 0:
            ap.error(f"{field}: got {value}; allowed: a positive number")
    if a.rest < 0:
        ap.error(f"--rest: got {a.rest}; allowed: 0 or more seconds")
    try:
        builds, shapes = harness.parse_named_defines(a.builds, "--builds"), select(a.shapes)
    except ValueError as exc:
        ap.error(str(exc))
    import torch

    if not torch.cuda.is_available():
        ap.error("needs a CUDA GPU and NVML")
    from vattn.hopper import backend as hopper_backend

    own_build = hopper_backend.main_build
    gpu, (date, command) = Gpu(), harness.provenance("benchmarks.kernel.sustained", argv)
    where, ceiling = torch.cuda.get_device_name(), harness.read_ceiling_tbps()
    batches, records = harness.BatchCache("cuda"), []
    print(f"{'shape':24s} {'build':10s} {'burst us':>9s} {'sust. us':>9s} {'x':>6s} {'TB/s':>6s} {'MHz':>5s} "
          f"{'capped':>6s} {'mJ/call':>8s} rel_err", flush=True)
    for shape in shapes:
        b = batches.get(shape)
        graphs = {}
        for name, defines in builds.items():  # each build on a workspace of its own, bound at its first call
            hopper_backend.main_build = lambda *args, _d=defines, **kw: _with_defines(own_build(*args, **kw), _d)
            hopper_backend._kernel.cache_clear()
            graphs[name] = call_graph(shape, b)
        hopper_backend.main_build = own_build
        hopper_backend._kernel.cache_clear()
        for rnd in range(a.rounds):
            for name, (graph, _, calls, rel_err) in graphs.items():
                r = measure_one(gpu, graph, calls, a.seconds, a.rest, a.replays)
                r.update(shape=shape.name, build=name, defines=builds[name], round=rnd, rel_err=rel_err,
                         sustained_tbps=shape.kv_bytes / r["sustained_us"] / 1e6, command=command)
                records.append(harness.stamp(r, where, date, ceiling))
                print(f"{shape.name:24s} {name:10s} {r['burst_us']:9.1f} {r['sustained_us']:9.1f} "
                      f"{r['sustained_us'] / r['burst_us']:6.3f} {r['sustained_tbps']:6.2f} {r['sm_mhz']:5.0f} "
                      f"{r['power_capped_share']:6.2f} {r['mj_per_call']:8.3f} {rel_err:.1e}", flush=True)
                harness.save_records(a.out, records)  # after every record: a run cut short keeps what it measured
    print(f"wrote {len(records)} records to {a.out}")
    return 0


def _with_defines(build: dict, defines: dict) -> dict:
    return dict(build, extra_defines=dict(build.get("extra_defines") or {}) | defines)


if __name__ == "__main__":
    raise SystemExit(main())

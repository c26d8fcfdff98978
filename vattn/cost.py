"""Cost model: the time of one attention layer call for a batch, from a hardware profile.

vattn: the plan's pieces (plan_splits, the core of plan_python) run as Hkv programs each on SLOTS
resident slots. Programs that run together share the wave rate (processor sharing); the wave rate is
the kernel path's (kernel_path: split-Q fp8, fp8 widened to fp16, or a 16-bit cache) bytes term plus a
compute term that grows with the packed query rows (q_len x GQA). A program with its SM to itself runs
up to slot_boost faster (slot_sharing "sm"), or, in the older device-level form, a lone program takes
up to slot_boost x its fair share. Programs past one wave wait for a free slot in launch order.
Total = plan (per planner) + launches + makespan + reduce (fixed + per piece of the most-split
sequence + per sequence of its grid). The H200 profile is fitted to the bench's H200 records in benchmarks/
(`python -m benchmarks.kernel.fit_cost`); `python -m benchmarks.kernel.cost_check --check-cycles RUN_DIR`
compares it with a kernel-in-the-loop run's measured calls.

vattn_hopper: vattn with VATTN_HOPPER=1. The calls its kernels cover (vattn.hopper.backend.covers_shape) run
the same model with the profile's `vattn_hopper` figures, planned as that backend plans (one CTA per SM, its
piece overhead, two KV heads a CTA where it reads them so), on its kernel paths (hopper_path); every other call
is vattn's Triton path, as on the GPU.

baseline: the engine's default kernel, fitted as fixed_us + KV bytes / tbps (or + work / rate) per
(kv_dtype, phase) from measured tables; profiles cite each figure's source.
"""
from __future__ import annotations

import heapq
import math
from dataclasses import dataclass, field, replace
from pathlib import Path

from vattn import switch
from vattn.hopper import backend as hopper_backend
from vattn.hopper.backend import covers_shape, group_split, kv_heads_per_cta, piece_overhead_tiles
from vattn.planner import BALANCED, KV_TILE, PIECE_OVERHEAD_TILES, PLANNERS, held, plan_splits_and_tails

KV_BYTES = {"fp8": 1, "fp8_e4m3": 1, "bf16": 2, "fp16": 2}
PHASES = ("verify", "decode", "any")  # decode: every live sequence has q_len 1; any: one fit for both


@dataclass(frozen=True)
class VattnModel:
    wave_tbps: float  # KV TB/s of the main kernel when every slot is busy (solved from `calibration`)
    slot_boost: float  # most a program speeds up when slots idle, as a multiple of its fair share
    piece_latency_us: float  # per-program prologue (Q load, pipeline fill), paid once per piece
    launch_us: float  # per kernel launch inside a CUDA graph (plan, main, reduce)
    plan_us: float | dict[str, float]  # the plan kernel, one figure or one per planner
    reduce_fixed_us: float
    reduce_tbps: float  # the reduce's bandwidth over the partials' bytes (fitted on fp32 ones)
    page_efficiency: dict[int, float]  # gather efficiency by page size, relative to the calibration's
    # Per kernel path (see kernel_path): the main loop's bytes term (TB/s, replaces wave_tbps) and its
    # effective TFLOP/s: Q.K^T + P.V cost 4 x rows x D flops per KV token, so a path reads KV at
    # 1 / (1 / path_tbps + 2 x rows / (bytes per element x dot_tflops)): more packed query rows, slower.
    # Empty: the main loop is bytes-bound at `wave_tbps` whatever the rows.
    path_tbps: dict[str, float] = field(default_factory=dict)
    dot_tflops: dict[str, float] = field(default_factory=dict)
    slot_sharing: str = "device"  # "device" | "sm": what programs share (see _makespan_us)
    reduce_piece_us: float = 0.0  # per partial of the most-split sequence (the reduce loops over them)
    # per sequence x KV head of the reduce's grid: the split ones on the Hopper path (its reduce skips whole ones),
    # every live one on the Triton path (its grid spans the batch; vattn.kernel.launch_reduce)
    reduce_seq_us: float = 0.0
    # Without dot_tflops every path is bytes-bound at its path_tbps (the Hopper kernels' paths: they always compute
    # 64 packed rows, so their rows cost the same on every batch)


@dataclass(frozen=True)
class BaselineEntry:
    kv_dtype: str
    phase: str
    fixed_us: float
    tbps: float = 0.0  # KV bytes / time beyond fixed_us (0: no bytes term)
    gelems_per_s: float = 0.0  # sum(L x Hq x D) / time beyond fixed_us (0: no compute term)
    gqa_factor: dict[int, float] = field(default_factory=dict)  # measured time multiplier by GQA


@dataclass(frozen=True)
class HardwareProfile:
    name: str
    device: str
    sms: int
    slots_per_sm: int
    read_ceiling_tbps: float
    vattn: VattnModel
    baseline: str  # name of the default entry in `baselines` (what vattn replaces)
    baselines: dict[str, tuple[BaselineEntry, ...]]
    vattn_hopper: VattnModel | None = None  # vattn with VATTN_HOPPER=1 (module docstring); None: not modelled

    @property
    def slots(self) -> int:
        return self.sms * self.slots_per_sm


# -- loading ---------------------------------------------------------------------------------------

def _need(d: dict, key: str, where: str):
    if key not in d:
        raise ValueError(f"{where}.{key}: missing; see configs/hardware/h200.yaml for the fields")
    return d[key]


def _build(raw: dict, source: str) -> tuple[HardwareProfile, dict | None]:
    vraw = dict(_need(raw, "vattn", source))
    calibration = vraw.pop("calibration", None)
    if calibration is None and "wave_tbps" not in vraw:
        raise ValueError(f"{source}.vattn: needs wave_tbps or a calibration point")
    vraw.setdefault("wave_tbps", 1.0)  # placeholder until solved from the calibration point
    try:
        vattn = VattnModel(**vraw)
    except TypeError as e:
        raise ValueError(f"{source}.vattn: {e}") from None
    hopper = None
    if "vattn_hopper" in raw:
        try:
            hopper = VattnModel(**raw["vattn_hopper"])
        except TypeError as e:
            raise ValueError(f"{source}.vattn_hopper: {e}") from None
    for key, model in (("vattn", vattn), ("vattn_hopper", hopper)):
        if isinstance(getattr(model, "plan_us", None), dict) and set(model.plan_us) != set(PLANNERS):
            raise ValueError(f"{source}.{key}.plan_us: got planners {', '.join(model.plan_us)}; a figure per "
                             f"planner needs exactly {', '.join(PLANNERS)} (or one figure for all)")
    baselines = {}
    for name, entries in _need(raw, "baselines", source).items():
        try:
            baselines[name] = tuple(BaselineEntry(**e) for e in entries)
        except TypeError as e:
            raise ValueError(f"{source}.baselines.{name}: {e}") from None
        for i, e in enumerate(baselines[name]):
            if e.phase not in PHASES or e.kv_dtype not in KV_BYTES:
                raise ValueError(f"{source}.baselines.{name}[{i}]: got phase {e.phase!r}, kv_dtype {e.kv_dtype!r}; "
                                 f"allowed: phase {', '.join(PHASES)}; kv_dtype {', '.join(KV_BYTES)}")
    prof = HardwareProfile(
        name=str(_need(raw, "name", source)), device=str(_need(raw, "device", source)),
        sms=int(_need(raw, "sms", source)), slots_per_sm=int(_need(raw, "slots_per_sm", source)),
        read_ceiling_tbps=float(_need(raw, "read_ceiling_tbps", source)), vattn=vattn,
        baseline=str(_need(raw, "baseline", source)), baselines=baselines, vattn_hopper=hopper)
    if prof.baseline not in baselines:
        raise ValueError(f"{source}.baseline: got {prof.baseline!r}; allowed: {', '.join(baselines)}")
    return prof, calibration


def load_profile(name_or_path: str | Path, profiles_dir: str | Path | None = None) -> HardwareProfile:
    """A profile by name ("h200": <profiles_dir>/h200.yaml) or by path to its YAML.

    profiles_dir: where named profiles live; the caller knows (the repository keeps them in
    configs/hardware/, pipeline.paths.HARDWARE_PROFILES_DIR). Without it only a path will do.
    """
    import yaml

    path = Path(name_or_path)
    if not path.suffix:
        if profiles_dir is None:
            raise ValueError(f"profile: got {str(name_or_path)!r}, a name; pass profiles_dir to look it up, "
                             "or give a path to a profile YAML")
        path = Path(profiles_dir) / f"{name_or_path}.yaml"
    if not path.is_file():
        known = sorted(p.stem for p in Path(profiles_dir).glob("*.yaml")) if profiles_dir else []
        raise ValueError(f"profile: got {str(name_or_path)!r}; no file {path}; known: {', '.join(known)} or a path")
    prof, calibration = _build(yaml.safe_load(path.read_text()), path.name)
    return prof if calibration is None else calibrate(prof, **calibration)


def calibrate(prof: HardwareProfile, *, batch: int, seq_len: int, q_len: int, planner: str, tbps: float,
              num_kv_heads: int, head_dim: int, gqa: int, kv_dtype: str, page_size: int) -> HardwareProfile:
    """Solve wave_tbps so that a uniform batch runs at `tbps` of KV bytes, plan + main + reduce."""
    lens, qs = [seq_len] * batch, [q_len] * batch
    shape = dict(num_kv_heads=num_kv_heads, head_dim=head_dim, gqa=gqa, kv_dtype=kv_dtype, page_size=page_size)
    target_us = kv_bytes(lens, qs, num_kv_heads, head_dim, kv_dtype) / (tbps * 1e6)
    lo, hi = 0.01, 100.0  # TB/s; predicted time falls as wave_tbps rises
    for _ in range(60):
        mid = math.sqrt(lo * hi)
        trial = replace(prof, vattn=replace(prof.vattn, wave_tbps=mid))
        if predict_attention_us(lens, qs, impl="vattn", planner=planner, profile=trial, **shape) > target_us:
            lo = mid
        else:
            hi = mid
    if hi >= 99.0:
        raise ValueError(f"calibration: {tbps} TB/s is out of reach: the fixed overheads alone exceed "
                         f"{target_us:.1f} us")
    if hi > prof.read_ceiling_tbps:
        raise ValueError(f"calibration: {tbps} TB/s at {batch} x {seq_len} needs a {hi:.2f} TB/s wave, above the "
                         f"read ceiling {prof.read_ceiling_tbps}; lower the profile's fixed costs")
    return replace(prof, vattn=replace(prof.vattn, wave_tbps=hi))


# -- prediction ------------------------------------------------------------------------------------

def kv_bytes(seq_lens, q_lens, num_kv_heads: int, head_dim: int, kv_dtype: str) -> int:
    """KV bytes the call must read: sequences with q_len 0 are absent."""
    tokens = sum(L for L, q in zip(seq_lens, q_lens) if q)
    return tokens * num_kv_heads * head_dim * 2 * KV_BYTES[kv_dtype]


def _makespan_us(runs: list[tuple[float, int]], copies: int, slots: int, wave: float, boost: float,
                 sms: int | None = None) -> float:
    """Processor-sharing makespan of programs given as runs (bytes each, count) in launch order.

    The grid is (Hkv, W) with the head fastest, so each program of a run launches with its `copies` heads.
    Every running program streams at the same rate, so completions follow a shared byte clock.
    sms None: programs share the device (min(boost x fair share, wave / running)); sms given: they share
    their SM: with `sms` or more running, the slowest shares one (fair share); a lone program runs `boost`
    times faster, and in between the boost grows linearly as fewer run.
    """
    cap = boost * wave / slots  # bytes/us per program with n running: min(cap, wave / n)
    if sms is None:
        def rate(active):
            return cap if cap * active < wave else wave / active
    elif sms >= slots:  # one program per SM: nothing to share
        def rate(active):
            return wave / slots
    else:  # the block scheduler does not spread programs one per SM: the more run, the likelier the
        def rate(active):  # slowest shares its SM, so the boost fades to none at one program per SM
            return wave / slots * (1 + (boost - 1) * max(0.0, (sms - active) / (sms - 1)))
    programs = sum([c for _, c in runs]) * copies
    if programs <= slots:  # one wave: all start at 0, finish in order of size
        t, done, active = 0.0, 0.0, programs
        for w, c in sorted(runs):
            t += (w - done) / rate(active)
            done, active = w, active - c * copies
        return t
    order = [w for w, c in runs for _ in range(c * copies)]  # launch order
    running = order[:slots]  # byte clock at which each running program finishes
    heapq.heapify(running)
    t, clock, active = 0.0, 0.0, slots
    for w in order[slots:]:  # a program ends, the next in launch order takes its slot
        finish = running[0]
        t += (finish - clock) / rate(active)
        clock = finish
        heapq.heapreplace(running, clock + w)
    for finish in sorted(running):  # the queue is empty: the rest drain as in one wave
        t += (finish - clock) / rate(active)
        clock, active = finish, active - 1
    return t


def kernel_path(q_lens, gqa: int, kv_dtype: str, head_dim: int, qk: str = "split") -> tuple[str, int]:
    """(path, packed rows) the main kernel compiles for this batch: vattn.kernel.default_config's rule
    (rows padded to a power of two >= 16; split-Q fp8 Q.K^T from 64 rows with an fp8 cache, its loop's row
    offsets hoisted at exactly 64 rows and not beyond (fp8x2_wide), the same in the K-major formulation at 16
    rows and hd256, else an fp8 cache is widened to fp16 in registers, that loop's row offsets hoisted at 16 rows
    and head_dim <= 128 (fp8to16_hoisted); a 16-bit cache is used as stored). qk="e4m3" (VATTN_QK) makes the
    split-Q paths one-pass: fp8x1..."""
    rows = max(16, 1 << (max(max(q_lens, default=1), 1) * gqa - 1).bit_length())
    if kv_dtype != "fp8":
        return "bf16", rows
    passes = "fp8x1" if qk == switch.LOSSY_QK else "fp8x2"
    if rows == 16 and head_dim == 256:
        return f"{passes}_kmajor", rows
    if rows < 64:
        return ("fp8to16_hoisted" if rows == 16 and head_dim <= 128 else "fp8to16"), rows
    return (passes if rows == 64 else f"{passes}_wide"), rows


def hopper_path(kv_dtype: str, head_dim: int, page_size: int, qk: str = "split") -> tuple[str, int]:
    """(path, packed rows) of the Hopper kernel that takes a covered call (vattn.hopper.backend._kernel): bf16
    caches kv16, e4m3 on pages of 8-row atoms k8 (its head_dim 128 build apart; qk="e4m3", VATTN_QK's one-pass
    Q.K^T: k8_q1 and k8_hd128_q1), pages of 4 the older kernel; all of them compute 64 packed rows. head_dim: a
    CTA's (two KV heads of 128 read as one are k8's 256)."""
    if kv_dtype == "bf16":
        return "kv16", 64
    if page_size % 8:
        return "sm90_page4", 64
    return ("k8" if head_dim == 256 else "k8_hd128") + ("_q1" if qk == switch.LOSSY_QK else ""), 64


def _wave_bytes_per_us(v: VattnModel, path: str, rows: int, kv_dtype: str, page_size: int) -> float:
    if not v.path_tbps:
        return v.wave_tbps * 1e6 * v.page_efficiency[page_size]
    known = v.dot_tflops or v.path_tbps
    if path not in v.path_tbps or path not in known:
        raise ValueError(f"kernel path: {path} ({rows} rows, {kv_dtype} cache) has no path_tbps/dot_tflops in "
                         f"the profile; it knows {sorted(known)} (the _q1 and fp8x1 paths are VATTN_QK=e4m3's)")
    wave = v.path_tbps[path] * 1e6 * v.page_efficiency[page_size]
    if not v.dot_tflops:  # bytes-bound paths
        return wave
    return 1 / (1 / wave + 2 * rows / (KV_BYTES[kv_dtype] * v.dot_tflops[path] * 1e6))


def _plan_us(v: VattnModel, planner: str) -> float:
    return v.plan_us[planner] if isinstance(v.plan_us, dict) else v.plan_us


def _predict_vattn(seq_lens, q_lens, planner, prof, hkv, head_dim, gqa, kv_dtype, page_size, *,
                   hopper: bool = False, qk: str = "split") -> float:
    cta_dim = head_dim  # the head_dim a program reads a token of: pack x head_dim, its pack KV heads together
    if hopper:  # planned as vattn.hopper.backend plans: one CTA per SM, its own piece overhead and KV heads a CTA
        v, slots, overhead = prof.vattn_hopper, prof.sms, piece_overhead_tiles(kv_dtype)
        packed = max(q_lens, default=1) * gqa  # rows, as the workspace's max_q_len x GQA
        pack, split = kv_heads_per_cta(kv_dtype, head_dim, hkv, page_size, packed), group_split(gqa, packed)
        # a split group's CTAs each stream the KV head's pages (the second mostly from L2) at a CTA's rate
        hkv, gqa, cta_dim = hkv // pack * split, gqa * pack // split, head_dim * pack
        path, rows = hopper_path(kv_dtype, cta_dim, page_size, qk)
        o_bytes = 2 if hopper_backend.BF16_PARTIALS else 4  # its partials' O (Backend.partial_dtype)
    else:
        o_bytes = 4
        v, slots, overhead = prof.vattn, prof.slots, PIECE_OVERHEAD_TILES
        path, rows = kernel_path(q_lens, gqa, kv_dtype, head_dim, qk)
    if page_size not in v.page_efficiency:
        raise ValueError(f"page_size: got {page_size}; profile {prof.name} knows {sorted(v.page_efficiency)}")
    splits, tails = plan_splits_and_tails(seq_lens, q_lens, num_kv_heads=hkv, slots=slots, mode=planner,
                                          overhead=overhead)
    wave = _wave_bytes_per_us(v, path, rows, kv_dtype, page_size)  # bytes/us with every slot busy
    token_bytes = cta_dim * 2 * KV_BYTES[kv_dtype]  # the page's gather efficiency is in `wave`
    latency = v.piece_latency_us * wave / slots  # a prologue costs its slot's fair share of time
    runs, reduce_bytes = [], 0  # runs: (launched in the first group, (bytes a program, programs))
    for (pieces, seg), L, q in zip(splits, seq_lens, q_lens):
        if not pieces:
            continue
        out_bytes = q * gqa * head_dim * 2  # one program's output rows
        part_bytes = q * gqa * (head_dim * o_bytes + 4)  # O + fp32 lse, written by main and read by reduce
        extra = latency + (part_bytes if pieces > 1 else out_bytes)
        seg_tokens = seg * KV_TILE
        last_tokens = L - (pieces - 1) * seg_tokens
        if pieces > 1:
            reduce_bytes += hkv * (pieces * part_bytes + out_bytes)
            runs.append((True, (seg_tokens * token_bytes + extra, pieces - 1)))
        # the plan's work_order (vattn.planner): balanced launches split sequences' pieces first, a plan with
        # its tails packed every piece over half the cap
        first = held(-(-last_tokens // KV_TILE), seg) if tails else pieces > 1
        runs.append((first, (last_tokens * token_bytes + extra, 1)))
    if planner in BALANCED:
        runs.sort(key=lambda r: not r[0])
    runs = [r for _, r in runs]
    sms = prof.sms if v.slot_sharing == "sm" else None
    makespan = _makespan_us(runs, hkv, slots, wave, v.slot_boost, sms) if runs else 0.0
    most_pieces = max((pieces for pieces, _ in splits), default=0)
    reduced_seqs = hkv * sum(1 for pieces, _ in splits if pieces > (1 if hopper else 0))
    reduce_us = (v.reduce_fixed_us + reduce_bytes / (v.reduce_tbps * 1e6) + v.reduce_piece_us * most_pieces
                 + v.reduce_seq_us * reduced_seqs)
    return _plan_us(v, planner) + 3 * v.launch_us + makespan + reduce_us


def _predict_baseline(seq_lens, q_lens, name, prof, hkv, head_dim, gqa, kv_dtype) -> float:
    live_q = [q for L, q in zip(seq_lens, q_lens) if q and L]
    phase = "decode" if live_q and max(live_q) == 1 else "verify"
    entries = prof.baselines[name]
    found = [e for e in entries if e.kv_dtype == kv_dtype and e.phase in (phase, "any")]
    if not found:
        have = ", ".join(f"{e.kv_dtype}/{e.phase}" for e in entries)
        raise ValueError(f"kv_dtype/phase: got {kv_dtype}/{phase}; profile {prof.name} baseline {name} was "
                         f"measured for {have}")
    e = found[0]
    t = e.fixed_us
    if e.tbps:
        t += kv_bytes(seq_lens, q_lens, hkv, head_dim, kv_dtype) / (e.tbps * 1e6)
    if e.gelems_per_s:
        t += sum(L for L, q in zip(seq_lens, q_lens) if q) * hkv * gqa * head_dim / (e.gelems_per_s * 1e3)
    return t * e.gqa_factor.get(gqa, 1.0)


def predict_attention_us(seq_lens: list[int], q_lens: list[int], *, impl: str, planner: str,
                         profile: HardwareProfile, num_kv_heads: int, head_dim: int, gqa: int,
                         kv_dtype: str, page_size: int, qk: str = "split") -> float:
    """Time (us) of ONE attention layer call for this batch.

    impl: "vattn" (with `planner`), "vattn_hopper" (vattn with VATTN_HOPPER=1, module docstring), "baseline"
    (the profile's default engine path) or a baseline's name.
    planner: one of PLANNERS (ignored by baselines). kv_dtype: fp8 (= fp8_e4m3), bf16 or fp16.
    qk: vattn's Q.K^T rounding (VATTN_QK, vattn/switch.py): "split" or the lossy one-pass "e4m3".
    """
    if kv_dtype not in KV_BYTES:
        raise ValueError(f"kv_dtype: got {kv_dtype!r}; allowed: {', '.join(KV_BYTES)}")
    for name, value in (("num_kv_heads", num_kv_heads), ("head_dim", head_dim), ("gqa", gqa)):
        if not isinstance(value, int) or value < 1:
            raise ValueError(f"{name}: got {value!r}; must be an int >= 1")
    kv_dtype = "fp8" if kv_dtype == "fp8_e4m3" else kv_dtype
    if impl in ("vattn", "vattn_hopper"):
        if planner not in PLANNERS:
            raise ValueError(f"planner: got {planner!r}; allowed: {', '.join(PLANNERS)}")
        if impl == "vattn_hopper" and profile.vattn_hopper is None:
            raise ValueError(f"impl: got 'vattn_hopper'; profile {profile.name} has no vattn_hopper model "
                             "(configs/hardware/h200.yaml has one)")
        # the batch's packed rows stand for the workspace's (max_q_len x GQA), by which the backend decides
        hopper = impl == "vattn_hopper" and covers_shape(kv_dtype, head_dim, page_size, max(q_lens, default=1) * gqa,
                                                         gqa)
        return _predict_vattn(seq_lens, q_lens, planner, profile, num_kv_heads, head_dim, gqa, kv_dtype,
                              page_size, hopper=hopper, qk=qk)
    name = profile.baseline if impl == "baseline" else impl
    if name not in profile.baselines:
        raise ValueError(f"impl: got {impl!r}; allowed: vattn, vattn_hopper, baseline, "
                         f"{', '.join(profile.baselines)}")
    return _predict_baseline(seq_lens, q_lens, name, profile, num_kv_heads, head_dim, gqa, kv_dtype)

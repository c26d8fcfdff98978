"""The bench's tables: a plain one for the terminal, a markdown one for BENCHMARKS.md."""

from __future__ import annotations

import statistics

from benchmarks.kernel.harness import rounds_faster


def _impl(r: dict) -> str:
    """vattn's rows name the backend that ran the main kernel where it is not the Triton path."""
    backend = r.get("backend")
    return r["impl"] if backend in (None, "triton") else f"{r['impl']}/{backend}"


def format_table(records: list[dict]) -> str:
    head = ("shape", "kv", "q", "pg", "impl", "planner", "us", "plan", "main", "reduce", "TB/s", "%ceil",
            "%gather", "xFI-fp8", "rel_err")
    rows = [head]
    for r in records:
        if "error" in r:
            rows.append((r["shape"], "", "", "", r["impl"], r["planner"], "ERROR", r["error"][:60], *[""] * 7))
            continue
        fi = r.get("speedup_vs_flashinfer_fp8")
        rows.append((r["shape"], r["kv_dtype"], r["q_len"], str(r["page_size"]), _impl(r), r["planner"],
                     f"{r['us']:.1f}", f"{r['plan_us']:.1f}", f"{r['main_us']:.1f}", f"{r['reduce_us']:.1f}",
                     f"{r['tbps']:.2f}", f"{100 * r['tbps'] / r['read_ceiling_tbps']:.0f}",
                     f"{100 * r['tbps'] / r['gather_tbps']:.0f}" if r.get("gather_tbps") else "-",
                     f"{fi:.2f}" if fi else "-", f"{r['rel_err']:.1e}" if r.get("rel_err") is not None else "-"))
    widths = [max(len(str(row[i])) for row in rows) for i in range(len(head))]
    return "\n".join(" | ".join(str(c).ljust(w) for c, w in zip(row, widths)) for row in rows)


def markdown_table(records: list[dict]) -> str:
    """One row per (shape, planner): us, stages, TB/s, % of the run's read ceiling, x FlashInfer fp8."""
    rows = [r for r in records if "error" not in r]
    if any(r.get("default_config") for r in rows):
        rows = [r for r in rows if r.get("default_config")]
    out = ["| shape | kv | q_len | page | planner | us (plan+main+reduce) | plan | main | reduce | TB/s | % ceiling "
           "| FlashInfer fp8 us (KERNEL.md) | speed-up | rel_err | run |", "|" + "---|" * 15]
    for r in rows:
        fi = r.get("flashinfer_fp8_us")
        speedup = f"{fi / r['us']:.2f}x" if fi else "-"
        planner = r["planner"] if r.get("backend") in (None, "triton") else f"{r['planner']} ({r['backend']})"
        out.append(f"| {r['shape']} | {r['kv_dtype']} | {r['q_len']} | {r['page_size']} | {planner} | "
                   f"{r['us']:.1f} | {r['plan_us']:.1f} | {r['main_us']:.1f} | {r['reduce_us']:.1f} | "
                   f"{r['tbps']:.2f} | {100 * r['tbps'] / r['read_ceiling_tbps']:.0f} | {fi or '-'} | "
                   f"{speedup} | {r['rel_err']:.1e} | "
                   f"{r.get('run', r.get('date', ''))} |")
    return "\n".join(out)


def rounds_table(records: list[dict]) -> str:
    """`bench --rounds`: per shape, main-kernel path and planner, the median over rounds of the call (us) and of the
    layer, and in how many rounds each planner after the first beat the first, the pairing that holds while the
    board drifts."""
    timed = [r for r in records if "round" in r and "error" not in r]
    out = ["| shape | path | planner | rounds | us, median | layer us, median | call faster than the first | "
           "layer faster |", "|" + "---|" * 8]
    groups: dict = {}  # (shape, path) -> ({planner: call us by round}, {planner: layer us by round})
    for r in sorted(timed, key=lambda r: r["round"]):  # stable: the shapes keep the run's order
        us, layer = groups.setdefault((r["shape"], r.get("backend", "-")), ({}, {}))
        us.setdefault(r["planner"], []).append(r["us"])
        layer.setdefault(r["planner"], []).append(r["layer_us"])
    for (shape, path), (us, layer) in groups.items():
        faster, layer_faster = rounds_faster(us), rounds_faster(layer)
        for planner, times in us.items():
            won = ["-", "-"]
            if planner in faster:
                won = ["{} of {}".format(*faster[planner]), "{} of {}".format(*layer_faster[planner])]
            out.append(f"| {shape} | {path} | {planner} | {len(times)} | {statistics.median(times):.1f} | "
                       f"{statistics.median(layer[planner]):.1f} | " + " | ".join(won) + " |")
    return "\n".join(out)

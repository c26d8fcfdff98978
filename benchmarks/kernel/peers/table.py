"""The vattn-versus-peers markdown table of bench JSONs run with --peers (`bench --peer-table`)."""
from __future__ import annotations

from benchmarks.kernel.peers.registry import PEERS


def peer_table(records: list[dict]) -> str:
    """Issue 8's markdown table: per shape, vattn's fastest planner and each peer: us (TB/s, % of the run's read
    ceiling), or why it has no time (wrong output, skipped, failed); then vattn / best peer in time."""
    shapes = list(dict.fromkeys(r["shape"] for r in records))
    impls = [p + v for p in PEERS for v in ("", "+plan") if any(r.get("impl") == p + v for r in records)]
    # vattn's us includes its plan kernel; the peers plan before timing, as vattn's layer_us does (an engine plans
    # once per batch): the speed-up is given on both bases
    head = ["shape", "vattn (best planner)", "vattn per layer", *impls, "best peer", "vattn / best peer",
            "per layer"]
    out = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for s in shapes:
        rows = {r["impl"]: r for r in records if r["shape"] == s and "impl" in r}
        mine = [r for r in records if r["shape"] == s and r.get("impl") == "vattn" and "error" not in r]
        best_v = min(mine, key=lambda r: r["us"]) if mine else None
        timed = [rows[i] for i in impls if i in rows and "error" not in rows[i] and not i.endswith("+plan")
                 and rows[i].get("within_tolerance", True)]  # the best peer is one that could replace vattn
        best_p = min(timed, key=lambda r: r["us"]) if timed else None
        layer = best_v.get("layer_us") if best_v else None
        cells = [s, _cell(best_v) + (f" {best_v['planner']}" if best_v else ""), f"{layer:.1f}" if layer else "-"]
        cells += [_cell(rows.get(i)) for i in impls]
        cells.append(f"{best_p['impl']} ({best_p['kv_dtype']})" if best_p else "-")
        cells.append(f"{best_p['us'] / best_v['us']:.2f}x" if best_p and best_v else "-")
        cells.append(f"{best_p['us'] / layer:.2f}x" if best_p and layer else "-")
        out.append("| " + " | ".join(cells) + " |")
    return "\n".join(out)


def _cell(r: dict | None) -> str:
    if r is None:
        return "-"
    if "error" in r:
        e = r["error"]
        return "**wrong** " + e.split("(")[0].removeprefix("wrong output: ").strip() if e.startswith("wrong") else \
            e.split(":")[0]
    ceil = r.get("read_ceiling_tbps")
    pct = f", {100 * r['tbps'] / ceil:.0f}%" if ceil else ""
    if r.get("gather_tbps"):  # vattn's rows: also the share of its paged layout's gather ceiling (gather.py)
        pct += f", {100 * r['tbps'] / r['gather_tbps']:.0f}% of gather"
    over = "" if r.get("within_tolerance", True) else " **over tolerance**"
    return f"{r['us']:.1f} ({r['tbps']:.2f}{pct}; err {r['rel_err']:.0e}{over})"

"""analysis/plots.py: each arm keeps one colour in every figure of a report and of the sweep report."""
from __future__ import annotations

import colorsys
import json
import shutil
from pathlib import Path

import pytest
from matplotlib.colors import to_hex, to_rgb

from analysis import plots
from analysis.report import write_report
from analysis.sweep import pareto_plot, summary_frame

QUICKSTART = Path(__file__).parent / "data" / "quickstart_run"


@pytest.fixture
def figures(monkeypatch) -> dict[str, dict[str, tuple[str, str]]]:
    """{file name: {series label: (colour, line style)}} of every figure saved while the fixture is in use."""
    seen: dict[str, dict[str, tuple[str, str]]] = {}
    save = plots._save

    def capture(fig, path):
        ax = fig.axes[0]
        series = {line.get_label(): (to_hex(line.get_color()), line.get_linestyle()) for line in ax.get_lines()}
        # a histogram's label sits on its first bar; the pareto plot's error bars have no bars
        series |= {b.patches[0].get_label(): (to_hex(b.patches[0].get_facecolor()), "bar") for b in ax.containers
                   if getattr(b, "patches", None)}
        series |= {h.get_label(): (to_hex(h.get_color()), h.get_linestyle())
                   for h in (ax.get_legend().legend_handles if ax.get_legend() else ()) if hasattr(h, "get_color")}
        seen[Path(path).name] = {k.split(" (n=")[0]: v for k, v in series.items() if not k.startswith("_")}
        return save(fig, path)
    monkeypatch.setattr(plots, "_save", capture)
    return seen


def abba_run(tmp_path: Path) -> Path:
    """The quickstart run made ABBA: off.2 and on.2 are copies of off and on (exports, cycle logs, accuracy)."""
    run = tmp_path / "abba"
    shutil.copytree(QUICKSTART, run)
    manifest = json.loads((run / "manifest.json").read_text())
    for arm in ("on", "off"):
        shutil.copytree(run / "arms" / arm, run / "arms" / f"{arm}.2")
        first = next(r for r in manifest["arm_runs"] if r["name"] == arm)
        manifest["arm_runs"].append(dict(first, name=f"{arm}.2", round=2, group=len(manifest["arm_runs"])))
        manifest["stages"][f"{arm}.2"] = manifest["stages"][arm]
    (run / "manifest.json").write_text(json.dumps(manifest))
    return run


def hue(color: str) -> float:
    return colorsys.rgb_to_hsv(*to_rgb(color))[0]


def test_an_arm_keeps_its_colour_in_every_plot_and_its_repeat_its_hue(tmp_path, figures):
    """ABBA (series off, off.2, on, on.2 over time; off, on pooled in the CDF and step times): `on` was orange
    in the CDF and green over time, where off.2 took orange, because colours followed a series' position."""
    write_report(abba_run(tmp_path), n_boot=50)
    for name in ("tpot_cdf.png", "tpot_over_time.png", "step_time.png"):
        assert {"off", "on"} <= set(figures[name]), (name, figures[name])
    assert set(figures["tpot_over_time.png"]) == {"off", "off.2", "on", "on.2"}
    for arm in ("off", "on"):
        # the arm's first run, or the arm pooled, in one colour and a solid line in every figure
        firsts = {name: s[arm] for name, s in figures.items() if arm in s}
        assert len({c for c, _ in firsts.values()}) == 1 and {ls for _, ls in firsts.values()} <= {"-", "bar"}, firsts
        # its repeat: the same hue, told apart by shade and line style
        (c1, _), (c2, ls2) = figures["tpot_over_time.png"][arm], figures["tpot_over_time.png"][f"{arm}.2"]
        assert hue(c1) == pytest.approx(hue(c2), abs=0.02) and c1 != c2 and ls2 != "-"
    off, on = figures["tpot_cdf.png"]["off"][0], figures["tpot_cdf.png"]["on"][0]
    assert abs(hue(off) - hue(on)) > 0.2


def test_the_sweep_pareto_plot_gives_off_and_on_the_report_colours(tmp_path, figures):
    write_report(shutil.copytree(QUICKSTART, tmp_path / "run"), n_boot=50)
    df, _ = summary_frame([{"point": "c8", "run_dir": str(QUICKSTART), "gpus": 2}])
    pareto_plot(df, tmp_path / "plots" / "pareto.png")
    for arm in ("off", "on"):
        assert figures["pareto.png"][arm][0] == figures["tpot_cdf.png"][arm][0] == figures["step_time.png"][arm][0]

"""analysis/plots.py: each arm keeps one colour in every figure of a report and of the sweep report."""
from __future__ import annotations

import colorsys
import json
import shutil
from pathlib import Path

import numpy as np
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
        # "off (n=99)" in the CDF, "off: rolling median, 9 requests" over time: the arm's name
        seen[Path(path).name] = {k.split(" (n=")[0].split(": rolling median")[0]: v for k, v in series.items()
                                 if not k.startswith("_")}
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


@pytest.fixture
def saved(monkeypatch) -> dict:
    """{file name: the matplotlib Figure} of every figure saved while the fixture is in use."""
    figs, save = {}, plots._save

    def capture(fig, path):
        figs[Path(path).name] = fig
        return save(fig, path)
    monkeypatch.setattr(plots, "_save", capture)
    return figs


def test_the_delta_histogram_uses_a_log_ratio_axis_and_marks_the_verdict_and_its_ci(tmp_path, saved):
    """+100% and -50% (both a factor of two) sit equally far from 0; the verdict's centre and CI are drawn; the
    bars are in neither arm's colour; the label defines the delta and its sign."""
    d = np.array([-50.0, -10, -5, 0, 5, 100])
    plots.delta_histogram(d, tmp_path / "d.png", "on vs off", verdict=(-4.0, -8.0, 1.0), verdict_name="trimmed mean")
    ax = saved["d.png"].axes[0]
    ticks = {t.get_text(): t.get_position()[0] for t in ax.get_xticklabels()}
    assert ticks["+100%"] == pytest.approx(-ticks["-50%"]) == pytest.approx(np.log(2))
    assert "(on - off) / off" in ax.get_xlabel() and "< 0: on faster" in ax.get_xlabel()
    labels = ax.get_legend_handles_labels()[1]
    assert "trimmed mean -4.0% [-8.0, +1.0]" in labels and "95% CI" in labels
    verdict = next(line for line in ax.get_lines() if line.get_label().startswith("trimmed mean"))
    assert verdict.get_xdata()[0] == pytest.approx(np.log(0.96))
    assert {to_hex(p.get_facecolor()) for b in ax.containers for p in b.patches} == {plots.NEUTRAL}


def test_the_delta_histogram_without_a_verdict_still_marks_zero_and_the_median(tmp_path, saved):
    plots.delta_histogram(np.array([-20.0, 0, 10]), tmp_path / "d.png", "on vs off")
    assert saved["d.png"].axes[0].get_legend_handles_labels()[1] == ["median +0.0%"]


def test_the_tpot_cdf_has_a_log_x_and_says_it_counts_each_arms_own_requests(tmp_path, saved):
    styles = plots.comparison_styles((("off", ()), ("on", ())))
    plots.tpot_cdf({"off": np.array([3.0, 4, 37]), "on": np.array([2.9, 3.5, 28])}, tmp_path / "c.png", styles)
    ax = saved["c.png"].axes[0]
    assert ax.get_xscale() == "log" and "own requests (not matched)" in ax.get_title()


def test_tpot_over_time_names_its_rolling_median_breaks_it_over_gaps_and_has_a_log_y(tmp_path, saved):
    import pandas as pd

    # 20 requests 0.2 s apart, a 30 s gap, 20 more
    start = np.r_[np.arange(20) * 0.2, 34 + np.arange(20) * 0.2] * 1e9
    f = pd.DataFrame({"start_ns": start, "tpot_ms": np.r_[np.full(20, 4.0), np.full(20, 6.0)]})
    plots.tpot_over_time({"off": f}, tmp_path / "t.png", plots.comparison_styles((("off", ()),)))
    ax = saved["t.png"].axes[0]
    line = next(line for line in ax.get_lines() if line.get_label().startswith("off"))
    assert line.get_label() == "off: rolling median, 4 requests" and ax.get_yscale() == "log"
    y = np.asarray(line.get_ydata(), float)
    assert np.isnan(y[20]) and set(y[:20]) == {4.0} and set(y[21:-1]) == {6.0}  # no step drawn across the gap


def test_step_time_is_in_ms_on_log_axes_with_both_arms_in_the_legend(tmp_path, saved):
    steps = {"off": np.r_[np.full(500, 10_000.0), np.full(5, 500_000.0)], "on": np.full(500, 9_000.0)}
    plots.step_time_distribution(steps, tmp_path / "s.png", "us", plots.comparison_styles((("off", ()), ("on", ()))))
    ax = saved["s.png"].axes[0]
    assert ax.get_xscale() == ax.get_yscale() == "log" and "ms" in ax.get_xlabel()
    assert ax.get_xlim()[0] < 9 and ax.get_xlim()[1] > 500  # microseconds shown as milliseconds
    assert [t.get_text() for t in ax.get_legend().get_texts()] == ["off (n=505)", "on (n=500)"]

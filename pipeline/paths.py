"""Every artifact path of a run directory, built in one place.

Layout (see DESIGN.md, "Data flow"):

    RUN_DIR/
      manifest.json                      recipe, plan, versions, env diff, stage status
      report.md, plots/*.png             written by `pipeline report`
      arms/<arm_run>/                    one folder per arm run ("off", "on", "off.2" for repeats)
        server.log, server_info.json     server stage
        server_result.json
        aiperf/profile_export.jsonl ...  load stage (aiperf's own artifact folder)
        load_result.json
        accuracy/<task>.jsonl            accuracy stage, one line per question per repeat
        accuracy/<task>.summary.json
        accuracy_result.json
        emulator_cycles.jsonl            emulator only: one line per speculative cycle
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

# The hardware profiles of vattn's cost model (the emulator's attention time), by name: configs/hardware/<name>.yaml
HARDWARE_PROFILES_DIR = Path(__file__).resolve().parent.parent / "configs" / "hardware"


@dataclass(frozen=True)
class ArmPaths:
    root: Path

    @property
    def server_log(self) -> Path:
        return self.root / "server.log"

    @property
    def server_info(self) -> Path:
        return self.root / "server_info.json"

    @property
    def aiperf_dir(self) -> Path:
        return self.root / "aiperf"

    @property
    def profile_export(self) -> Path:
        return self.aiperf_dir / "profile_export.jsonl"

    @property
    def server_metrics_export(self) -> Path:
        # aiperf's own name inside its artifact folder (scraped from the engine's /metrics)
        return self.aiperf_dir / "server_metrics_export.json"

    @property
    def aiperf_phase_manifest(self) -> Path:
        return self.aiperf_dir / "phase_manifest.json"

    @property
    def aiperf_log(self) -> Path:
        return self.root / "aiperf.log"

    @property
    def accuracy_dir(self) -> Path:
        return self.root / "accuracy"

    def accuracy_records(self, task: str) -> Path:
        return self.accuracy_dir / f"{task}.jsonl"

    def accuracy_summary(self, task: str) -> Path:
        return self.accuracy_dir / f"{task}.summary.json"

    @property
    def emulator_cycles(self) -> Path:
        return self.root / "emulator_cycles.jsonl"

    def stage_result(self, stage: str) -> Path:
        return self.root / f"{stage}_result.json"


@dataclass(frozen=True)
class RunPaths:
    root: Path

    @property
    def manifest(self) -> Path:
        return self.root / "manifest.json"

    @property
    def report(self) -> Path:
        return self.root / "report.md"

    @property
    def plots_dir(self) -> Path:
        return self.root / "plots"

    def compare_report(self, other_run: str) -> Path:
        """`pipeline report OTHER THIS` writes its comparison here."""
        return self.root / f"compare_{other_run}.md"

    @property
    def arms_dir(self) -> Path:
        return self.root / "arms"

    def arm(self, arm_run: str) -> ArmPaths:
        return ArmPaths(self.arms_dir / arm_run)

    def arm_runs(self) -> list[str]:
        """Arm-run folders present on disk, sorted."""
        if not self.arms_dir.is_dir():
            return []
        return sorted(p.name for p in self.arms_dir.iterdir() if p.is_dir())

"""Every artifact path of a run directory, built in one place.

Layout (see DESIGN.md, "Data flow"):

    RUN_DIR/
      manifest.json                      recipe, plan, versions, env diff, stage status
      report.md, plots/*.png             written by `pipeline report`
      arms/<arm_run>/                    one folder per arm run ("off", "on", "off.2" for repeats)
        server.log, server_info.json     server stage (server.log.exit_status: an SSH host's server's exit
                                         status, written when it ends)
        server_result.json
        aiperf/profile_export.jsonl ...  load stage (aiperf's own artifact folder)
        aiperf.log, aiperf_process.json  its output; its session (leader pid, start time, boot id)
        load_result.json
        accuracy/<task>.jsonl            accuracy stage, one line per question per repeat
        accuracy/<task>.summary.json
        accuracy_result.json
        emulator_cycles/lifetime-<n>.jsonl   emulator only: one line per speculative cycle, one file per
                                         server lifetime (n = 1, 2, ... in start order; a resume starts one)
      superseded/<arm_run>.<k>/          a concurrent arm run's earlier attempt, set aside when its group
                                         reran as a whole on resume

    On an SSH host an arm run's artifacts live in <workdir>/<run dir name>-<run id>/arms/<arm_run>.

and the repository's own folders that the pipeline reads (presets under configs/).
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

CYCLE_LOG_DIR = "emulator_cycles"
_LIFETIME = re.compile(r"lifetime-(\d+)\.jsonl")


def file_in_the_way(path: Path) -> Path | None:
    """The existing non-directory at `path` or above it, which would make `mkdir -p path` fail; None if none."""
    return next((p for p in (path, *path.parents) if p.exists() and not p.is_dir()), None)


def cycle_log_file(log_dir: str | Path, lifetime: int) -> Path:
    """The cycle log of one server lifetime (the emulator claims the lowest free n at start)."""
    return Path(log_dir) / f"lifetime-{lifetime}.jsonl"


def cycle_log_lifetimes(log_dir: str | Path) -> dict[int, Path]:
    """{lifetime n: file} of the cycle logs present in `log_dir`, in start order."""
    found = {}
    if Path(log_dir).is_dir():
        for p in Path(log_dir).iterdir():
            m = _LIFETIME.fullmatch(p.name)
            if m:
                found[int(m.group(1))] = p
    return dict(sorted(found.items()))


def remote_run_dir(workdir: str, run_dir: str | Path, run_id: str | None) -> str:
    """A run's folder on an SSH host (a POSIX path there): its arms' artifact folders, and what the servers read
    that was put there (the emulator's tokenizer).

    The run id (manifest.json `run_id`) keeps apart two runs whose local dirs share a basename under one
    workdir; manifests written before run ids existed have none, and resume into the old layout.
    """
    folder = f"{Path(run_dir).name}-{run_id}" if run_id else Path(run_dir).name
    return str(PurePosixPath(workdir) / folder)


def remote_arm_dir(workdir: str, run_dir: str | Path, run_id: str | None, arm_run: str) -> str:
    """An arm run's artifact folder on an SSH host, pulled into the local run dir after the arm."""
    return str(PurePosixPath(remote_run_dir(workdir, run_dir, run_id)) / "arms" / arm_run)


def exit_status_file(log: str) -> str:
    """Where an SSH host's wrapper writes a server's exit status when it ends: beside its log (server.log ->
    server.log.exit_status), so it is pulled with the arm's artifacts."""
    return f"{log}.exit_status"


def remote_superseded_dir(artifact_dir: str, attempt: int) -> str:
    """Where an SSH host's artifacts of a superseded attempt are moved, beside the arm run's folder."""
    return f"{artifact_dir}.superseded-{attempt}"

REPO_ROOT = Path(__file__).resolve().parent.parent
CONFIGS_DIR = REPO_ROOT / "configs"              # presets a recipe lists under `presets:`
MODEL_PRESETS_DIR = CONFIGS_DIR / "models"       # the emulator's model-shape presets


def configs_missing_hint() -> str:
    """What to add to an unknown-preset error when configs/ is not beside the installed packages (a non-editable
    install: the presets ship with the repository, not in the wheel); "" otherwise."""
    if CONFIGS_DIR.is_dir():
        return ""
    return (f" ({CONFIGS_DIR} does not exist: the presets live in the repository's configs/, so install from a "
            f"checkout with `pip install -e .`)")


def preset_file(name: str, folder: Path) -> Path:
    """<folder>/<name>.yaml: presets are named without the suffix (folder: CONFIGS_DIR, MODEL_PRESETS_DIR)."""
    return folder / f"{name}.yaml"


def task_records(accuracy_dir: Path, task: str) -> Path:
    """<accuracy_dir>/<task>.jsonl: an arm's accuracy/ folder, or `pipeline eval --out DIR`."""
    return Path(accuracy_dir) / f"{task}.jsonl"


def task_summary(accuracy_dir: Path, task: str) -> Path:
    return Path(accuracy_dir) / f"{task}.summary.json"

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
    def aiperf_scratch(self) -> Path:
        """aiperf's memory-mapped dataset while it runs (removed after the load stage)."""
        return self.root / "aiperf-scratch"

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
    def aiperf_process(self) -> Path:
        """The arm's last aiperf run: its leader's pid (every process of the run has it as session id), the
        leader's start time and the boot id, written as it starts, so that a resume finds what a hard kill of
        the pipeline left running."""
        return self.root / "aiperf_process.json"

    @property
    def accuracy_dir(self) -> Path:
        return self.root / "accuracy"

    def accuracy_records(self, task: str) -> Path:
        return task_records(self.accuracy_dir, task)

    def accuracy_summary(self, task: str) -> Path:
        return task_summary(self.accuracy_dir, task)

    @property
    def emulator_cycles_dir(self) -> Path:
        return self.root / CYCLE_LOG_DIR

    def emulator_cycles(self, lifetime: int) -> Path:
        return cycle_log_file(self.emulator_cycles_dir, lifetime)

    def emulator_cycle_logs(self) -> dict[int, Path]:
        return cycle_log_lifetimes(self.emulator_cycles_dir)

    @property
    def legacy_emulator_cycles(self) -> Path:
        """Runs made before per-lifetime logs wrote one file, appended to by every server lifetime."""
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

    def superseded_arm(self, arm_run: str, attempt: int) -> Path:
        return self.root / "superseded" / f"{arm_run}.{attempt}"

    def arm_runs(self) -> list[str]:
        """Arm-run folders present on disk, sorted."""
        if not self.arms_dir.is_dir():
            return []
        return sorted(p.name for p in self.arms_dir.iterdir() if p.is_dir())


@dataclass(frozen=True)
class SlurmJobPaths:
    """Files of one arm run's Slurm job, beside its server log in the arm's folder (on the shared FS)."""

    root: Path

    @property
    def script(self) -> Path:
        return self.root / "slurm_job.sh"

    @property
    def facts(self) -> Path:
        """Written by the job as it starts: node, CUDA_VISIBLE_DEVICES, SLURM_JOB_GPUS, GPU uuids."""
        return self.root / "slurm_job.json"

    @property
    def job_id(self) -> Path:
        """The id of the job last submitted for this arm run, written at submission: a resume after a hard
        kill cancels it before submitting again (its server would answer the new job's health check)."""
        return self.root / "slurm_job.id"

    @property
    def output(self) -> Path:
        """sbatch --output: what Slurm itself prints about the job (the server's own log is server.log)."""
        return self.root / "slurm_job.out"


@dataclass(frozen=True)
class SweepPaths:
    """A sweep dir: one ordinary run dir per matrix point, and the sweep's own report.

        SWEEP_DIR/
          sweep.json              the sweep spec, its points and each point's run dir and status
          runs/<point>/           an ordinary run dir (manifest.json, arms/, report.md)
          superseded/<point>.<n>  a point's unfinished run set aside when an edited sweep file re-planned it
          sweep_report.md         what ran, per-point deltas with CIs, the plot
          sweep_summary.csv       one row per point and arm
          plots/pareto.png        interactivity against output throughput per GPU, off and on; paired deltas
    """

    root: Path

    @property
    def manifest(self) -> Path:
        return self.root / "sweep.json"

    def run_dir(self, point: str) -> Path:
        return self.root / "runs" / point

    def superseded(self, point: str, attempt: int) -> Path:
        """Where a re-planned point's earlier, unfinished run is kept (`pipeline sweep sweep.yaml --resume`)."""
        return self.root / "superseded" / f"{point}.{attempt}"

    @property
    def report(self) -> Path:
        return self.root / "sweep_report.md"

    @property
    def summary_csv(self) -> Path:
        return self.root / "sweep_summary.csv"

    @property
    def pareto_png(self) -> Path:
        return self.root / "plots" / "pareto.png"

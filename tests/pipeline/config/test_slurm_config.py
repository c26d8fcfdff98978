"""hosts.<h>.slurm: validation errors name the field, the value, what is allowed and the fix."""
from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from pipeline.config.base import RecipeError
from pipeline.config.recipe import load_recipe
from pipeline.plan import SLURM_NODE, build_plan, gpus_text

REPO = Path(__file__).resolve().parents[3]


def _recipe(tmp_path: Path, host: dict, gpus_per_arm: int = 1) -> Path:
    data = yaml.safe_load((REPO / "recipes/slurm-emulator.yaml").read_text())
    data["tokenizer"] = str(REPO / "recipes/data/tokenizer")
    data["load"]["trace"] = str(REPO / "recipes/data/traces/short")
    data["accuracy"] = None
    data["hosts"] = {"cluster": host}
    data["placement"]["gpus_per_arm"] = gpus_per_arm
    p = tmp_path / "r.yaml"
    p.write_text(yaml.safe_dump(data))
    return p


def test_slurm_recipe_plans_one_job_per_arm_run(tmp_path):
    r = load_recipe(_recipe(tmp_path, {"kind": "slurm", "slurm": {"partition": "gpu"}}))
    plan = build_plan(r, tmp_path / "run", run_id="x")
    for a in plan.arm_runs:
        assert a.url == f"http://{SLURM_NODE}:30410"          # the job's node replaces it at start
        assert "CUDA_VISIBLE_DEVICES" not in a.env               # Slurm sets it inside the job
        assert a.artifact_dir == str((tmp_path / "run" / "arms" / a.name).resolve())  # shared FS
        assert "0.0.0.0" in a.argv                               # reachable from the controller
        assert gpus_text(r, a) == "1 from Slurm (--gres=gpu:1)"   # what the plan and the progress line say


@pytest.mark.parametrize("host, match", [
    ({"kind": "slurm"}, r"kind slurm needs a `slurm:` block"),
    ({"kind": "slurm", "slurm": {"time_limit": "2 hours"}},
     r"slurm.time_limit: .*'2 hours' is not a Slurm time; allowed forms: MM, MM:SS, HH:MM:SS"),
    ({"kind": "slurm", "slurm": {"gres": "gpu:2"}, "gpus": [0, 1]},
     r"gpus: \[0, 1\] on a slurm host; Slurm assigns each job its GPUs"),
    ({"kind": "slurm", "slurm": {"extra_args": ["--gres=gpu:8"]}},
     r"'--gres=gpu:8' sets an option the slurm block owns; use its own field"),
    ({"kind": "slurm", "slurm": {"load": "login-node"}}, r"slurm.load: Input should be 'controller' or 'allocation'"),
    ({"kind": "slurm", "slurm": {"partiton": "gpu"}}, r"slurm.partiton: unknown field"),
    ({"kind": "local", "slurm": {}}, r"slurm: set on a host of kind 'local'; set kind: slurm or remove the block"),
])
def test_slurm_host_errors(tmp_path, host, match):
    with pytest.raises(RecipeError, match=match):
        load_recipe(_recipe(tmp_path, host))

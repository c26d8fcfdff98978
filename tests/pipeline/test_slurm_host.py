"""pipeline/slurm.py without a cluster: the sbatch command, the job script, and the same-GPU-model rule."""
from __future__ import annotations

import pytest

from pipeline.config.placement import SlurmSpec
from pipeline.slurm import job_script, sbatch_argv


def test_sbatch_argv_carries_every_field(tmp_path):
    spec = SlurmSpec(partition="gpu", account="proj", time_limit="1-00:00:00", constraint="mi355x",
                     gres="gpu:h200", cpus_per_task=16, extra_args=["--qos=high"])
    argv = sbatch_argv(spec, gpus=2, name="vattn-off", output=tmp_path / "o", script=tmp_path / "s.sh")
    assert argv[0] == "sbatch" and argv[-1] == str(tmp_path / "s.sh")
    for flag in ("--partition=gpu", "--account=proj", "--time=1-00:00:00", "--constraint=mi355x",
                 "--gres=gpu:h200:2", "--cpus-per-task=16", "--qos=high", "--nodes=1"):
        assert flag in argv
    assert not any(a.startswith("--gres") for a in sbatch_argv(SlurmSpec(), gpus=0, name="n", output=tmp_path,
                                                                script=tmp_path))


def test_job_script_records_facts_then_execs_the_server(tmp_path):
    s = job_script(["python", "-m", "x", "--a b"], {"VATTN": "0"}, "/r/server.log", tmp_path / "f.json")
    assert s.index("facts ") < s.index("export VATTN=0") < s.index("exec python -m x '--a b' >>/r/server.log")
    assert "SLURM_JOB_GPUS" in s and "CUDA_VISIBLE_DEVICES" in s and "uuid" in s


def test_arms_on_different_gpu_models_are_refused():
    from pipeline.runner import RunError, check_same_gpu_models

    h200 = {"gpus": [{"index": "0", "uuid": "GPU-a", "name": "NVIDIA H200"}], "SLURMD_NODENAME": "n1"}
    h100 = {"gpus": [{"index": "0", "uuid": "GPU-b", "name": "NVIDIA H100"}], "SLURMD_NODENAME": "n2"}
    stages = {"off": {"server": {"status": "done", "slurm_job": h200}}}
    check_same_gpu_models(stages, "on", h200)          # same model on another GPU: fine
    check_same_gpu_models(stages, "on", {"gpus": []})  # no nvidia-smi on the node: nothing to compare
    with pytest.raises(RunError, match=r"arm run on got GPUs \['NVIDIA H100'\] on n2, but off ran on "
                                       r"\['NVIDIA H200'\].*slurm.constraint"):
        check_same_gpu_models(stages, "on", h100)

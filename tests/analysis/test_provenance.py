"""The report's provenance lines say where each arm ran: an SSH host's account, a Slurm arm run's job."""
from analysis.provenance import gpu_lines


def test_an_ssh_host_is_named_with_the_account_it_was_reached_at():
    manifest = {"recipe": {"hosts": {"box": {"kind": "ssh", "address": "10.0.0.7", "user": "bench", "port": 2222}}},
                "hosts": {"box": {"kind": "ssh", "gpus": []}},
                "arm_runs": [{"name": "off", "host": "box", "gpus": [0], "port": 30500}]}
    lines = gpu_lines(manifest)
    assert lines[0] == "- host `box` (ssh bench@10.0.0.7:2222) GPUs: none reported (no nvidia-smi)"
    assert lines[1] == "- arm runs: off on box GPUs [0] port 30500"


def test_a_slurm_arm_run_names_its_job_node_and_devices():
    job = {"job_id": "5", "SLURMD_NODENAME": "gpu-12", "CUDA_VISIBLE_DEVICES": "2,3", "gpus": []}
    manifest = {"recipe": {"hosts": {"cluster": {"kind": "slurm", "address": None}}},
                "hosts": {"cluster": {"kind": "slurm", "gpus": []}},
                "arm_runs": [{"name": "off", "host": "cluster", "gpus": [], "port": 30500},
                             {"name": "on", "host": "cluster", "gpus": [], "port": 30500}],
                "stages": {"off": {"server": {"status": "done", "slurm_job": job}},
                           "on": {"server": {"status": "failed"}}}}
    lines = gpu_lines(manifest)
    assert lines[0] == "- host `cluster` (slurm) GPUs: none reported (no nvidia-smi)"
    # the on arm run's job never started: the plan's (empty) GPU list is all there is
    assert lines[1] == "- arm runs: off on cluster Slurm job 5 on gpu-12 GPUs 2,3 port 30500; on on cluster GPUs none port 30500"

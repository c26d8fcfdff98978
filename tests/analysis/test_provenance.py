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


def test_inputs_show_short_hash_path_and_what_the_commit_lacks():
    from analysis.provenance import provenance_md

    manifest = {"git_sha": "abc", "inputs": [
        {"role": "recipe", "path": "recipes/new.yaml", "sha256": "0123456789abcdef" * 4, "git": "untracked"},
        {"role": "trace", "path": "/data/t", "sha256": "f" * 64, "files": 3, "git": "outside the checkout"}]}
    text = "\n".join(provenance_md(manifest))
    assert "  - recipe: `0123456789ab` recipes/new.yaml (untracked)" in text
    assert "  - trace: `ffffffffffff` /data/t (3 files; outside the checkout)" in text
    assert "inputs the commit does not hold: recipe (untracked) -- the git sha alone does not reproduce" in text


def test_a_manifest_from_before_the_new_fields_still_renders():
    """No inputs, machine facts, sub-second stamps or load averages: each is absent, not an error."""
    from analysis.provenance import provenance_md

    old = {"recipe_path": "recipes/quickstart.yaml", "git_sha": "abc-dirty", "recipe": {"engine": "emulator"},
           "hosts": {"local": {"kind": "local", "gpus": []}},
           "arm_runs": [{"name": "off", "host": "local", "gpus": [], "port": 30000}],
           "created": "2026-12-07T21:01:25+00:00", "finished": "2026-12-07T21:06:38+00:00",
           "stages": {"off": {"server": {"status": "done", "started": "2026-12-07T21:01:26+00:00",
                                         "finished": "2026-12-07T21:01:26+00:00"}}}}
    text = "\n".join(provenance_md(old))
    assert "- recipe: recipes/quickstart.yaml (input hashes not recorded" in text
    assert "predates the check of the run's inputs" in text
    assert "| off | server | done | 0.0 s |" in text


def test_the_git_sha_line_explains_a_dirty_suffix_only_where_there_is_one():
    from analysis.provenance import provenance_md

    def sha_line(sha):
        return provenance_md({"git_sha": sha, "inputs": []})[0]

    assert sha_line("abc") == "- git sha: `abc` (no changes to tracked files)"
    assert sha_line("abc-dirty").startswith("- git sha: `abc-dirty` (-dirty: changed tracked files; whether")
    assert sha_line("unknown") == "- git sha: `unknown`"


def test_seeds_are_named_as_validation_errors_name_fields():
    from analysis.provenance import provenance_md

    text = "\n".join(provenance_md({"recipe": {"accuracy": {"tasks": [{"name": "gsm8k", "seed": 7}]}}}))
    assert "- seeds: `recipe.accuracy.tasks.0.seed` = 7" in text


def test_the_machine_and_each_arm_runs_starting_load_are_shown():
    manifest = {"hosts": {"local": {"kind": "local", "gpus": [],
                                    "machine": {"hostname": "box", "cpus": 2, "cpu_model": "Xeon X"}}},
                "controller": {"hostname": "box", "cpus": 2, "cpu_model": "Xeon X"},
                "arm_runs": [{"name": "off", "host": "local", "gpus": [], "port": 30500}],
                "stages": {"off": {"server": {"load_1m": 1.25}}}}
    lines = gpu_lines(manifest)
    assert lines[0] == "- host `local` (local) GPUs: none reported (no nvidia-smi); machine: box, CPU Xeon X x 2"
    # the controller is the local host: not said twice
    assert lines[1] == "- arm runs: off on local GPUs none port 30500 (1-min load at start: host 1.25)"

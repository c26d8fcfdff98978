"""benchmarks.kernel.peers.make_wheels and install_on_device.sh: a wheel split into parts across folders comes back
whole on the host, and nothing installs until every checked file has arrived."""
from __future__ import annotations

import hashlib
import subprocess
import zipfile
from pathlib import Path

from benchmarks.kernel.peers import make_wheels

ROOT = Path(__file__).resolve().parents[3]


def _wheel(path: Path, members: dict[str, bytes]) -> None:
    with zipfile.ZipFile(path, "w") as z:
        for name, data in members.items():
            z.writestr(name, data)


def test_lzma_repack_keeps_every_member(tmp_path):
    wheel = tmp_path / "flashinfer_python-0.7.2-py3-none-any.whl"
    members = {"flashinfer/__init__.py": b"x = 1\n" * 500, "flashinfer-0.7.2.dist-info/RECORD": b"rows\n"}
    _wheel(wheel, members)
    make_wheels.lzma_repack(wheel)
    with zipfile.ZipFile(wheel) as z:
        assert {i.filename: z.read(i) for i in z.infolist()} == members
        assert {i.compress_type for i in z.infolist()} == {zipfile.ZIP_LZMA}


def test_a_split_wheel_installs_whole_once_every_folder_has_arrived(tmp_path, monkeypatch):
    monkeypatch.setattr(make_wheels, "PART_BYTES", 1000)
    repo, out = tmp_path / "repo", tmp_path / "repo" / ".whl-peers"
    (repo / "benchmarks/kernel/peers").mkdir(parents=True)
    # the script with its /tmp/ paths moved under tmp_path
    script_text = (ROOT / "benchmarks/kernel/peers/install_on_device.sh").read_text()
    (repo / "benchmarks/kernel/peers/install_on_device.sh").write_text(script_text.replace("/tmp/", f"{tmp_path}/"))
    flat = out / "flat"
    flat.mkdir(parents=True)
    big = flat / "nvidia_cutlass_dsl_libs_cu13-4.8.1-cp312-cp312-manylinux_2_28_x86_64.whl"
    big.write_bytes(bytes(range(256)) * 11)  # 2816 bytes: three parts
    digest = hashlib.sha256(big.read_bytes()).hexdigest()
    for name in ("flashinfer_python-0.7.2-py3-none-any.whl", "apache_tvm_ffi-0.1.11-cp312-abi3-x.whl",
                 "flash_attn_4-4.0.0b36-py3-none-any.whl"):
        (flat / name).write_bytes(name.encode())
    make_wheels.split(big)
    parts = sorted(p.name for p in flat.iterdir() if ".part" in p.name)
    assert parts == [big.name + f".part0{i}" for i in range(3)]
    # the parts in folders against their order (part00 last), as pack() may place them
    for folder, names in (("p1", [parts[2], parts[1]]), ("p2", [parts[0], "flash_attn_4-4.0.0b36-py3-none-any.whl"]),
                          ("p3", ["flashinfer_python-0.7.2-py3-none-any.whl", "apache_tvm_ffi-0.1.11-cp312-abi3-x.whl"])):
        (out / folder).mkdir()
        for n in names:
            (flat / n).rename(out / folder / n)
    flat.rmdir()
    make_wheels.write_sums(out, repo / "benchmarks/kernel/peers/wheels.sha256", "test")
    # pip stands in as a shell function that copies what it would install into its --target
    script = f"""
        python3() {{ local target=$9; shift 9; mkdir -p "$target"; cp "$@" "$target"/; }}
        cd {repo}
        source benchmarks/kernel/peers/install_on_device.sh && echo "PYTHONPATH=$PYTHONPATH"
    """
    held = out / "p3"
    held.rename(tmp_path / "p3-later")  # one folder still to come: nothing installs
    first = subprocess.run(["bash", "-c", script], capture_output=True, text=True)
    assert first.returncode == 0 and "not here yet: p3/flashinfer_python" in first.stdout, first.stderr
    assert not (tmp_path / "site-fa4").exists()
    (tmp_path / "p3-later").rename(held)
    second = subprocess.run(["bash", "-c", script], capture_output=True, text=True)
    assert second.returncode == 0, second.stderr
    joined = tmp_path / "site-fa4" / big.name
    assert hashlib.sha256(joined.read_bytes()).hexdigest() == digest
    assert sorted(p.name for p in (tmp_path / "site-fi").iterdir()) == [
        "apache_tvm_ffi-0.1.11-cp312-abi3-x.whl", "flashinfer_python-0.7.2-py3-none-any.whl"]
    assert f"PYTHONPATH={tmp_path}/site-fi:" in second.stdout

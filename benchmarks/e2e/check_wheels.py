"""Carried wheels on the GPU machine: pick the fallbacks it needs, then check the installed result.

The GPU image (Python 3.12, no network) already holds torch, triton, numpy, pandas, matplotlib, aiohttp ...
at versions we cannot read ahead of the call. `.whl/*.whl` holds what the image lacks (aiperf, pydantic,
pyzmq, ...) and is always installed; `.whl/ifneeded/*.whl` holds pinned versions of packages the image
has, installed only where the image's version misses a requirement of what gets installed (aiperf pins
e.g. pandas~=2.3.3, rich~=14.1.0, psutil~=7.0.0). Installing a fallback can raise further needs (pandas 2
needs pytz), so the choice is repeated until nothing changes.

    python3 benchmarks/e2e/check_wheels.py select .whl   # paths to install, one a line (run BEFORE PYTHONPATH)
    python3 benchmarks/e2e/check_wheels.py check         # imports, versions, CLIs (run AFTER install)
"""
from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import tomllib
import zipfile
from importlib import metadata
from pathlib import Path

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
from packaging.version import Version

REPO = Path(__file__).resolve().parents[2]
# aiperf requirements left behind on purpose: features the recipes do not use (dashboards, k8s, tuning,
# audio/video inputs, public datasets); none is imported by `aiperf profile` with a trace file.
NOT_CARRIED = {"aiosqlite", "dash", "dash-bootstrap-components", "datasets", "fastapi", "kaleido", "kopf",
               "kubernetes-asyncio", "optuna", "plotly", "python-multipart", "soundfile", "starlette-compress",
               "textual", "uvicorn", "fabric"}
# Never carried: the image's CUDA builds must stay in charge.
IMAGE_ONLY = re.compile(r"^(torch|torchvision|torchaudio|triton|numpy|jax|jaxlib|cupy.*|nvidia-.*)$")


class Wheel:
    def __init__(self, path: Path):
        self.path = path
        with zipfile.ZipFile(path) as z:
            meta = next(n for n in z.namelist() if n.endswith(".dist-info/METADATA"))
            text = z.read(meta).decode()
        headers = [line.split(": ", 1) for line in text.split("\n\n", 1)[0].splitlines() if ": " in line]
        self.name = canonicalize_name(next(v for k, v in headers if k == "Name"))
        self.version = Version(next(v for k, v in headers if k == "Version"))
        self.requires = [Requirement(v) for k, v in headers if k == "Requires-Dist"]


def runtime_requirements(reqs: list[Requirement]) -> list[Requirement]:
    """Requirements that hold on this interpreter with no extras asked for."""
    return [r for r in reqs if r.marker is None or r.marker.evaluate({"extra": ""})]


def project_requirements() -> list[Requirement]:
    deps = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["dependencies"]
    return [Requirement(d) for d in deps]


def image_versions() -> dict[str, Version]:
    """What the interpreter sees now (run before /tmp/site is on PYTHONPATH: the image alone)."""
    found = {}
    for dist in metadata.distributions():
        try:
            found.setdefault(canonicalize_name(dist.metadata["Name"]), Version(dist.version))
        except Exception:  # a broken dist-info in the image must not stop the install
            continue
    return found


def select(whl_dir: Path) -> list[Wheel]:
    always = [Wheel(p) for p in sorted(whl_dir.glob("*.whl"))]
    fallbacks = {w.name: w for w in (Wheel(p) for p in sorted((whl_dir / "ifneeded").glob("*.whl")))}
    for w in always + list(fallbacks.values()):
        if IMAGE_ONLY.match(w.name):
            sys.exit(f"check_wheels: {w.path.name} would shadow the image's {w.name}; remove it from {whl_dir}")
    image = image_versions()
    chosen = {w.name: w for w in always}
    changed = True
    while changed:
        changed = False
        reqs = project_requirements() + [r for w in chosen.values() for r in runtime_requirements(w.requires)]
        for name, fb in fallbacks.items():
            if name in chosen:
                continue
            mine = [r for r in reqs if canonicalize_name(r.name) == name]
            have = image.get(name)
            if mine and (have is None or not all(r.specifier.contains(have, prereleases=True) for r in mine)):
                print(f"check_wheels: fallback {fb.path.name} (image has {have}, needed "
                      f"{', '.join(str(r) for r in mine)})", file=sys.stderr)
                chosen[name] = fb
                changed = True
    report_unmet(chosen, image)
    return list(chosen.values())


def report_unmet(chosen: dict[str, Wheel], image: dict[str, Version]) -> None:
    reqs = project_requirements() + [r for w in chosen.values() for r in runtime_requirements(w.requires)]
    for r in reqs:
        name = canonicalize_name(r.name)
        have = chosen[name].version if name in chosen else image.get(name)
        if name in NOT_CARRIED:
            continue
        if have is None or not r.specifier.contains(have, prereleases=True):
            print(f"check_wheels: WARNING unmet requirement {r} (found {have})", file=sys.stderr)


def run(argv: list[str], timeout: float = 180) -> None:
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=timeout)
    if proc.returncode != 0:
        sys.exit(f"check_wheels: {' '.join(argv)} exited {proc.returncode}:\n{proc.stdout[-2000:]}"
                 f"\n{proc.stderr[-4000:]}")
    print(f"ok: {' '.join(argv[1:])}")


def check(skip: set[str]) -> None:
    import importlib
    os.environ.setdefault("MPLBACKEND", "Agg")
    for mod in ("pydantic", "yaml", "numpy", "pandas", "matplotlib", "aiohttp", "transformers", "zmq",
                "aiperf", "aiperf.cli", "pipeline", "pipeline.cli", "pipeline.emulator.server", "analysis",
                "analysis.report", "torch", "triton"):
        if mod in skip:
            continue
        m = importlib.import_module(mod)
        where = getattr(m, "__file__", "") or ""
        print(f"{mod:26s} {getattr(m, '__version__', ''):14s} {where}")
        if mod in ("torch", "triton", "numpy") and where.startswith("/tmp/site"):
            sys.exit(f"check_wheels: {mod} comes from /tmp/site, not the image: {where}")
    for dist in ("aiperf", "pandas", "rich", "psutil", "aiohttp", "pillow", "uvloop", "pydantic"):
        print(f"dist {dist:20s} {metadata.version(dist)}")
    if "torch" not in skip:
        import torch
        print(f"torch.cuda.is_available() = {torch.cuda.is_available()}")
    run([sys.executable, "-m", "aiperf", "profile", "--help"])
    run([sys.executable, "-m", "pipeline.cli", "--help"])
    print("check_wheels: all good")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="cmd", required=True)
    sel = sub.add_parser("select", help="print the wheel paths to install")
    sel.add_argument("whl_dir", type=Path)
    chk = sub.add_parser("check", help="import everything and run the CLIs' --help")
    chk.add_argument("--skip", default="", help="comma-separated modules not to import (torch,triton off-GPU)")
    args = parser.parse_args()
    if args.cmd == "select":
        for w in select(args.whl_dir):
            print(w.path)
    else:
        check({m for m in args.skip.split(",") if m})


if __name__ == "__main__":
    main()

"""Where a figure was computed: the machine, the code and the libraries that computed it.

Reports carry this so that two runs' figures can be told apart by their origin. The same code,
pools and saved donor have given different first picks on two machines (docs/ranking.md, "The
unseen-shape table on another CPU"), and a live measurement of one machine is not another's.
"""

from __future__ import annotations

import os
import platform
import subprocess
from importlib import metadata
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

# What every reported figure passes through: the compiler and its features, the network, the
# trees, the numerics of the metrics.
PACKAGES = ("apache-tvm", "apache-tvm-ffi", "torch", "torch-geometric", "xgboost-cpu", "numpy",
            "scipy")


def machine() -> dict:
    """The CPU as LLVM names it (what `mcpu: host` resolves to), its model name and the cores
    this process may use: latencies measured on one are not another's."""
    import tvm

    cpuinfo = Path("/proc/cpuinfo")
    names = [line.split(":", 1)[1].strip() for line in
             (cpuinfo.read_text().splitlines() if cpuinfo.is_file() else [])
             if line.startswith("model name")]
    return {"cpu": tvm.target.codegen.llvm_get_system_cpu(), "model": names[0] if names else "",
            "cores": os.cpu_count()}


def code_version() -> str | None:
    """The commit of the code running (`+changes` when tracked files differ from it), or None
    outside a git checkout. A donor trained by other code is another donor: its figures
    reproduce only with that code, or with the saved donor."""
    def git(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run(["git", "-C", str(ROOT), *args], capture_output=True, text=True)
    try:
        head = git("rev-parse", "HEAD")
        changed = git("diff", "--quiet", "HEAD", "--").returncode != 0
    except OSError:  # no git
        return None
    return head.stdout.strip() + ("+changes" if changed else "") if head.returncode == 0 else None


def _version(package: str) -> str | None:
    try:
        return metadata.version(package)
    except metadata.PackageNotFoundError:
        return None


def environment() -> dict:
    """The machine, the code's commit, Python's and each of PACKAGES' version."""
    return {**machine(), "code": code_version(), "python": platform.python_version(),
            "packages": {p: _version(p) for p in PACKAGES}}

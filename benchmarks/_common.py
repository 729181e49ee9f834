"""What the benchmark scripts share: where the data is, what ran them."""

import os
import platform
import subprocess
import time
from pathlib import Path

import torch

REPO_ROOT = Path(__file__).resolve().parents[1]


def default_data_home():
    """The MNIST folder: $SKASSOC_MNIST_DIR, a shared/ copy, or data_local/."""
    from_env = os.environ.get("SKASSOC_MNIST_DIR")
    if from_env:
        return from_env
    for candidate in (
        REPO_ROOT.parent / "shared" / "data" / "mnist",
        REPO_ROOT / "shared" / "data" / "mnist",
    ):
        if candidate.is_dir():
            return str(candidate)
    return str(REPO_ROOT / "data_local" / "mnist")


def device_description(device):
    """The GPU's name, or the CPU model and its number of logical CPUs."""
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    name = platform.processor()
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    name = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    return f"{name or platform.machine()}, {os.cpu_count()} logical CPUs"


def git_revision():
    """The checked-out commit ("-dirty" if tracked files changed), or None."""
    try:
        head = subprocess.run(
            ["git", "rev-parse", "HEAD"],
            cwd=REPO_ROOT,
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "status", "--porcelain", "--untracked-files=no"],
            cwd=REPO_ROOT,
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
        return head + ("-dirty" if dirty else "")
    except (OSError, subprocess.CalledProcessError):
        return None


def environment(device):
    """Machine, library versions and revision: the header of every result file."""
    import numpy as np
    import sklearn

    import skassoc

    return {
        "device": device_description(device),
        "device_type": device.type,
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "cudnn": torch.backends.cudnn.version() if device.type == "cuda" else None,
        "sklearn": sklearn.__version__,
        "numpy": np.__version__,
        "python": platform.python_version(),
        "skassoc": skassoc.__version__,
        "skassoc_path": str(Path(skassoc.__file__).parent),
        "git_revision": git_revision(),
        "torch_threads": torch.get_num_threads(),
        "date": time.strftime("%Y-%m-%d %H:%M:%S %z"),
    }

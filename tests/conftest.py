"""Shared fixtures: small data sets and a fast estimator configuration."""

import json
import os
import stat
import subprocess
import sys

# scikit-learn's check_array_api_input runs only with SciPy's array API
# support switched on, which must happen before SciPy is first imported.
os.environ.setdefault("SCIPY_ARRAY_API", "1")

import types

import numpy as np
import pytest
import torch
from sklearn.datasets import load_digits, make_blobs

import skassoc

# A tiny MLP trained for a few dozen steps on the CPU: a fit takes a fraction
# of a second, and on well-separated blobs it still learns the classes.
FAST_PARAMS = types.MappingProxyType(
    {
        "network": "mlp",
        "hidden_layer_sizes": (16,),
        "embedding_dim": 8,
        "labeled_per_class": 3,
        "unlabeled_batch_size": 32,
        "max_iter": 30,
        "learning_rate": 1e-2,
        "device": "cpu",
        "random_state": 0,
    }
)


#: The estimator of the data-parallel tests (test_data_parallel.py: a
#: torchrun-like pair of processes; test_devices.py: ``devices=[...]``).
DATA_PARALLEL_PARAMS = types.MappingProxyType(
    {
        "network": "mlp",
        "hidden_layer_sizes": (16,),
        "embedding_dim": 8,
        "labeled_per_class": 3,
        # Odd sizes: the processes' shares differ by a row.
        "unlabeled_batch_size": 31,
        "learning_rate": 0.01,
        "device": "cpu",
        "random_state": 0,
    }
)


#: Whether the data-parallel tests also run their NCCL variant (two GPUs:
#: a process each) besides the gloo one (two CPU processes).
TWO_GPUS = torch.cuda.device_count() >= 2
#: The backends of those tests, as ``pytest.mark.parametrize`` values.
BACKENDS = [
    "gloo",
    pytest.param(
        "nccl", marks=pytest.mark.skipif(not TWO_GPUS, reason="needs two GPUs")
    ),
]


def data_parallel_params(backend, rank=0):
    """``DATA_PARALLEL_PARAMS`` for process ``rank`` of a ``backend`` pair.

    NCCL processes train on GPU ``rank`` in float32, so that they are
    compared with one GPU process within float rounding, not bf16's.
    """
    if backend == "gloo":
        return dict(DATA_PARALLEL_PARAMS)
    return {**DATA_PARALLEL_PARAMS, "device": f"cuda:{rank}", "precision": "fp32"}


@pytest.fixture(scope="module")
def blobs_for_workers():
    """Blobs whose first 30 samples are labeled, as the workers make them."""
    X, y = make_blobs(150, centers=3, n_features=5, random_state=0)
    y[30:] = -1
    return X, y


def _write_memmap(path, array):
    mapped = np.lib.format.open_memmap(
        path, mode="w+", dtype=array.dtype, shape=array.shape
    )
    mapped[:] = array
    mapped.flush()
    del mapped
    return np.load(path, mmap_mode="r")


@pytest.fixture(scope="session")
def write_memmap():
    """``write_memmap(path, array)``: ``array`` written to the ``.npy`` file
    ``path``, opened again as a read-only memory map."""
    return _write_memmap


# Peak private memory of one call, measured in a fresh interpreter: in a
# process that has already freed large arrays, glibc raises its mmap
# threshold and keeps freed heap memory, so a peak there adds up garbage of
# earlier phases (and a lifetime peak such as ru_maxrss may never move). A
# fixed threshold (MALLOC_MMAP_THRESHOLD_) returns large arrays when freed,
# and ``warm_up`` pays the one-time costs (imports, thread pools) first.
_MEMORY_HARNESS = """
import json, sys, threading, time
import torch

torch.set_num_threads(1)
{source}

def private_kib():
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith("RssAnon:"):
                return int(line.split()[1])

args = json.loads(sys.argv[1])
warm_up(*args)
peak, done = [0], threading.Event()

def watch():
    while not done.is_set():
        peak[0] = max(peak[0], private_kib())
        time.sleep(0.002)

baseline = private_kib()
watcher = threading.Thread(target=watch)
watcher.start()
try:
    result = measured(*args)
finally:
    done.set()
    watcher.join()
print(json.dumps({{
    "grown_mib": (peak[0] - baseline) / 1024,
    "result": result,
    "skassoc": sys.modules["skassoc"].__file__,
}}))
"""


@pytest.fixture(scope="session")
def peak_memory_growth():
    """``peak_memory_growth(source, *args)``: run ``source``, which defines
    ``warm_up(*args)`` and ``measured(*args)``, in a fresh interpreter; return
    ``(MiB of private memory measured() added at its peak, its result)``.
    Linux only (it reads /proc)."""

    # The checkout's skassoc, wherever pytest was started from (an
    # installed copy in site-packages would be measured otherwise).
    root = os.path.dirname(os.path.dirname(skassoc.__file__))
    path = os.pathsep.join(filter(None, [root, os.environ.get("PYTHONPATH")]))

    def run(source, *args):
        done = subprocess.run(
            [
                sys.executable,
                "-c",
                _MEMORY_HARNESS.format(source=source),
                json.dumps(args),
            ],
            env={**os.environ, "MALLOC_MMAP_THRESHOLD_": "131072", "PYTHONPATH": path},
            cwd=root,
            capture_output=True,
            text=True,
            timeout=180,
            check=False,
        )
        assert done.returncode == 0, done.stderr
        measured = json.loads(done.stdout.strip().splitlines()[-1])
        assert measured["skassoc"] == skassoc.__file__, measured["skassoc"]
        return measured["grown_mib"], measured["result"]

    return run


@pytest.fixture(scope="session")
def fast_params():
    """Read-only keyword arguments of a fast estimator; merge with ``{**...}``."""
    return FAST_PARAMS


@pytest.fixture(scope="session")
def labeled_params(fast_params):
    """``fast_params`` for a ``y`` without ``-1``, such as ``blobs``.

    ``unlabeled_pool="all"`` asks for the paper's "all labels" setting (the
    unlabeled batch drawn from every sample), which such a ``y`` gets anyway,
    without the warning that a ``y`` with no ``-1`` otherwise gives.
    """
    return types.MappingProxyType({**fast_params, "unlabeled_pool": "all"})


@pytest.fixture(scope="session")
def torch_single_thread():
    """Run torch on one thread for the tests that use this fixture.

    The tests train tiny networks, for which one thread is as fast as several,
    and on a loaded machine OpenMP threads that wait for each other make a
    fit of a few dozen steps take seconds instead of milliseconds.
    """
    previous = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(previous)


@pytest.fixture(scope="session")
def _digits():
    X, y = load_digits(return_X_y=True)
    return X, y


@pytest.fixture
def digits(_digits):
    """All 1797 digits: ``X`` (n, 64) float64 pixels 0..16 and labels 0..9."""
    X, y = _digits
    return X.copy(), y.copy()


@pytest.fixture
def digits_small(_digits):
    """300 digits, all labeled: ``X`` (300, 64) and ``y``."""
    X, y = _digits
    return X[:300].copy(), y[:300].copy()


@pytest.fixture
def bright_digit_images(_digits):
    """300 digits as (n, 8, 8) uint8 images, pixels 0..240, every third labeled.

    The augmentation works on raw pixel values (0..255); the others are -1.
    """
    X, y = _digits
    images = (X[:300] * 15).astype(np.uint8).reshape(-1, 8, 8)
    y_semi = y[:300].copy()
    y_semi[np.arange(300) % 3 != 0] = -1
    return images, y_semi


@pytest.fixture
def digits_images(_digits):
    """200 digits as (n, 8, 8) uint8 images (pixel values 0..16) and labels."""
    X, y = _digits
    return X[:200].reshape(-1, 8, 8).astype(np.uint8), y[:200].copy()


def _read_only(*arrays):
    for array in arrays:
        array.flags.writeable = False
    return arrays


@pytest.fixture(scope="session")
def blobs():
    """Three well-separated classes of 4 features, 150 samples, all labeled.

    Read-only arrays (shared by the whole session); copy them to modify.
    """
    X, y = make_blobs(
        n_samples=150, n_features=4, centers=3, cluster_std=1.0, random_state=0
    )
    return _read_only(X, y)


@pytest.fixture(scope="session")
def blobs_semi(blobs):
    """The blobs with all but 10 samples of every class unlabeled (-1)."""
    X, y = blobs
    return _read_only(X, _hide_labels(y, 10, random_state=0))


def _hide_labels(y, n_per_class, random_state=0):
    """``y`` with all but ``n_per_class`` random samples of each class set to -1."""
    rng = np.random.RandomState(random_state)
    y_semi = np.full_like(y, -1)
    for label in np.unique(y):
        members = np.flatnonzero(y == label)
        keep = rng.choice(members, size=min(n_per_class, len(members)), replace=False)
        y_semi[keep] = y[keep]
    return y_semi


@pytest.fixture
def make_special_file():
    """Makes a FIFO, a directory or a character device (/dev/null's) at a path.

    The device needs privileges: without them the test is skipped.
    """

    def make(path, kind):
        if kind == "fifo":
            os.mkfifo(path)
        elif kind == "directory":
            path.mkdir()
        else:
            try:
                os.mknod(path, stat.S_IFCHR | 0o600, os.makedev(1, 3))
            except PermissionError:
                pytest.skip("creating a device node needs privileges")

    return make

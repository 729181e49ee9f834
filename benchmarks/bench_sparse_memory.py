"""Memory and time of a default fit on a large sparse matrix, on a CPU.

A random CSR matrix of 100,000 rows and 50,000 features at 0.1 % density
(5 million stored values; dense, 20 GB in float32) is fitted with default
parameters on one torch thread, in a fresh process of its own, which then
predicts every row. The process reports its peak resident memory
(``resource.getrusage``'s ``ru_maxrss``: everything, Python, torch and the
data included) and the peak of the Python and NumPy allocations during the
fit (``tracemalloc``; torch's own allocations are not traced), and the
table shows them next to the matrix's dense size. The rows' values are
uniform in (0, 1) and the labels random (20 classes, 10 labeled rows each):
the run measures memory and time, not accuracy. ``docs/benchmarks/speed.rst``
shows the table::

    python benchmarks/bench_sparse_memory.py
    python benchmarks/bench_sparse_memory.py --rows 20000 --no-save  # a first look
    python benchmarks/bench_sparse_memory.py --render-only
"""

import json
import resource
import subprocess
import sys
import tempfile
import time
import tracemalloc
from pathlib import Path

import _harness as h
import numpy as np

#: The issue's matrix: rows, features and share of stored values.
ROWS, FEATURES, DENSITY = 100_000, 50_000, 0.001
#: Classes of the random labels, and labeled rows of each.
N_CLASSES, LABELED_PER_CLASS = 20, 10


def random_rows(n_rows, n_features, density, seed=0):
    """A CSR matrix of ``density * n_features`` values a row on average, at
    uniformly random columns (a repeated column is summed once), values
    uniform in (0, 1), float32 with int32 indices (as TfidfVectorizer's)."""
    from scipy import sparse

    rng = np.random.default_rng(seed)
    lengths = rng.poisson(density * n_features, n_rows)
    indptr = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int32)
    columns = rng.integers(n_features, size=int(indptr[-1]), dtype=np.int32)
    values = rng.random(int(indptr[-1]), dtype=np.float32)
    rows = sparse.csr_matrix((values, columns, indptr), shape=(n_rows, n_features))
    rows.sum_duplicates()
    return rows


def random_labels(n_rows, seed=0):
    """Random classes, ``LABELED_PER_CLASS`` rows of each labeled, -1 elsewhere."""
    rng = np.random.default_rng(seed)
    y = rng.integers(N_CLASSES, size=n_rows)
    y_semi = np.full(n_rows, -1)
    for k in range(N_CLASSES):
        chosen = rng.choice(np.flatnonzero(y == k), LABELED_PER_CLASS, replace=False)
        y_semi[chosen] = k
    return y_semi


def measure_in_this_process(n_rows, n_features, density):
    """Fit and predict here (the child process); a dict of what was measured."""
    import torch

    from skassoc import SemiSupervisedAssociationClassifier

    torch.set_num_threads(1)
    X, y_semi = random_rows(n_rows, n_features, density), random_labels(n_rows)
    data_rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    clf = SemiSupervisedAssociationClassifier(device="cpu", random_state=0)
    tracemalloc.start()
    start = time.perf_counter()
    clf.fit(X, y_semi)
    fit_seconds = time.perf_counter() - start
    traced_peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    start = time.perf_counter()
    clf.predict(X)
    predict_seconds = time.perf_counter() - start
    return dict(
        rows=n_rows,
        features=n_features,
        density=density,
        stored_values=int(X.nnz),
        dense_bytes=4 * n_rows * n_features,
        network=clf.network_,
        n_iter=int(clf.n_iter_),
        fit_seconds=round(fit_seconds, 2),
        predict_seconds=round(predict_seconds, 2),
        peak_rss_bytes=resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024,
        rss_after_data_bytes=data_rss,
        traced_peak_bytes=traced_peak,
        environment=h.environment(torch.device("cpu")),
    )


def measure(args):
    """Run the measurement in a fresh process (so that its peak memory is the
    fit's alone); the results file's content."""
    command = [sys.executable, __file__, "--child", str(args.rows)]
    command += [str(args.features), str(args.density)]
    child = subprocess.run(command, capture_output=True, text=True, check=False)
    if child.returncode != 0:
        raise SystemExit(f"error: the measuring process failed:\n{child.stderr}")
    run = json.loads(child.stdout.strip().splitlines()[-1])
    return {"device": "cpu", "runs": [run]}


def _mib(n_bytes):
    return f"{n_bytes / 2**20:,.0f}"


def render(results):
    """The rst table of the runs."""
    header = ["Rows x features", "Density", "Dense GiB", "Fit s", "Steps"]
    header += ["Predict s", "Peak RSS MiB", "Data MiB", "Traced peak MiB"]
    cells = []
    for run in results["runs"]:
        cells.append(
            [
                f"{run['rows']:,} x {run['features']:,}",
                f"{100 * run['density']:g} %",
                f"{run['dense_bytes'] / 2**30:.1f}",
                f"{run['fit_seconds']:.1f}",
                str(run["n_iter"]),
                f"{run['predict_seconds']:.1f}",
                _mib(run["peak_rss_bytes"]),
                _mib(run["rss_after_data_bytes"]),
                _mib(run["traced_peak_bytes"]),
            ]
        )
    return h.rst_table(header, cells)


def parse_args(argv=None):
    parser = h.make_parser(__doc__.splitlines()[0], "sparse_memory", cases=False)
    parser.set_defaults(device="cpu")
    add = parser.add_argument
    add("--rows", type=h.bounded_int(1000), default=ROWS, help=f"default {ROWS:,}")
    features = h.bounded_int(100)
    add("--features", type=features, default=FEATURES, help=f"default {FEATURES:,}")
    add("--density", type=float, default=DENSITY, help=f"default {DENSITY}")
    add("--no-save", action="store_true", help="keep no files (a temporary folder)")
    args = h.parse(parser, argv)
    if args.device != "cpu":
        parser.error("the benchmark runs on a CPU: leave out --device")
    if not 0 < args.density <= 1:
        parser.error("--density takes a share of stored values in (0, 1]")
    return args


def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["--child"]:
        rows, features, density = int(argv[1]), int(argv[2]), float(argv[3])
        print(json.dumps(measure_in_this_process(rows, features, density)))
        return None
    args = parse_args(argv)
    if args.no_save:
        folder = tempfile.mkdtemp(prefix="skassoc-bench-")
        args.json = str(Path(folder) / "sparse_memory_cpu.json")
        args.table = str(Path(folder) / "sparse_memory_cpu.rst")
    return h.measure_main(args, measure, render)


if __name__ == "__main__":
    main()

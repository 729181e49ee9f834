"""What the benchmark scripts share: where the data is, what ran them."""

import datetime
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


def source_digest(root=REPO_ROOT):
    """SHA-256 of the package's and the benchmarks' Python sources.

    The revision alone can mislead: a copy of the working tree run on another
    machine may carry older git metadata than its files. This digest comes
    from the files themselves; to find the commit a result was measured at,
    check out candidates and compare
    ``python -c "import _common; print(_common.source_digest())"`` (from
    ``benchmarks/``) with the result's ``source_digest``.
    """
    import hashlib

    root = Path(root)
    digest = hashlib.sha256()
    files = sorted(
        [*(root / "skassoc").rglob("*.py"), *(root / "benchmarks").glob("*.py")]
    )
    for path in files:
        digest.update(path.relative_to(root).as_posix().encode() + b"\0")
        digest.update(path.read_bytes() + b"\0")
    return digest.hexdigest()


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
        "source_digest": source_digest(),
        "torch_threads": torch.get_num_threads(),
        "date": time.strftime("%Y-%m-%d %H:%M:%S %z"),
    }


# ---------------------------------------------------------------------------
# Helpers of the scripts that rerun one table of the paper (bench_svhn.py,
# bench_stl10.py): a device from --device, a training schedule shortened by
# --max-iter, one timed fit and evaluation, and the summary, table and JSON.


def resolve_device(name):
    """The torch device of ``--device``: "auto" is a GPU when torch sees one.

    Exits with a message when a GPU is asked for and torch sees none.
    """
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        device = torch.device(name)
    except RuntimeError as exc:
        raise SystemExit(
            f"error: --device {name!r} is not a device ({exc}); use auto, cpu, "
            "cuda or cuda:N."
        ) from None
    if device.type == "cuda" and not torch.cuda.is_available():
        raise SystemExit(
            f"error: --device {name} was asked for, but torch sees no GPU; use "
            "--device cpu (or auto)."
        )
    return device


def shortened_schedule(params, max_iter):
    """``params`` trained for ``max_iter`` steps, the decay interval scaled alike.

    ``params["max_iter"]`` and ``params["lr_decay_steps"]`` must be ints: the
    learning rate then decays at the same fractions of the run.
    """
    params = dict(params)
    scale = max_iter / params["max_iter"]
    params["lr_decay_steps"] = max(1, round(params["lr_decay_steps"] * scale))
    params["max_iter"] = max_iter
    return params


def synchronize(device):
    """Wait for the GPU's queued work, so that a wall-clock time covers it."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def fit_and_evaluate(params, X, y, X_test, y_test, device):
    """Fit one SemiSupervisedAssociationClassifier and score its last step.

    Returns the test error and accuracy (%), the wall time of ``fit`` (input
    validation, copy to the device, CUDA-graph capture and all training
    steps) and of ``predict`` on the test set, and the final losses.
    """
    import numpy as np

    from skassoc import SemiSupervisedAssociationClassifier

    clf = SemiSupervisedAssociationClassifier(**{**params, "device": str(device)})
    synchronize(device)
    start = time.perf_counter()
    clf.fit(X, y)
    synchronize(device)
    fit_seconds = time.perf_counter() - start
    start = time.perf_counter()
    predicted = clf.predict(X_test)
    eval_seconds = time.perf_counter() - start
    error = 100.0 * float(np.mean(predicted != np.asarray(y_test)))
    record = {
        "test_error_percent": error,
        "test_accuracy_percent": 100.0 - error,
        "fit_seconds": fit_seconds,
        "eval_seconds": eval_seconds,
        "n_iter": int(clf.n_iter_),
        "final_losses": {
            name: float(values[-1])
            for name, values in clf.history_.items()
            if name in ("total", "walker", "visit", "logit") and len(values)
        },
    }
    del clf
    if device.type == "cuda":
        torch.cuda.empty_cache()
    return record


def _started(record):
    try:
        return datetime.datetime.strptime(record["started"], "%Y-%m-%d %H:%M:%S %z")
    except (KeyError, TypeError, ValueError):
        return datetime.datetime.min.replace(tzinfo=datetime.timezone.utc)


def keep_better_run(current, candidate):
    """Of two records of one run (e.g. from files being merged), the one to keep.

    A finished run beats a failed one; between equals, the one trained last
    (its ``started`` time, when recorded) and otherwise ``candidate`` wins.
    """
    if current is None:
        return candidate
    ok, current_ok = candidate.get("status") == "ok", current.get("status") == "ok"
    if ok != current_ok:
        return candidate if ok else current
    return candidate if _started(candidate) >= _started(current) else current


def summarize(values):
    """Median, sample standard deviation (ddof=1), min and max of ``values``."""
    import numpy as np

    values = np.asarray(values, dtype=float)
    n = len(values)
    return {
        "n": n,
        "median": float(np.median(values)) if n else None,
        "std": float(np.std(values, ddof=1)) if n > 1 else None,
        "min": float(values.min()) if n else None,
        "max": float(values.max()) if n else None,
    }


def text_table(header, rows):
    """A plain-text table (a reStructuredText simple table), first column left."""
    rows = [[str(v) for v in row] for row in rows]
    widths = [max(len(r[i]) for r in [header, *rows]) for i in range(len(header))]

    def line(values):
        cells = (
            v.ljust(w) if i == 0 else v.rjust(w)
            for i, (v, w) in enumerate(zip(values, widths))
        )
        return "  ".join(cells).rstrip()

    border = "  ".join("=" * w for w in widths)
    return "\n".join([border, line(header), border, *map(line, rows), border])


def write_json(path, data):
    """Write ``data`` as JSON atomically (a reader never sees half a file)."""
    import json

    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp{os.getpid()}")
    tmp.write_text(json.dumps(data, indent=2, default=str) + "\n")
    os.replace(tmp, path)


def run_and_record(run, make_inputs, results, out, device):
    """Train and score one run; append it to ``results["runs"]`` and save.

    ``run`` describes the run (its setting and seed; it also names it in the
    log); ``make_inputs()`` returns ``(params, X, y, X_test, y_test)`` for
    :func:`fit_and_evaluate`. A failing run is recorded with its error and
    the traceback printed, so that one failure costs one entry, not the rest
    of the benchmark. The JSON ``out`` is rewritten after every run.
    """
    import traceback

    name = ", ".join(f"{k} {v}" for k, v in run.items())
    print(f"{name}: training ...", flush=True)
    run = dict(run)
    try:
        params, X, y, X_test, y_test = make_inputs()
        run["params"] = params
        run.update(fit_and_evaluate(params, X, y, X_test, y_test, device))
        run["status"] = "ok"
        print(
            f"{name}: error {run['test_error_percent']:.2f}% (accuracy "
            f"{run['test_accuracy_percent']:.2f}%) | fit {run['fit_seconds']:.1f} s",
            flush=True,
        )
    except Exception as exc:  # keep going: one failed run is one entry
        traceback.print_exc()
        run["status"] = "error"
        run["error"] = f"{type(exc).__name__}: {exc}"
        print(f"{name}: FAILED ({run['error']})", flush=True)
    results["runs"].append(run)
    write_json(out, results)
    return run


def summary_row(runs, score_key, **fields):
    """One table row: ``fields`` plus the summaries of the runs that succeeded."""
    done = [r for r in runs if r.get("status") == "ok"]
    return {
        **fields,
        "runs": len(runs),
        "runs_ok": len(done),
        score_key: summarize([r[score_key] for r in done]),
        "fit_seconds": summarize([r["fit_seconds"] for r in done]),
    }


def results_table(rows, setting_key, setting_title, score_key, score_title):
    """The rows of :func:`summary_row` as a text table beside the paper's figure."""

    def number(value, digits=2):
        return "n/a" if value is None else f"{value:.{digits}f}"

    header = [setting_title, "Runs", f"{score_title} (median)", "Std", "Min-max"]
    header += ["Paper", "Fit s (median)"]
    cells = []
    for row in rows:
        score = row[score_key]
        runs = str(row["runs_ok"])
        if row["runs_ok"] != row["runs"]:
            runs += f"/{row['runs']}"
        spread = "n/a" if not score["n"] else f"{score['min']:.2f}-{score['max']:.2f}"
        cells.append(
            [
                row[setting_key],
                runs,
                number(score["median"]),
                number(score["std"]),
                spread,
                number(row.get("paper")),
                number(row["fit_seconds"]["median"], 1),
            ]
        )
    return text_table(header, cells)


def add_run_arguments(parser, data_home_help, max_iter):
    """The options the table scripts share: data folder, device, seeds, steps."""
    parser.add_argument("--data-home", default=None, help=data_home_help)
    parser.add_argument(
        "--device", default="auto", help="auto, cpu, cuda or cuda:N (default auto)"
    )
    parser.add_argument(
        "--seeds",
        type=int,
        nargs="+",
        default=[0, 1, 2],
        help="label draws and network seeds, one run each (default 0 1 2)",
    )
    parser.add_argument(
        "--max-iter",
        type=int,
        default=None,
        help=f"training steps (default {max_iter}, the authors' code; the decay "
        "interval is scaled alike)",
    )

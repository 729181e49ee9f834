"""What a user gets with default parameters, against scikit-learn's methods.

Every data set is split into a training set (a few labels per class, the
rest unlabeled) and a test set; every method is fitted on the SAME label
draws and scored on the test set:

- ``skassoc``: ``SemiSupervisedAssociationClassifier()`` with default
  parameters (only ``device`` and ``random_state`` set), on images as
  ``(n, h, w)`` / ``(n, c, h, w)`` arrays or on feature columns;
- ``skassoc-labeled``: the same estimator fitted on the labeled samples only;
- ``label-spreading``: ``LabelSpreading(kernel="knn")`` on standardised
  features, ``n_neighbors`` and ``alpha`` the best of a small grid on other
  label draws (``TUNING_DRAWS``) than the reported ones;
- ``self-training-lr`` / ``self-training-hgb``: ``SelfTrainingClassifier``
  around ``LogisticRegression`` (standardised features) and
  ``HistGradientBoostingClassifier``;
- ``mlp-labeled``: ``MLPClassifier`` on the labeled samples only.

Reported: median test accuracy over the draws, the worst draw, and the
median fit time. Torch runs on one thread (``torch.set_num_threads(1)``).

Run ``python benchmarks/bench_defaults.py --only digits --labels 5 --methods
skassoc label-spreading`` for a first look at the sklearn digits (well under a
minute; ``self-training-hgb`` alone takes about 25 s a fit there), or
without options for the whole suite. Results are appended to
``benchmarks/results/defaults_<device>.json`` (runs already there are
skipped, so an interrupted suite resumes) and rendered to
``defaults_<device>.rst``; each run records the machine it ran on.

Images are passed as ``(n, h, w)`` arrays (``-8x8``, ``-16x16`` sets) and
tabular sets as columns; the baselines always see flat standardised columns.
Sets without an official test split hold out a stratified 30 %; a class with
no more samples than the labels asked for is labeled whole. MNIST trains on a
fixed 10,000-image subset on a CPU (all 60,000 on a GPU) and tests on the
official 10,000; the synthetic colour digits are 5,000 images of 16x16.
"""

import json
import os
import platform
import statistics
import sys
import time
import warnings
from pathlib import Path

import numpy as np
import torch
from sklearn.datasets import load_breast_cancer, load_digits, load_wine
from sklearn.ensemble import HistGradientBoostingClassifier
from sklearn.linear_model import LogisticRegression
from sklearn.model_selection import train_test_split
from sklearn.neural_network import MLPClassifier
from sklearn.pipeline import make_pipeline
from sklearn.preprocessing import StandardScaler
from sklearn.semi_supervised import LabelSpreading, SelfTrainingClassifier

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import _harness as h  # noqa: E402

from skassoc import SemiSupervisedAssociationClassifier  # noqa: E402
from skassoc.datasets import (  # noqa: E402
    load_mnist,
    make_semi_supervised_labels,
    make_synthetic_digits,
)

REPO_ROOT = Path(__file__).resolve().parents[1]
RESULTS = REPO_ROOT / "benchmarks" / "results"
#: The shared data folder (``../shared/data`` from the repository's root).
DATA = Path(os.environ.get("SKASSOC_SHARED_DATA", REPO_ROOT.parent / "shared" / "data"))
UCI = DATA / "uci"
MNIST = DATA / "mnist"
#: Label draws (and network seeds) of the reported runs.
DRAWS = 5
#: Label draws on which LabelSpreading's grid is chosen, never reported.
TUNING_DRAWS = (1000, 1001)
SPREADING_GRID = [
    {"n_neighbors": k, "alpha": a} for k in (5, 10, 20) for a in (0.2, 0.8)
]
METHODS = (
    "skassoc",
    "skassoc-labeled",
    "label-spreading",
    "self-training-lr",
    "self-training-hgb",
    "mlp-labeled",
)
#: Fraction of the samples held out for testing where a set has no test split.
TEST_SIZE = 0.3


# ------------------------------------------------------------------ data sets


def _split(X, y, seed=0):
    return train_test_split(X, y, test_size=TEST_SIZE, stratify=y, random_state=seed)


def _uci(name):
    path = UCI / name
    if not path.exists():
        raise FileNotFoundError(path)
    return path


def _csv(name, **kwargs):
    return np.loadtxt(_uci(name), delimiter=",", skiprows=1, **kwargs)


def _digits(images):
    X, y = load_digits(return_X_y=True)
    return _split(X.reshape(-1, 8, 8) if images else X, y)


def _sklearn(loader):
    X, y = loader(return_X_y=True)
    return _split(X, y)


def _pendigits():
    data = np.loadtxt(
        _uci("pendigits.csv"),
        delimiter=",",
        skiprows=1,
        converters={0: lambda s: float(s.strip('"'))},
    )
    return _split(data[:, 1:-1], data[:, -1].astype(int))


def _optdigits(images):
    train = _csv("optdigits.tra")
    test = _csv("optdigits.tes")
    shape = (-1, 8, 8) if images else (-1, 64)
    return (
        train[:, :-1].reshape(shape),
        test[:, :-1].reshape(shape),
        train[:, -1].astype(int),
        test[:, -1].astype(int),
    )


def _semeion(images):
    data = np.loadtxt(_uci("semeion.data"))
    X, y = data[:, :256], data[:, 256:].argmax(axis=1)
    return _split(X.reshape(-1, 16, 16) if images else X, y)


def _winequality(colour):
    data = _csv(f"winequality-{colour}.csv")
    return _split(data[:, :-1], data[:, -1].astype(int))


def _mnist(device):
    if not MNIST.is_dir():
        raise FileNotFoundError(MNIST)
    X, y = load_mnist("train", data_home=MNIST, return_X_y=True)
    X_test, y_test = load_mnist("test", data_home=MNIST, return_X_y=True)
    if device == "cpu":
        # A 10,000-image training subset on a CPU, the same for every run.
        keep = np.random.RandomState(0).permutation(len(X))[:10_000]
        X, y = X[keep], y[keep]
    return X, X_test, y, y_test


def _synthetic():
    # Colour images of printed digits, at 16x16 pixels so a CPU fit of the
    # default network stays within the suite's time.
    X, y = make_synthetic_digits(5000, image_size=16, random_state=0)
    return _split(np.asarray(X), np.asarray(y))


#: name -> loader(device) returning X_train, X_test, y_train, y_test.
DATASETS = {
    "digits": lambda device: _digits(images=False),
    "digits-8x8": lambda device: _digits(images=True),
    "breast-cancer": lambda device: _sklearn(load_breast_cancer),
    "wine": lambda device: _sklearn(load_wine),
    "pendigits": lambda device: _pendigits(),
    "optdigits": lambda device: _optdigits(images=False),
    "optdigits-8x8": lambda device: _optdigits(images=True),
    "semeion": lambda device: _semeion(images=False),
    "semeion-16x16": lambda device: _semeion(images=True),
    "winequality-red": lambda device: _winequality("red"),
    "winequality-white": lambda device: _winequality("white"),
    "mnist": _mnist,
    "synthetic-digits": lambda device: _synthetic(),
}


def draw_labels(y, labels_per_class, draw):
    """``labels_per_class`` labels of each class (all of a smaller class)."""
    classes, counts = np.unique(y, return_counts=True)
    small = np.isin(y, classes[counts <= labels_per_class])
    y_semi = np.asarray(y).copy()
    if (~small).any():
        y_semi[~small] = make_semi_supervised_labels(
            y[~small], labels_per_class, random_state=draw
        )
    return y_semi


# -------------------------------------------------------------------- methods


def _flat(X):
    return np.asarray(X, dtype=np.float64).reshape(len(X), -1)


def _skassoc(device, draw, params):
    return SemiSupervisedAssociationClassifier(
        device=device, random_state=draw, **params
    )


def fit_method(method, X, y_semi, device, draw, spreading_params, params):
    """Fit ``method`` on ``X, y_semi``; return the fitted predictor."""
    labeled = y_semi != -1
    if method == "skassoc":
        return _skassoc(device, draw, params).fit(X, y_semi)
    if method == "skassoc-labeled":
        return _skassoc(device, draw, params).fit(X[labeled], y_semi[labeled])
    flat = _flat(X)
    if method == "label-spreading":
        model = make_pipeline(
            StandardScaler(), LabelSpreading(kernel="knn", **spreading_params)
        )
        return _FlatModel(model.fit(flat, y_semi))
    if method == "self-training-lr":
        base = make_pipeline(StandardScaler(), LogisticRegression())
        return _FlatModel(SelfTrainingClassifier(base).fit(flat, y_semi))
    if method == "self-training-hgb":
        base = HistGradientBoostingClassifier(random_state=draw)
        return _FlatModel(SelfTrainingClassifier(base).fit(flat, y_semi))
    if method == "mlp-labeled":
        model = make_pipeline(
            StandardScaler(), MLPClassifier(max_iter=2000, random_state=draw)
        )
        return _FlatModel(model.fit(flat[labeled], y_semi[labeled]))
    raise ValueError(method)


class _FlatModel:
    def __init__(self, model):
        self.model = model

    def score(self, X, y):
        return self.model.score(_flat(X), y)


def tune_spreading(X, X_test, y, y_test, labels_per_class):
    """The grid point of LabelSpreading with the best mean accuracy on TUNING_DRAWS."""
    best, best_score = None, -1.0
    for params in SPREADING_GRID:
        scores = []
        for draw in TUNING_DRAWS:
            y_semi = draw_labels(y, labels_per_class, draw)
            model = fit_method(
                "label-spreading", X, y_semi, "cpu", draw, params, params={}
            )
            scores.append(model.score(X_test, y_test))
        if np.mean(scores) > best_score:
            best, best_score = params, float(np.mean(scores))
    return best


# ------------------------------------------------------------------ the suite


def run_key(run):
    return (run["dataset"], run["labels"], run["method"], run["draw"])


def load_runs(path):
    if path.exists():
        return json.loads(path.read_text())["runs"]
    return []


def save_runs(path, runs, device):
    path.parent.mkdir(parents=True, exist_ok=True)
    payload = {
        "device": device,
        "torch_threads": torch.get_num_threads(),
        "torch": torch.__version__,
        "runs": runs,
    }
    h.write_text(path, json.dumps(payload, indent=1) + "\n")


def run_suite(args):
    torch.set_num_threads(1)
    warnings.simplefilter("ignore", category=UserWarning)
    params = json.loads(args.params) if args.params else {}
    runs = load_runs(args.json)
    done = {run_key(run) for run in runs}
    methods = args.methods or METHODS
    for name, loader in DATASETS.items():
        if args.only and not any(word == name for word in args.only):
            continue
        try:
            X, X_test, y, y_test = loader(args.device)
        except (FileNotFoundError, OSError) as exc:
            print(f"skip {name}: {exc}", flush=True)
            continue
        for labels in args.labels:
            spreading = None
            for method in methods:
                for draw in range(args.draws):
                    key = (name, labels, method, draw)
                    if key in done:
                        continue
                    if method == "label-spreading" and spreading is None:
                        spreading = tune_spreading(X, X_test, y, y_test, labels)
                    y_semi = draw_labels(y, labels, draw)
                    start = time.perf_counter()
                    model = fit_method(
                        method, X, y_semi, args.device, draw, spreading, params
                    )
                    seconds = time.perf_counter() - start
                    run = {
                        "dataset": name,
                        "labels": labels,
                        "method": method,
                        "draw": draw,
                        "accuracy": float(model.score(X_test, y_test)),
                        "fit_seconds": round(seconds, 3),
                        "n_train": len(y),
                        "n_labeled": int((y_semi != -1).sum()),
                        "machine": platform.node(),
                    }
                    if method == "label-spreading":
                        run["params"] = spreading
                    if method.startswith("skassoc"):
                        run["n_iter"] = int(model.n_iter_)
                        run["network"] = model.network_
                        if params:
                            run["params"] = params
                    runs.append(run)
                    done.add(key)
                    print(json.dumps(run), flush=True)
                    save_runs(args.json, runs, args.device)
    return runs


# ------------------------------------------------------------------ rendering


def summarise(runs):
    """(dataset, labels) -> method -> (median, worst, median seconds, draws)."""
    groups = {}
    for run in runs:
        key = (run["dataset"], run["labels"])
        groups.setdefault(key, {}).setdefault(run["method"], []).append(run)
    table = {}
    for key, by_method in groups.items():
        table[key] = {
            method: (
                statistics.median(r["accuracy"] for r in rs),
                min(r["accuracy"] for r in rs),
                statistics.median(r["fit_seconds"] for r in rs),
                len(rs),
            )
            for method, rs in by_method.items()
        }
    return table


def render(runs, device):
    table = summarise(runs)
    order = list(DATASETS)
    header = ["data set", "labels/class", *METHODS]
    rows = []
    for dataset, labels in sorted(table, key=lambda k: (order.index(k[0]), k[1])):
        cells = table[dataset, labels]
        best = max(v[0] for v in cells.values())
        row = [dataset, str(labels)]
        for method in METHODS:
            if method not in cells:
                row.append("")
                continue
            median, worst, seconds, n = cells[method]
            text = f"{100 * median:.1f} ({100 * worst:.1f}) {seconds:.1f}s"
            if median == best:
                text = f"**{text}**"
            row.append(text)
        rows.append(row)
    widths = [max(len(r[i]) for r in [header, *rows]) for i in range(len(header))]
    line = " ".join("=" * w for w in widths)

    def fmt(r):
        return " ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip()

    where = "one GPU" if device == "cuda" else "a CPU"
    body = [
        f".. rubric:: Default parameters on {where}",
        "",
        "Median test accuracy in % over the label draws (worst draw in",
        "parentheses) and median fit seconds, one torch thread; the best",
        "median of each row in bold. Made by ``python benchmarks/bench_defaults.py",
        f"--device {device}``.",
        "",
        line,
        fmt(header),
        line,
        *(fmt(r) for r in rows),
        line,
        "",
    ]
    machines = {}
    for run in runs:
        machines[run.get("machine", "?")] = machines.get(run.get("machine", "?"), 0) + 1
    body.append(
        "Runs per machine (fit seconds compare within one machine only): "
        + ", ".join(f"{name}: {n}" for name, n in sorted(machines.items()))
        + "."
    )
    body.append("")
    return "\n".join(body)


def main(argv=None):
    parser = h.make_parser(__doc__.splitlines()[0], "defaults", cases=False)
    add = parser.add_argument
    add("--draws", type=int, default=DRAWS, help="label draws of each data set")
    add("--only", nargs="*", help="data sets to run (names)")
    add("--labels", type=int, nargs="*", default=[5, 10], help="labels per class")
    add("--methods", nargs="*", choices=METHODS)
    add("--params", help="JSON of skassoc parameters (experiments only)")
    args = h.parse(parser, argv)
    if not args.render_only:
        args.device = str(h.resolve_device(args.device))
    args.json, args.table = Path(args.json), Path(args.table)
    runs = load_runs(args.json) if args.render_only else run_suite(args)
    h.write_text(args.table, render(runs, args.device.split(":")[0]))
    print(args.table.read_text())


if __name__ == "__main__":
    main()

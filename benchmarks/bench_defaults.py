"""What a user gets with default parameters, against scikit-learn's methods.

``docs/benchmarks/defaults.rst`` describes the methods and data sets. Runs are
added to ``benchmarks/results/defaults_<device>.json`` (or ``--json``; those there are
skipped, so an interrupted suite resumes), and the docs' table is written
beside it (or to ``--table``). The script prints a plain-text summary of the
runs asked for and nothing else (``-v`` adds a line per run on stderr). The
second command is a first look in under a minute that keeps no files
(``--no-save``: they go to a temporary folder)::

    python benchmarks/bench_defaults.py --device cpu  # or cuda
    python benchmarks/bench_defaults.py --device cpu --only digits --labels 5 \\
        --draws 5 --methods skassoc label-spreading --no-save
    python benchmarks/bench_defaults.py --device cpu --render-only

Runs split over processes or machines write one ``--json`` file each (and
name their machine with ``--machine``); ``--merge`` joins them.

``--methods skassoc-given-prior skassoc-no-visit`` adds the runs of two
tables of their own: skassoc given the class frequencies, and without the
visit loss (see VARIANTS).
"""

import json
import os
import platform
import re
import statistics
import sys
import tempfile
import time
import warnings
from collections import Counter, defaultdict
from functools import partial
from itertools import product
from pathlib import Path

import _harness as h
import numpy as np
import torch
from scipy import sparse
from sklearn.datasets import load_breast_cancer, load_digits, load_wine
from sklearn.decomposition import TruncatedSVD
from sklearn.ensemble import HistGradientBoostingClassifier
from sklearn.exceptions import ConvergenceWarning
from sklearn.linear_model import LogisticRegression
from sklearn.model_selection import train_test_split
from sklearn.neural_network import MLPClassifier
from sklearn.pipeline import make_pipeline
from sklearn.preprocessing import FunctionTransformer, StandardScaler
from sklearn.semi_supervised import LabelSpreading, SelfTrainingClassifier

from skassoc import SemiSupervisedAssociationClassifier
from skassoc.datasets import (
    make_semi_supervised_labels,
    make_synthetic_digits,
    make_synthetic_signals,
)

#: The shared data folder (``../shared/data`` from the repository's root).
DATA = Path(os.environ.get("SKASSOC_SHARED_DATA", h.REPO_ROOT.parent / "shared/data"))
#: Label draws (and network seeds) of the reported runs.
DRAWS = 10
#: Label draws on which LabelSpreading's grid is chosen, never reported
#: (``--draws`` stops below them).
TUNING_DRAWS = (h.MAX_DRAWS, h.MAX_DRAWS + 1)
SPREADING_GRID = [
    {"n_neighbors": k, "alpha": a} for k in (5, 10, 20) for a in (0.2, 0.8)
]
METHODS = ("skassoc", "skassoc-labeled", "label-spreading", "self-training-lr")
METHODS += ("self-training-hgb", "mlp-labeled")
#: skassoc given the class frequencies of the training set (class_prior), run
#: on the imbalanced sets only and shown in a table of its own: not a default.
GIVEN_PRIOR = "skassoc-given-prior"
#: skassoc without the visit loss, on the sets where the unlabeled samples
#: cost it accuracy: which loss does it. Not a default either.
NO_VISIT = "skassoc-no-visit"
#: The variants of skassoc with a table each: its introduction.
VARIANTS = {
    GIVEN_PRIOR: "Given the class frequencies of the training set (``class_prior``), "
    "on the\nimbalanced sets",
    NO_VISIT: "Without the visit loss (``visit_weight=0``), on sets where the\n"
    "unlabeled samples cost skassoc accuracy",
}
#: Fraction of the samples held out for testing where a set has no test split.
TEST_SIZE = 0.3
#: Columns of the summary printed after a run.
SUMMARY_HEADER = ["data set", "labels/class", "method", "median accuracy %"]
SUMMARY_HEADER += ["worst draw %", "median fit s"]


class QuietLabelSpreading(LabelSpreading):
    """scikit-learn's LabelSpreading, the same fits and predictions, without
    two warnings that are part of how it works here, not of a failed run.

    Its other parameters keep scikit-learn's defaults, as every method of the
    benchmark does.
    """

    def fit(self, X, y):
        # With alpha=0.8 of the grid, the spreading still moves by more than
        # tol after the default max_iter=30 steps: scikit-learn's default is
        # what the benchmark measures, so its non-convergence is expected.
        with warnings.catch_warnings():
            warnings.filterwarnings(
                "ignore", r"max_iter=\d+ was reached", ConvergenceWarning
            )
            return super().fit(X, y)

    def predict_proba(self, X):
        # A sample whose n_neighbors nearest training samples all lie where no
        # label spread to (a kNN graph of several components, one without
        # labels) gets 0/0 probabilities: NaN, which predict turns into the
        # first class. That is LabelSpreading's answer, scored as it is.
        with np.errstate(invalid="ignore"):
            return super().predict_proba(X)


def _csv(name, first=0):
    """Feature columns from ``first`` and the class (last) of a UCI CSV file."""
    data = np.loadtxt(DATA / "uci" / name, delimiter=",", skiprows=1, quotechar='"')
    return data[:, first:-1], data[:, -1].astype(int)


def _semeion():
    data = np.loadtxt(DATA / "uci" / "semeion.data")
    return data[:, :256], data[:, 256:].argmax(axis=1)


def _mnist():
    if not (DATA / "mnist").is_dir():
        raise FileNotFoundError(DATA / "mnist")
    (X, y), (X_test, y_test) = h.load_mnist_sets(DATA / "mnist")
    return X, y, X_test, y_test


def _synthetic():
    # Colour images of printed digits, at 16x16 pixels so a CPU fit of the
    # default network stays within the suite's time.
    X, y = make_synthetic_digits(5000, image_size=16, random_state=0)
    return np.asarray(X), np.asarray(y)


def _as_signals(values):
    """Signals ``(n, channels, length)`` as skassoc reads them: ``(n,
    channels, 1, length)``, an image one value high."""
    return values[:, :, None, :]


def _ucr_text(name):
    """A UCR set's train and test splits, from whitespace text files whose
    first column is the class and the others a one-channel signal."""
    splits = []
    for split in ("TRAIN", "TEST"):
        data = np.loadtxt(DATA / "signals" / name / f"{name}_{split}.txt")
        splits += [_as_signals(data[:, None, 1:]), data[:, 0].astype(int)]
    return tuple(splits)


def _pooled(splits):
    """The samples of a set's train and test splits together, to re-split."""
    X, y, X_test, y_test = splits
    return np.concatenate([X, X_test]), np.concatenate([y, y_test])


def _arff_signals(path):
    """Signals and classes of an ARFF file of the UEA archive: one relational
    attribute (a quoted line of channels, each a comma-separated list,
    joined by a literal ``\\n``), then the class."""
    lines = Path(path).read_text().splitlines()
    start = next(i for i, line in enumerate(lines) if line.lower() == "@data")
    X, y = [], []
    for line in filter(None, lines[start + 1 :]):
        channels, label = line.rsplit(",", 1)
        rows = channels.strip("'").split("\\n")
        X.append([np.array(row.split(","), dtype=float) for row in rows])
        y.append(label.strip())
    return _as_signals(np.array(X)), np.array(y)


def _ucr_arff(name):
    """A UEA set's train and test splits, from its ARFF files; the classes
    as integers (the baselines mark unlabeled samples with the int -1)."""
    folder = DATA / "signals" / name
    X, y = _arff_signals(folder / f"{name}_TRAIN.arff")
    X_test, y_test = _arff_signals(folder / f"{name}_TEST.arff")
    classes = np.unique(np.concatenate([y, y_test]))
    return X, np.searchsorted(classes, y), X_test, np.searchsorted(classes, y_test)


def _topics(n_docs=10_000, n_classes=20, n_words=20_000, seed=0):
    """A generated text corpus as a sparse TF-IDF matrix, and its topics.

    Each word of a document comes from a Zipf-distributed vocabulary shared
    by all (85 %), from words its group of 4 topics shares (10 %) or from
    its topic's own words (5 %); documents are about 60 words long.
    ``TfidfVectorizer(min_df=2, sublinear_tf=True)`` makes the matrix.
    """
    from sklearn.feature_extraction.text import TfidfVectorizer

    rng = np.random.default_rng(seed)
    zipf = 1 / np.arange(1, n_words + 1) ** 1.1

    def words(k=500):
        chosen = rng.choice(np.arange(50, n_words), k, replace=False)
        return chosen, (1 / np.arange(1, k + 1)) / (1 / np.arange(1, k + 1)).sum()

    groups = [words() for _ in range(n_classes // 4)]
    own = [words() for _ in range(n_classes)]
    y = rng.integers(n_classes, size=n_docs)
    docs = []
    for label, length in zip(y, rng.lognormal(np.log(60), 0.6, n_docs)):
        length = max(5, int(length))
        source = rng.choice(3, length, p=[0.85, 0.10, 0.05])
        drawn = rng.choice(n_words, length, p=zipf / zipf.sum())
        for kind, (pool, weights) in ((1, groups[label % 5]), (2, own[label])):
            picked = source == kind
            drawn[picked] = rng.choice(pool, picked.sum(), p=weights)
        docs.append(" ".join(f"w{w}" for w in drawn))
    vectorizer = TfidfVectorizer(min_df=2, sublinear_tf=True)
    return vectorizer.fit_transform(docs), y


def _synthetic_signals():
    # Six event shapes of random place and duration in noise (a generalised
    # Cylinder-Bell-Funnel), 128 steps, one channel.
    return make_synthetic_signals(1000, n_classes=6, random_state=0)


#: Loaders of ``X, y`` (split by :func:`load`) or ``X, y, X_test, y_test``.
LOADERS = {
    "digits": partial(load_digits, return_X_y=True),
    "breast-cancer": partial(load_breast_cancer, return_X_y=True),
    "wine": partial(load_wine, return_X_y=True),
    "pendigits": partial(_csv, "pendigits.csv", first=1),  # 1st: the row number
    "optdigits": lambda: (*_csv("optdigits.tra"), *_csv("optdigits.tes")),
    "semeion": _semeion,
    "winequality-red": partial(_csv, "winequality-red.csv"),
    "winequality-white": partial(_csv, "winequality-white.csv"),
    "mnist": _mnist,
    "synthetic-digits": _synthetic,
    # Signals, as (n, channels, 1, length) arrays. PigCVP's 6 series a class
    # are pooled and re-split; the others keep the archive's splits.
    "coffee": partial(_ucr_text, "Coffee"),
    "pig-cvp": lambda: _pooled(_ucr_text("PigCVP")),
    "basic-motions": partial(_ucr_arff, "BasicMotions"),
    "synthetic-signals": _synthetic_signals,
    # Text: a sparse TF-IDF matrix (scipy CSR), never densified.
    "topics-tfidf": _topics,
}
#: The data sets in the tables' order; "<set>-8x8" is <set> as 8x8 images.
DATASETS = ("digits", "digits-8x8", "breast-cancer", "wine", "pendigits")
DATASETS += ("optdigits", "optdigits-8x8", "semeion", "semeion-16x16")
DATASETS += ("winequality-red", "winequality-white", "mnist", "synthetic-digits")
DATASETS += ("coffee", "pig-cvp", "basic-motions", "synthetic-signals")
DATASETS += ("topics-tfidf",)
#: Labels per class of the runs (unless --labels names others).
LABELS = (5, 10)
#: Sets whose classes are too small for LABELS: PigCVP keeps 4 or 5 series
#: a class for training, BasicMotions 10; these leave unlabeled ones.
SET_LABELS = {"pig-cvp": (1, 2), "basic-motions": (2, 5)}
#: Methods left out of a set: self-training of the trees on the text's 100
#: SVD components took minutes a fit (20 classes, each iteration refits the
#: trees), for an accuracy below the linear model's in a trial run.
SKIPPED_METHODS = {"topics-tfidf": ("self-training-hgb",)}


def load(name, device):
    """``X, X_test, y, y_test`` of data set ``name``."""
    image = re.fullmatch(r"(.+)-(\d+)x\d+", name)
    data = LOADERS[image[1] if image else name]()
    if len(data) == 2:
        X, X_test, y, y_test = train_test_split(
            *data, test_size=TEST_SIZE, stratify=data[1], random_state=0
        )
    else:
        X, y, X_test, y_test = data
    if name == "mnist" and device == "cpu":
        # A 10,000-image training subset on a CPU, the same for every run.
        keep = np.random.RandomState(0).permutation(len(X))[:10_000]
        X, y = X[keep], y[keep]
    if image:
        side = int(image[2])
        X, X_test = X.reshape(-1, side, side), X_test.reshape(-1, side, side)
    return X, X_test, y, y_test


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


def _flat(X):
    return np.asarray(X, dtype=np.float64).reshape(len(X), -1)


def fit_method(method, X, y_semi, device, draw, spreading, y):
    """``method`` fitted on ``X, y_semi`` (its labeled samples for "-labeled");
    the baselines see flat standardised columns (but for the trees). ``y``
    holds every training label (for the class frequencies of GIVEN_PRIOR)."""
    if method.endswith("-labeled"):
        X, y_semi = X[y_semi != -1], y_semi[y_semi != -1]
    if method.startswith("skassoc"):
        model = SemiSupervisedAssociationClassifier(device=device, random_state=draw)
        if method == GIVEN_PRIOR:
            model.set_params(class_prior=np.unique(y, return_counts=True)[1] / len(y))
        if method == NO_VISIT:
            model.set_params(visit_weight=0.0)
        with warnings.catch_warnings():
            # "-labeled" fits without unlabeled samples on purpose.
            warnings.filterwarnings(
                "ignore", "y holds no unlabeled samples", UserWarning
            )
            return model.fit(X, y_semi)
    if sparse.issparse(X):
        return fit_sparse_baseline(method, X, y_semi, draw, spreading)
    if method == "label-spreading":
        model = [StandardScaler(), QuietLabelSpreading(kernel="knn", **spreading)]
    elif method == "self-training-lr":
        base = make_pipeline(StandardScaler(), LogisticRegression())
        model = [SelfTrainingClassifier(base)]
    elif method == "self-training-hgb":
        base = HistGradientBoostingClassifier(random_state=draw)
        model = [SelfTrainingClassifier(base)]
    else:
        model = [StandardScaler(), MLPClassifier(max_iter=2000, random_state=draw)]
    return make_pipeline(FunctionTransformer(_flat), *model).fit(X, y_semi)


def fit_sparse_baseline(method, X, y_semi, draw, spreading):
    """A baseline on sparse TF-IDF rows, as text is usually fed to it: the
    rows as they are (unit length: their nearest neighbours are those of
    cosine similarity) for the graph, the linear model and the MLP, which
    take sparse input; the trees, which do not, get a 100-component
    TruncatedSVD (latent semantic analysis) in front."""
    if method == "label-spreading":
        model = [QuietLabelSpreading(kernel="knn", **spreading)]
    elif method == "self-training-lr":
        model = [SelfTrainingClassifier(LogisticRegression(max_iter=1000))]
    elif method == "self-training-hgb":
        base = HistGradientBoostingClassifier(random_state=draw)
        model = [TruncatedSVD(100, random_state=0), SelfTrainingClassifier(base)]
    else:
        model = [MLPClassifier(max_iter=2000, random_state=draw)]
    return make_pipeline(*model).fit(X, y_semi)


def tune_spreading(X, X_test, y, y_test, labels_per_class):
    """The grid point of LabelSpreading with the best mean accuracy on TUNING_DRAWS."""

    def accuracy(params):
        scores = []
        for draw in TUNING_DRAWS:
            y_semi = draw_labels(y, labels_per_class, draw)
            model = fit_method("label-spreading", X, y_semi, "cpu", draw, params, y)
            scores.append(model.score(X_test, y_test))
        return float(np.mean(scores))

    return max(SPREADING_GRID, key=accuracy)  # the first of equals


def run_one(name, data, labels, method, draw, spreading, args):
    """Fit and score one run; its JSON record."""
    X, X_test, y, y_test = data
    y_semi = draw_labels(y, labels, draw)
    start = time.perf_counter()
    model = fit_method(method, X, y_semi, args.device, draw, spreading, y)
    seconds = time.perf_counter() - start
    run = dict(dataset=name, labels=labels, method=method, draw=draw)
    run["accuracy"] = float(model.score(X_test, y_test))
    run.update(fit_seconds=round(seconds, 3), n_train=len(y))
    run.update(n_labeled=int((y_semi != -1).sum()), machine=args.machine)
    if method == "label-spreading":
        run["params"] = spreading
    if method.startswith("skassoc"):
        run.update(n_iter=int(model.n_iter_), network=model.network_)
    return run


def run_suite(args):
    """Every run asked for that the JSON does not hold yet, saved after each;
    the results."""
    torch.set_num_threads(1)
    results = {}
    if os.path.exists(args.json):
        results = h.read_results(args.json, results_problem)
        file_device(args.json, results, args.device)
    results.update(device=args.device, torch_threads=torch.get_num_threads())
    results["torch"] = torch.__version__
    machines = results.setdefault("machines", {})
    machines.setdefault(args.machine, h.device_description(torch.device(args.device)))
    runs = results.setdefault("runs", [])
    done = set(map(run_key, runs))
    for name in (name for name in DATASETS if name in (args.only or DATASETS)):
        try:
            data = load(name, args.device)
        except (FileNotFoundError, OSError) as exc:
            print(f"skip {name}: {exc}", file=sys.stderr, flush=True)
            continue
        spreading = {}  # labels per class -> LabelSpreading's parameters
        for labels, method, draw in product(
            possible_labels(name, data[2], args.labels), args.methods, range(args.draws)
        ):
            skipped = method in SKIPPED_METHODS.get(name, ())
            if skipped or (name, labels, method, draw) in done:
                continue
            if method == "label-spreading" and labels not in spreading:
                spreading[labels] = tune_spreading(*data, labels)
            tuned = spreading.get(labels)
            runs.append(run_one(name, data, labels, method, draw, tuned, args))
            done.add((name, labels, method, draw))
            if args.verbose:
                print(progress_line(runs[-1]), file=sys.stderr, flush=True)
            save(args.json, results)
    return results


def possible_labels(name, y, asked=None):
    """The labels per class to run on set ``name`` of training labels ``y``:
    ``asked``, or the set's own (SET_LABELS, else LABELS), less those that
    would label a whole class (with a note on stderr)."""
    smallest = np.unique(y, return_counts=True)[1].min()
    possible = []
    for labels in asked or SET_LABELS.get(name, LABELS):
        if labels < smallest:
            possible.append(labels)
            continue
        print(
            f"skip {name} at {labels} labels/class: its smallest class has "
            f"{smallest} training samples, none would be left unlabeled",
            file=sys.stderr,
            flush=True,
        )
    return possible


def progress_line(run):
    """One finished run, as ``--verbose`` reports it."""
    return (
        f"{run['dataset']}, {run['labels']} labels/class, {run['method']}, draw "
        f"{run['draw']}: accuracy {100 * run['accuracy']:.1f} %, fit "
        f"{run['fit_seconds']:.1f} s"
    )


def save(path, results):
    """Write the results file (a run per few lines, as committed)."""
    h.write_text(path, json.dumps(results, indent=1) + "\n")


#: What every run of a results file holds.
RUN_KEYS = {"dataset", "labels", "method", "draw", "accuracy", "fit_seconds"}


def results_problem(results):
    """What keeps ``results`` from being a results file of this script, or None."""
    runs = results.get("runs")
    if not isinstance(runs, list) or not all(
        isinstance(run, dict) and RUN_KEYS <= run.keys() for run in runs
    ):
        return f'"runs" is not a list of runs with the keys {sorted(RUN_KEYS)}'
    if not isinstance(results.get("device", ""), str):
        return '"device" is not a string'
    if not isinstance(results.get("machines", {}), dict):
        return '"machines" is not a JSON object'
    return None


def file_device(path, results, device=None):
    """The device type ("cpu", "cuda") of the runs in ``results``; a usage
    error if it is not that of ``device`` (one file, one device's runs)."""
    held = results.get("device", device or "cpu").split(":")[0]
    if device is not None and held != device.split(":")[0]:
        raise SystemExit(
            f"error: {path} holds runs on {held}, not {device.split(':')[0]}; one "
            "results file holds the runs of one device. Name another --json, "
            f"or use --device {held}."
        )
    return held


def run_key(run):
    """What names a run: its data set, labels per class, method and draw."""
    return run["dataset"], run["labels"], run["method"], run["draw"]


def merge(paths, device):
    """Join the runs of several results files of one device.

    Parameters
    ----------
    paths : list of path-like
        Results files; their other entries (torch version, ...) are taken
        from the first.
    device : {"cpu", "cuda"}
        The device every file must have run on.

    Returns
    -------
    results : dict
        The first file's entries, every run once and every file's machines.

    Raises
    ------
    ValueError
        If a file ran on another device, or two files hold one run with
        different accuracies (a run fitted twice: GPU fits are not
        bit-reproducible, so which one to keep is not clear).
    """
    merged, machines, results = {}, {}, None
    for path in paths:
        file = h.read_results(path, results_problem)
        if file.get("device", device).split(":")[0] != device:
            raise ValueError(f"{path} holds runs on {file['device']}, not {device}.")
        results = results or file
        machines.update(file.get("machines", {}))
        for run in file["runs"]:
            old = merged.setdefault(run_key(run), run)
            if old["accuracy"] != run["accuracy"]:
                raise ValueError(
                    f"{path} and an earlier file disagree on run {run_key(run)} "
                    f"(accuracy {run['accuracy']} against {old['accuracy']}): "
                    "a run was fitted twice; keep it in one file only."
                )
    return {**results, "machines": machines, "runs": list(merged.values())}


def summarise(runs):
    """(dataset, labels) -> method -> (median accuracy, worst, median seconds)."""
    groups = defaultdict(list)
    for run in runs:
        groups[run["dataset"], run["labels"], run["method"]].append(run)
    table = defaultdict(dict)
    for (dataset, labels, method), group in groups.items():
        accuracy = [r["accuracy"] for r in group]
        median = statistics.median(accuracy)
        seconds = statistics.median(r["fit_seconds"] for r in group)
        table[dataset, labels][method] = median, min(accuracy), seconds
    return table


def asked_runs(runs, args):
    """The runs of the data sets, label counts, methods and draws that
    ``args`` names (None or empty: any)."""
    wanted = {
        "dataset": args.only,
        "labels": args.labels,
        "method": args.methods,
        "draw": args.draws and range(args.draws),
    }
    return [run for run in runs if all(not v or run[k] in v for k, v in wanted.items())]


def summary(runs, methods=None):
    """The plain-text table printed after a run: a row per data set, label
    count and method, the methods in the order of ``methods`` (default:
    METHODS, then VARIANTS)."""
    table = summarise(runs)
    methods = methods or (*METHODS, *VARIANTS)
    rows = []
    for dataset, labels in _in_order(table):
        cells = table[dataset, labels]
        for method in (m for m in dict.fromkeys(methods) if m in cells):
            median, worst, seconds = cells[method]
            rows.append([dataset, labels, method, f"{100 * median:.1f}"])
            rows[-1] += [f"{100 * worst:.1f}", f"{seconds:.2f}"]
    return h.text_table(SUMMARY_HEADER, rows)


def _in_order(table):
    """The (dataset, labels) rows of ``table`` in the tables' order."""
    return sorted(table, key=lambda key: (DATASETS.index(key[0]), key[1]))


def _shown(median):
    """A median accuracy in % as the tables show it: medians equal as shown
    are ties (a small test set's medians differ by fractions of a sample)."""
    return round(100 * median, 1)


def _grid(table, methods):
    """The rst grid of ``methods``' cells, the best median of a row in bold."""
    rows = []
    for dataset, labels in _in_order(table):
        cells = {m: cell for m, cell in table[dataset, labels].items() if m in methods}
        if not cells:
            continue
        best = max(_shown(median) for median, _, _ in cells.values())
        rows.append([dataset, str(labels)])
        for method in methods:
            if method not in cells:
                rows[-1].append("")
                continue
            median, worst, seconds = cells[method]
            text = f"{100 * median:.1f} ({100 * worst:.1f}) {seconds:.1f}s"
            rows[-1].append(f"**{text}**" if _shown(median) == best else text)
    return h.rst_table(["data set", "labels/class", *methods], rows, False, " ")


def _variant_grid(table, device, variant):
    """skassoc, skassoc-labeled and ``variant``, on the rows where it ran."""
    ran = {k: v for k, v in table.items() if variant in v and "skassoc" in v}
    if not ran:
        return ""
    sets = " ".join(dict.fromkeys(dataset for dataset, _ in sorted(ran)))
    return f"""

{VARIANTS[variant]}; the same cells. Made by ``python
benchmarks/bench_defaults.py --device {device} --methods {variant}
--only {sets}``:

{_grid(ran, ("skassoc", "skassoc-labeled", variant))}"""


def _behind_grid(runs, table):
    """The rows where another method has a higher median than skassoc, with
    how often each of the two was ahead on the same label draw."""
    accuracy = defaultdict(dict)  # (dataset, labels, method) -> draw -> accuracy
    for run in runs:
        key = run["dataset"], run["labels"], run["method"]
        accuracy[key][run["draw"]] = run["accuracy"]
    rows = []
    for dataset, labels in _in_order(table):
        cells = table[dataset, labels]
        shown = {m: _shown(cells[m][0]) for m in METHODS if m in cells}
        if "skassoc" not in shown or max(shown.values()) == shown["skassoc"]:
            continue
        best = max(shown, key=shown.get)  # the first of equals in METHODS order
        ours = accuracy[dataset, labels, "skassoc"]
        theirs = accuracy[dataset, labels, best]
        pairs = [(ours[d], theirs[d]) for d in ours if d in theirs]
        counts = [sum(a > b for a, b in pairs), sum(a == b for a, b in pairs)]
        counts.append(sum(a < b for a, b in pairs))
        rows.append(
            [dataset, labels, best, f"{100 * cells[best][0]:.1f}"]
            + [f"{100 * cells['skassoc'][0]:.1f}", " / ".join(map(str, counts))]
        )
    if not rows:
        return ""
    header = ["data set", "labels/class", "higher median", "its median"]
    header += ["skassoc's", "draws skassoc ahead / level / behind"]
    return f"""

The rows where another method's median is higher than skassoc's, and on
how many of the same label draws skassoc was ahead of it, level and behind:

{h.rst_table(header, rows, False, " ")}"""


def _draws_text(runs):
    """How many label draws most cells have, and a sentence on the others."""
    draws = Counter((r["dataset"], r["labels"], r["method"]) for r in runs)
    usual = Counter(draws.values()).most_common(1)[0][0] if draws else 0
    other = [
        f"{m}, {d}, {n} labels/class: {k}"
        for (d, n, m), k in sorted(draws.items())
        if k != usual
    ]
    other = f" Cells with other counts of draws: {'; '.join(other)}." if other else ""
    return usual, other


def render(runs, device):
    """Every method's cells, the best median of a row in bold."""
    table = summarise(runs)
    grid = _grid(table, METHODS)
    draws, other_draws = _draws_text(runs)
    variants = "".join(_variant_grid(table, device, v) for v in VARIANTS)
    return f"""\
.. rubric:: Default parameters on {"one GPU" if device == "cuda" else "a CPU"}

Median test accuracy in % over {draws} label draws (worst draw in
parentheses) and median fit seconds, one torch thread; the best
median of each row in bold. Made by ``python benchmarks/bench_defaults.py
--device {device}``.{other_draws}

{grid}{_behind_grid(runs, table)}{variants}"""


def parse_args(argv=None):
    parser = h.make_parser(__doc__.splitlines()[0], "defaults", cases=False)
    add = parser.add_argument
    draws = h.bounded_int(1, h.MAX_DRAWS)
    add("--draws", type=draws, help=f"label draws of each data set (default {DRAWS})")
    names = ", ".join(DATASETS)
    add(
        "--only",
        nargs="*",
        choices=DATASETS,
        metavar="SET",
        help=f"default all: {names}",
    )
    labels = h.bounded_int(1)
    default = f"default {' '.join(map(str, LABELS))}; " + ", ".join(
        f"{name} {' '.join(map(str, counts))}" for name, counts in SET_LABELS.items()
    )
    add("--labels", type=labels, nargs="+", help=f"labels per class ({default})")
    methods = ", ".join(METHODS)
    text = f"default: {methods}; also {', '.join(VARIANTS)}"
    add("--methods", nargs="*", choices=(*METHODS, *VARIANTS), metavar="M", help=text)
    add("--machine", default=platform.node(), help="name of this machine in the runs")
    add("--merge", nargs="+", metavar="JSON", help="write these files' runs to --json")
    add("--no-save", action="store_true", help="keep no files (a temporary folder)")
    add("-v", "--verbose", action="store_true", help="a line per run on stderr")
    args = h.parse(parser, argv)
    if args.merge and args.device not in ("cpu", "cuda"):
        parser.error("--merge needs --device cpu or cuda: the files' device")
    given = args.json_given or args.table_given or args.render_only
    if args.no_save and given:
        parser.error(
            "--no-save runs in a temporary folder and keeps nothing: leave out "
            "--json, --table, --merge and --render-only, or leave out --no-save"
        )
    if not (args.merge or args.render_only):
        # Running: what is asked for, the defaults filled in.
        args.methods = args.methods or list(METHODS)
        args.draws = args.draws or DRAWS
    return args


def main(argv=None):
    """Run, merge or render as ``argv`` asks; write the results and the docs'
    table, and print the summary of the runs asked for."""
    args = parse_args(argv)
    if not args.no_save:
        return _main(args)
    with tempfile.TemporaryDirectory(prefix="skassoc-bench-") as folder:
        args.json = str(Path(folder) / Path(args.json).name)
        args.table = str(Path(args.json).with_suffix(".rst"))
        return _main(args)


def _main(args):
    # The device named, if any: "auto" is whatever the file holds.
    named = None if args.device == "auto" else args.device
    if args.merge:
        results = merge(args.merge, args.device)
        save(args.json, results)
    elif args.render_only:
        results = h.read_results(args.json, results_problem)
    else:
        args.device = named = str(h.resolve_device(args.device))
        results = run_suite(args)
    device = file_device(args.json, results, named)
    h.write_text(args.table, render(results["runs"], device) + "\n")
    if args.verbose and not args.no_save:
        json_path, table = h.shown_path(args.json), h.shown_path(args.table)
        print(f"results {json_path}, table {table}", file=sys.stderr)
    print(summary(asked_runs(results["runs"], args), args.methods))
    return results


if __name__ == "__main__":
    main()

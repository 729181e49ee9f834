"""As many more labels as classes on the defaults suite: suggested or random.

Each run fits the default estimator on a data set of
``benchmarks/bench_defaults.py`` (its first labels-per-class level, label
draw ``d``, ``random_state=d``), then adds the labels of as many more
samples as the set has classes, chosen by each strategy, and fits again:

- ``association``: ``suggest_labels`` on the first fit;
- ``random``: unlabeled training samples at random (seeded by the draw).

The gain of a strategy is its refit's test accuracy minus the first fit's.
Results go to ``benchmarks/results/label_suggestions_cpu.json`` (runs
already there are kept and skipped) and the table to
``label_suggestions_cpu.rst``::

    python benchmarks/bench_label_suggestions.py --draws 10 --jobs 2 \\
        --only wine breast-cancer winequality-red digits semeion
    python benchmarks/bench_label_suggestions.py --render-only

With ``--warm-start`` each refit is the user guide's loop instead of a new
fit: the first fit continued with the new labels (``warm_start=True``), or
a new fit where the continued fit's report is suspect. A results file
holds refits of one kind (its meta says which).

With ``--seed-noise`` each draw is fitted twice instead, with the same
labels and seeds ``d`` and ``d + 1000``: how far a refit moves without any
new label, the noise the strategies' gains are read against (a second
table, for the sets measured).
``--title`` gives the first table a heading of its own (kept in the file).
"""

import argparse
import concurrent.futures
import copy
import functools
import multiprocessing
import sys
import time
import warnings

import _harness as h
import bench_defaults as suite
import numpy as np

STRATEGIES = ("association", "random")
SCRIPT = "benchmarks/bench_label_suggestions.py"
#: The first table's title, unless the results' meta gives its own.
TITLE = "As many more labels as classes: suggested or random?"
#: The seed of ``--seed-noise``'s second fit of draw ``d``: ``d`` plus this.
SEED_OFFSET = 1000


def pick(strategy, clf, X, y_semi, n, draw):
    """``n`` indices of unlabeled training samples chosen by ``strategy``."""
    if strategy == "association":
        return clf.suggest_labels(X, n, y=y_semi, random_state=draw)
    unlabeled = np.flatnonzero(y_semi == -1)
    return np.random.default_rng(draw).choice(unlabeled, n, replace=False)


def fit_default(X, y_semi, draw):
    from skassoc import SemiSupervisedAssociationClassifier

    clf = SemiSupervisedAssociationClassifier(device="cpu", random_state=draw)
    with warnings.catch_warnings():
        # The report's verdict is recorded, not shown.
        warnings.filterwarnings("ignore", "fit_report_ finds this fit suspect")
        return clf.fit(X, y_semi)


def refit_default(clf, X, y_more, draw, warm):
    """A new fit with ``y_more``, or with ``warm`` the user guide's loop: the
    fit ``clf`` continued on a copy, or a new fit where the continued one's
    report is suspect. Returns the refit and whether it is a new fit."""
    if warm:
        more = copy.deepcopy(clf).set_params(warm_start=True)
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", "fit_report_ finds this fit suspect")
            more.fit(X, y_more)
        if more.fit_report_.verdict != "suspect":
            return more, False
    return fit_default(X, y_more, draw), True


def _first_level(name):
    """The set's first labels-a-class level that leaves every class unlabeled
    samples (None, with a note on stderr, when none does)."""
    levels = suite.possible_labels(name, suite.load(name, "cpu")[2])
    return levels[0] if levels else None


#: Thread pools held to one thread in each process of --jobs, which share
#: the machine's cores: set in the environment before the processes start,
#: so that every library (torch, k-means's OpenMP, BLAS) starts with one.
ONE_THREAD = {
    name: "1" for name in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS")
}


def _pool(jobs):
    """``jobs`` spawned processes of one thread each."""
    import os

    os.environ.update(ONE_THREAD)
    context = multiprocessing.get_context("spawn")
    return concurrent.futures.ProcessPoolExecutor(jobs, mp_context=context)


def _draw_data(name, draw):
    """``X, X_test, y, y_test, y_semi, labels`` of draw ``draw`` of ``name``
    (``labels``: labels a class)."""
    X, X_test, y, y_test = suite.load(name, "cpu")
    labels = suite.possible_labels(name, y)[0]  # main kept sets that have one
    return X, X_test, y, y_test, suite.draw_labels(y, labels, draw), labels


def run_seed_noise(job):
    """Two fits of one draw with the same labels and two seeds; its record."""
    name, draw = job
    X, X_test, y, y_test, y_semi, labels = _draw_data(name, draw)
    start = time.perf_counter()
    accuracies = [
        float(fit_default(X, y_semi, seed).score(X_test, y_test))
        for seed in (draw, draw + SEED_OFFSET)
    ]
    return {
        "dataset": name,
        "labels": labels,
        "draw": draw,
        "accuracies": accuracies,
        "seconds": round(time.perf_counter() - start, 1),
    }


def run_draw(job, warm=False):
    """The first fit of one draw and a refit per strategy (``warm``: see
    :func:`refit_default`); its JSON record."""
    name, draw = job
    X, X_test, y, y_test, y_semi, labels = _draw_data(name, draw)
    n_more = len(np.unique(y))
    start = time.perf_counter()
    clf = fit_default(X, y_semi, draw)
    run = {
        "dataset": name,
        "labels": labels,
        "draw": draw,
        "accuracy": float(clf.score(X_test, y_test)),
        "verdict": clf.fit_report_.verdict,
        "refits": {},
    }
    for strategy in STRATEGIES:
        extra = pick(strategy, clf, X, y_semi, n_more, draw)
        y_more = y_semi.copy()
        y_more[extra] = y[extra]
        refit, anew = refit_default(clf, X, y_more, draw, warm)
        run["refits"][strategy] = {
            "accuracy": float(refit.score(X_test, y_test)),
            "picked_classes": np.unique(y[extra]).size,
            "new_fit": anew,
        }
    run["seconds"] = round(time.perf_counter() - start, 1)
    return run


def _progress(run):
    if "accuracies" in run:
        first, second = (f"{100 * a:.1f} %" for a in run["accuracies"])
        return (
            f"{run['dataset']} draw {run['draw']}: {first}, another seed "
            f"{second} ({run['seconds']} s)"
        )
    gains = " ".join(
        f"{s} {100 * (r['accuracy'] - run['accuracy']):+.1f}"
        for s, r in run["refits"].items()
    )
    return (
        f"{run['dataset']} draw {run['draw']}: {100 * run['accuracy']:.1f} % "
        f"({run['verdict']}); gain {gains} ({run['seconds']} s)"
    )


def _gains(runs):
    """Each strategy's gains in points over the first fit, run by run."""
    return {
        s: [100 * (r["refits"][s]["accuracy"] - r["accuracy"]) for r in runs]
        for s in STRATEGIES
    }


def _paired(runs):
    """Per run: the suggested refit's gain less the random one's, in points."""
    gains = _gains(runs)
    return [a - b for a, b in zip(gains["association"], gains["random"])]


def _datasets(runs):
    """The data sets of ``runs``, in the suite's order."""
    return [n for n in suite.DATASETS if any(r["dataset"] == n for r in runs)]


def summary_rows(runs):
    """Per data set: the median gain of each strategy, the median of the
    paired differences (same draw), how often the suggested labels were
    ahead, level and behind, and how many classes each strategy's picks
    covered (median)."""
    rows = []
    for name in _datasets(runs):
        mine = [r for r in runs if r["dataset"] == name]
        gains, paired = _gains(mine), _paired(mine)
        ahead, behind = sum(d > 0 for d in paired), sum(d < 0 for d in paired)
        covered = [
            h.fmt(float(np.median([r["refits"][s]["picked_classes"] for r in mine])), 1)
            for s in STRATEGIES
        ]
        rows.append(
            [
                name,
                str(mine[0]["labels"]),
                str(len(mine)),
                h.fmt(float(np.median([100 * r["accuracy"] for r in mine])), 1),
                *(h.fmt(float(np.median(gains[s])), 1) for s in STRATEGIES),
                h.fmt(float(np.median(paired)), 1),
                f"{ahead} / {len(paired) - ahead - behind} / {behind}",
                " / ".join(covered),
            ]
        )
    return rows


def render(results):
    """The strategies' table, then the seed-noise table (each when measured)."""
    parts = []
    if results["runs"]:
        parts.append(strategies_table(results))
    if results.get("seed_noise", {}).get("runs"):
        parts.append(seed_noise_table(results))
    return "\n".join(parts)


def strategies_table(results):
    table = h.rst_table(
        [
            "data set",
            "labels/class, first fit",
            "draws",
            "first fit accuracy %",
            "gain: suggested",
            "gain: random",
            "paired difference",
            "suggested ahead / level / behind",
            "classes picked: suggested / random",
        ],
        summary_rows(list(results["runs"].values())),
    )
    refit = results["meta"].get("refit")
    how = ""
    if refit == h.LOOP_REFIT:
        refits = [f for r in results["runs"].values() for f in r["refits"].values()]
        anew = sum(f.get("new_fit", False) for f in refits)
        how = (
            "; each refit continues the first fit (``warm_start=True``), or fits "
            "a new network where the continued fit's report is suspect (the user "
            f"guide's loop: {anew} of {len(refits)} refits did)"
        )
    return (
        f".. rubric:: {results['meta'].get('title', TITLE)}\n\n"
        "The default estimator on sets of the defaults suite, fitted, then "
        "refitted with the labels of as many more training samples as the set "
        f"has classes, picked by ``suggest_labels`` or at random{how}. Gains are in "
        "accuracy points over the first fit, medians over the draws; the "
        "paired difference is the median over the draws of the suggested "
        "refit's gain less the random one's (same draw, same seed); the last "
        "column gives how many classes a draw's picks covered (median). Made "
        f"by {h.commands_text(results['meta'])} on a CPU, one thread a process.\n\n"
        f"{table}\n"
    )


def seed_noise_rows(results):
    """Per data set of ``--seed-noise``: how far the second seed's fit lands
    from the first (median and largest, in points); beside it, the median
    size of the first table's per-draw differences between the strategies,
    and how many seed-``d`` fits gave the first table's first-fit accuracy."""
    noise = list(results["seed_noise"]["runs"].values())
    runs = list(results["runs"].values())
    rows = []
    for name in _datasets(noise):
        mine = [r for r in noise if r["dataset"] == name]
        changes = [100 * abs(r["accuracies"][1] - r["accuracies"][0]) for r in mine]
        first = {r["draw"]: r["accuracy"] for r in runs if r["dataset"] == name}
        both = [r for r in mine if r["draw"] in first]
        paired = _paired([r for r in runs if r["dataset"] == name])
        rows.append(
            [name, str(len(mine))]
            + [h.fmt(float(np.median(changes)), 1), h.fmt(max(changes), 1)]
            + [h.fmt(float(np.median(np.abs(paired))), 1) if paired else "none"]
            + [
                f"{sum(r['accuracies'][0] == first[r['draw']] for r in both)}"
                f" / {len(both)}"
            ]
        )
    return rows


def seed_noise_table(results):
    header = ["data set", "draws", "change: median", "change: largest"]
    header += ["first table: suggested less random, median size"]
    header += ["first fit reproduced"]
    return (
        "\n.. rubric:: Defaults suite: the same labels, another seed\n\n"
        "How far a fit moves when only its seed changes: each draw fitted with "
        f"the same labels and seeds d and d + {SEED_OFFSET}, the change of test "
        "accuracy in points (its size). Beside it, the median size of the "
        "first table's per-draw difference between the suggested and the "
        "random refit, and how many of the seed-d fits gave the first "
        "table's first-fit accuracy exactly (the two tables' fits may come "
        "from different machines and PyTorch builds, which round "
        "differently; the JSON records both). Made by "
        f"{h.commands_text(results['seed_noise']['meta'])} on a CPU, one thread a "
        f"process.\n\n{h.rst_table(header, seed_noise_rows(results))}\n"
    )


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", nargs="+", default=None, choices=suite.DATASETS)
    parser.add_argument("--draws", type=int, default=10)
    parser.add_argument("--jobs", type=int, default=1, help="processes")
    parser.add_argument(
        "--json", default=str(h.RESULTS_DIR / "label_suggestions_cpu.json")
    )
    parser.add_argument("--table", default=None, help="default: the JSON's .rst")
    parser.add_argument("--render-only", action="store_true")
    parser.add_argument("--title", help="the first table's title, kept in --json")
    parser.add_argument(
        "--seed-noise",
        action="store_true",
        help="fit each draw with two seeds and the same labels instead",
    )
    parser.add_argument(
        "--warm-start",
        action="store_true",
        help="refit as the user guide's loop does: continue the first fit",
    )
    args = parser.parse_args(argv)
    if args.warm_start and args.seed_noise:
        parser.error("--seed-noise fits without refits: it takes no --warm-start")
    results = h.runs_file(parser, args.json, args.render_only)
    held = results.get("meta", {}).get("refit", "new fit") if results["runs"] else None
    asked = h.LOOP_REFIT if args.warm_start else "new fit"
    if not args.render_only and not args.seed_noise and held not in (None, asked):
        parser.error(
            f"{args.json} holds refits of another kind ({held}); pass another "
            "--json for refits of this one"
        )
    h.keep_titles(args.json, results, {"title": args.title})
    if not args.render_only:
        given = sys.argv[1:] if argv is None else argv
        _measure(args, results, h.command_line(SCRIPT, given, python=True))
    table = render(results)
    h.write_text(args.table or h.Path(args.json).with_suffix(".rst"), table)
    print(table)


def _measure(args, results, command):
    """The runs asked for and missing from ``results``, written as they end.

    The seed-noise fits keep their own ``meta`` (machine and commands) in
    their section: the strategies' runs may come from another machine.
    """
    import torch

    section = results
    if args.seed_noise:
        section = results.setdefault("seed_noise", {"runs": {}})
    done = section["runs"]
    names = [n for n in args.only or suite.DATASETS if _first_level(n)]
    jobs = [(n, d) for n in names for d in range(args.draws) if f"{n}/{d}" not in done]
    if not jobs:
        return  # nothing run: the file's machines and commands stay
    meta = h.extended_meta(section.get("meta", {}), torch.device("cpu"), command)
    section["meta"] = meta
    work = run_seed_noise
    if not args.seed_noise:
        meta["refit"] = h.LOOP_REFIT if args.warm_start else "new fit"
        work = functools.partial(run_draw, warm=args.warm_start)
    with _pool(args.jobs) as pool:
        for run in pool.map(work, jobs):
            done[f"{run['dataset']}/{run['draw']}"] = run
            print(_progress(run), flush=True)
            h.write_json(args.json, results)  # after each: a run resumes


if __name__ == "__main__":
    main()

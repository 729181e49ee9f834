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
"""

import argparse
import concurrent.futures
import multiprocessing
import sys
import time
import warnings

import _harness as h
import bench_defaults as suite
import numpy as np

STRATEGIES = ("association", "random")


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


def _first_level(name):
    """The set's first labels-a-class level that leaves every class unlabeled
    samples (None, with a note on stderr, when none does)."""
    levels = suite.possible_labels(name, suite.load(name, "cpu")[2])
    return levels[0] if levels else None


def run_draw(job):
    """The first fit of one draw and a refit per strategy; its JSON record."""
    import torch
    from threadpoolctl import threadpool_limits

    # One thread a process for torch and for k-means's OpenMP alike: --jobs
    # processes share the machine's cores.
    torch.set_num_threads(1)
    threadpool_limits(1)
    name, draw = job
    X, X_test, y, y_test = suite.load(name, "cpu")
    labels = suite.possible_labels(name, y)[0]  # main kept sets that have one
    y_semi = suite.draw_labels(y, labels, draw)
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
        refit = fit_default(X, y_more, draw)
        run["refits"][strategy] = {
            "accuracy": float(refit.score(X_test, y_test)),
            "picked_classes": np.unique(y[extra]).size,
        }
    run["seconds"] = round(time.perf_counter() - start, 1)
    return run


def _progress(run):
    gains = " ".join(
        f"{s} {100 * (r['accuracy'] - run['accuracy']):+.1f}"
        for s, r in run["refits"].items()
    )
    return (
        f"{run['dataset']} draw {run['draw']}: {100 * run['accuracy']:.1f} % "
        f"({run['verdict']}); gain {gains} ({run['seconds']} s)"
    )


def summary_rows(runs):
    """Per data set: the median gain of each strategy, the median of the
    paired differences (same draw), how often the suggested labels were
    ahead, level and behind, and how many classes each strategy's picks
    covered (median)."""
    rows = []
    for name in [n for n in suite.DATASETS if any(r["dataset"] == n for r in runs)]:
        mine = [r for r in runs if r["dataset"] == name]
        gains = {
            s: [100 * (r["refits"][s]["accuracy"] - r["accuracy"]) for r in mine]
            for s in STRATEGIES
        }
        paired = [a - b for a, b in zip(gains["association"], gains["random"])]
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
    runs = list(results["runs"].values())
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
        summary_rows(runs),
    )
    commands = " and ".join(f"``{c}``" for c in results["meta"]["commands"])
    return (
        ".. rubric:: As many more labels as classes: suggested or random?\n\n"
        "The default estimator on sets of the defaults suite, fitted, then "
        "refitted with the labels of as many more training samples as the set "
        "has classes, picked by ``suggest_labels`` or at random. Gains are in "
        "accuracy points over the first fit, medians over the draws; the "
        "paired difference is the median over the draws of the suggested "
        "refit's gain less the random one's (same draw, same seed); the last "
        "column gives how many classes a draw's picks covered (median). Made "
        f"by {commands} on a CPU, one thread a process.\n\n{table}\n"
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
    args = parser.parse_args(argv)
    results = h.load_json(args.json) if h.Path(args.json).exists() else {"runs": {}}
    if not args.render_only:
        import torch

        done = results["runs"]
        names = [n for n in args.only or suite.DATASETS if _first_level(n)]
        jobs = [
            (n, d) for n in names for d in range(args.draws) if f"{n}/{d}" not in done
        ]
        command = " ".join(
            ["python benchmarks/bench_label_suggestions.py", *sys.argv[1:]]
        )
        commands = results.get("meta", {}).get("commands", [])
        environment = h.environment(torch.device("cpu"))
        results["meta"] = {**environment, "commands": [*commands, command]}
        context = multiprocessing.get_context("spawn")
        with concurrent.futures.ProcessPoolExecutor(
            args.jobs, mp_context=context
        ) as pool:
            for run in pool.map(run_draw, jobs):
                done[f"{run['dataset']}/{run['draw']}"] = run
                print(_progress(run), flush=True)
                h.write_json(args.json, results)  # after each: a run resumes
    table = render(results)
    h.write_text(args.table or h.Path(args.json).with_suffix(".rst"), table)
    print(table)


if __name__ == "__main__":
    main()

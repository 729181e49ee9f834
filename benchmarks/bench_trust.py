"""Can a user trust a few-label fit? ``fit_report_`` and ``suggest_labels`` on MNIST.

Each run fits a recipe on MNIST with 10 labels a class (label draw ``d``,
``random_state=d``), records its test error and ``fit_report_``, and, when
the error is above ``--failing-above`` (or with ``--suggest-all``), adds 10
labels chosen by each strategy to the training labels and fits again:

- ``association``: ``suggest_labels`` (the association graph's regions);
- ``random``: 10 unlabeled samples at random;
- ``margin`` and ``entropy``: the classic uncertainty strategies on the
  fit's probabilities (modAL's ``margin_sampling`` / ``entropy_sampling``).

Each refit is a new fit (``--refits new``, the default), or continues from
the fit's weights (``--refits warm``: ``warm_start=True``, a new run of
``max_iter`` steps), or both; a warm refit's strategy is recorded as
``"<strategy>, warm start"``.

``--title`` and ``--refit-title`` give a file's tables headings of their
own (kept in the file), for pages that show several files. ``--pool``
fits nothing: it pools the refits of several results files into the table
of ``--json``.

Runs spread over the GPUs of ``--gpus`` (a process each). Results go to
``benchmarks/results/trust_<device>.json`` (runs already there are kept and
skipped, whatever strategies and refits they hold) and the table to
``trust_<device>.rst``::

    python benchmarks/bench_trust.py --device cuda --gpus 0,1,2,3 \\
        --recipes fast --draws 0-39
    python benchmarks/bench_trust.py --device cuda --gpus 0,1,2,3 \\
        --recipes consistency --draws 2,3,17,27,30,33,36 \\
        --strategies association random
    python benchmarks/bench_trust.py --device cuda --recipes fast \\
        --draws 2,3,17 --strategies association random --refits new warm \\
        --json benchmarks/results/trust_warm_cuda.json
    python benchmarks/bench_trust.py --render-only
    python benchmarks/bench_trust.py --pool \\
        benchmarks/results/trust_warm_cuda.json \\
        benchmarks/results/trust_warm_held_out_cuda.json --json /tmp/pooled.json
"""

import argparse
import concurrent.futures
import copy
import math
import multiprocessing
import sys
import time
from collections import Counter

import _harness as h
import numpy as np

from skassoc._diagnosis import (
    FREQUENT_CLASS_MARGIN,
    is_suspect,
    largest_excess,
    share_excess,
)

#: Strategies a failing draw is refitted with.
STRATEGIES = ("association", "random", "margin", "entropy")
#: How a refit starts: a new network, or the fit's weights (``warm_start``).
REFITS = ("new", "warm")
#: Extra labels each strategy picks.
EXTRA_LABELS = 10
#: Test error (%) above which a draw counts as failing (the issue's line).
FAILING_ABOVE = 1.5


def parse_draws(text):
    draws = []
    for part in text.split(","):
        first, _, last = part.partition("-")
        draws += range(int(first), int(last or first) + 1)
    return draws


def pick(strategy, clf, X, y_semi, seed):
    """``EXTRA_LABELS`` indices of unlabeled samples chosen by ``strategy``."""
    unlabeled = np.flatnonzero(y_semi == -1)
    rng = np.random.default_rng(seed)
    if strategy == "association":
        return clf.suggest_labels(X, EXTRA_LABELS, y=y_semi, random_state=seed)
    if strategy == "random":
        return rng.choice(unlabeled, EXTRA_LABELS, replace=False)
    proba = clf.predict_proba(X[unlabeled])
    if strategy == "margin":
        top = np.sort(proba, axis=1)
        score = -(top[:, -1] - top[:, -2])
    else:
        score = -np.sum(proba * np.log(np.clip(proba, 1e-12, None)), axis=1)
    return unlabeled[np.argsort(-score, kind="stable")[:EXTRA_LABELS]]


def refit_key(strategy, refit):
    """The name a refit is recorded under."""
    return strategy if refit == "new" else f"{strategy}, warm start"


def fit_one(params, X, y_semi, X_test, y_test, start_from=None):
    """Fit a new estimator of ``params``, or continue a copy of
    ``start_from``'s fit (with its own parameters: ``params`` is unused)."""
    from skassoc import SemiSupervisedAssociationClassifier

    if start_from is None:
        clf = SemiSupervisedAssociationClassifier(**params)
    else:
        # A copy: each strategy's warm refit starts from the same fit.
        clf = copy.deepcopy(start_from).set_params(warm_start=True)
    start = time.perf_counter()
    clf.fit(X, y_semi)
    seconds = time.perf_counter() - start
    return clf, seconds, h.error_percent(clf.predict(X_test), y_test)


def run_draw(job, data, device, args):
    """Fit one draw; refit with each strategy's labels when it fails."""
    import warnings

    from skassoc import recipe_params
    from skassoc.datasets import make_semi_supervised_labels

    recipe, draw = job
    (X, y), (X_test, y_test) = data
    y_semi = make_semi_supervised_labels(y, 10, random_state=draw)
    params = {**recipe_params(recipe), "device": device, "random_state": draw}
    if args.max_iter is not None:  # a smoke test's
        params.update(max_iter=args.max_iter, lr_warmup_steps=0, compile=False)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        clf, seconds, error = fit_one(params, X, y_semi, X_test, y_test)
    run = {
        "recipe": recipe,
        "draw": draw,
        "precision": h.resolved_precision(params, device, images=True),
        "test_error_percent": error,
        "fit_seconds": seconds,
        "fit_report": clf.fit_report_.to_dict(),
        "warned": any("fit_report_" in str(w.message) for w in caught),
        "refits": {},
    }
    if error > args.failing_above or args.suggest_all:
        for strategy in args.strategies:
            extra = pick(strategy, clf, X, y_semi, seed=draw)
            y_more = y_semi.copy()
            y_more[extra] = y[extra]
            for refit in args.refits:
                start_from = clf if refit == "warm" else None
                with warnings.catch_warnings(record=True) as caught:
                    warnings.simplefilter("always")
                    refitted, seconds, refit_error = fit_one(
                        params, X, y_more, X_test, y_test, start_from
                    )
                run["refits"][refit_key(strategy, refit)] = {
                    "test_error_percent": refit_error,
                    "fit_seconds": seconds,
                    "picked_classes": y[extra].tolist(),
                    "verdict": refitted.fit_report_.verdict,
                    # What the refit and its test predictions warned of (a
                    # collapsed fit's ConvergenceWarning, the report's own).
                    "warnings": sorted({w.category.__name__ for w in caught}),
                }
    return run


def run_jobs(gpu, jobs, args):
    """One process's share of the runs, on ``cuda:gpu`` (or the CPU)."""
    import torch

    device = "cpu" if gpu is None else f"cuda:{gpu}"
    if gpu is None:
        torch.set_num_threads(1)
    (X, y), test = h.load_mnist_sets(args.data_home)
    data = (X[: args.train_subset], y[: args.train_subset]), test
    runs = []
    for job in jobs:
        runs.append(run_draw(job, data, device, args))
        print(_progress(runs[-1]), flush=True)
    return runs


def _progress(run):
    refits = " ".join(
        f"{k} {v['test_error_percent']:.2f}" for k, v in run["refits"].items()
    )
    report = run["fit_report"]
    return (
        f"{run['recipe']} draw {run['draw']}: {run['test_error_percent']:.2f} % "
        f"({report['verdict']}, excess "
        f"{report['scores']['class_share_excess']:.4f}) {refits}"
    )


def run_all(args, jobs):
    gpus = [None] if args.device == "cpu" else args.gpus
    context = multiprocessing.get_context("spawn")
    with concurrent.futures.ProcessPoolExecutor(len(gpus), mp_context=context) as pool:
        shares = [
            pool.submit(run_jobs, gpu, jobs[k :: len(gpus)], args)
            for k, gpu in enumerate(gpus)
        ]
        return [run for share in shares for run in share.result()]


# ------------------------------------------------------------------ tables

SCORES = (
    "class_share_excess",
    "class_share_z",
    "low_visit_share",
    "round_trip_change",
    "excess_class_low_visit",
    "excess_class_input_disagreement",
)


def roc_auc(failing, good):
    """Probability that a failing draw scores above a good one (ties half)."""
    if not failing or not good:
        return float("nan")
    wins = sum((f > g) + 0.5 * (f == g) for f in failing for g in good)
    return wins / (len(failing) * len(good))


#: The diagnosis table's title, unless the results' meta gives its own
#: (a page that shows two files' tables needs two).
DIAGNOSIS_TITLE = "Does ``fit_report_`` flag the failed fits?"
#: The refits table's title, unless the results' meta gives its own.
REFIT_TITLE = "Refitted with 10 more labels"
#: What the refits table says of its warm-start rows, where it has them.
WARM_NOTE = (
    'Rows "..., warm start": the same labels, the refit continuing the '
    "draw's fit (``warm_start=True``) instead of training a new network. "
)
#: What the refits tables say of the recommended refit's rows, where they
#: have them.
RECOMMENDED_NOTE = (
    'Rows "..., a new fit if suspect": the loop the user guide recommends, '
    'the warm start or, where its verdict is "suspect", the new fit of the '
    "same labels (how many draws took the new fit, in parentheses), over "
    "the draws whose warm start has a verdict (runs made before the script "
    "recorded it have none). "
)
#: Thresholds of class_share_ratio shown beside the verdict's own.
RATIO_THRESHOLDS = (1.125, 1.15)


def _flags(runs, rule):
    return f"{sum(rule(r['fit_report']['scores']) for r in runs)} / {len(runs)}"


#: The report scores that can clear the share rule's verdict ("shares
#: alone" columns), newest first, each with its margin: reports made before
#: the inputs' opinion existed were cleared by the walks' score below -0.01,
#: and their tables keep that verdict.
CLEARING_SCORES = {
    "excess_class_input_disagreement": FREQUENT_CLASS_MARGIN,
    "excess_class_low_visit": 0.01,
}


def _held_by_all(runs, score):
    return all(score in r["fit_report"]["scores"] for r in runs)


def clearing_score(runs):
    """The clearing score that every report holds, or None (reports made
    before any existed: their verdict is the share rule alone)."""
    return next((s for s in CLEARING_SCORES if _held_by_all(runs, s)), None)


def verdict_rule(clearing):
    """The verdict of reports whose clearing score is ``clearing``: fit's own
    rule for the inputs' score (MNIST's ten classes: its ten-class
    threshold); for an older score, the share rule unless that score is
    below its margin's negative."""

    def suspect(scores):
        if clearing == "excess_class_input_disagreement":
            return is_suspect(scores)  # fit's own rule
        value = scores.get(clearing) if clearing else None
        cleared = value is not None and value < -CLEARING_SCORES[clearing]
        return share_excess(scores) and not cleared

    return suspect


def _flagged_by(clearing):
    """The caption's list of what flags a draw."""
    rules = ['the verdict ("suspect")']
    if clearing:
        rules.append(
            f"the verdict's share rule alone (without the {clearing} "
            "margin that clears a class merely more frequent than expected)"
        )
    rules.append("class_share_ratio above two other thresholds")
    return "by " + ", by ".join(rules[:-1]) + f" and by {rules[-1]}."


def _shown_scores(runs):
    """The scores whose AUC the table gives: those every report holds."""
    return tuple(s for s in SCORES if _held_by_all(runs, s))


def _finite_scores(runs, score):
    values = (r["fit_report"]["scores"][score] for r in runs)
    return [v for v in values if v is not None and math.isfinite(v)]


def _excess_classes(runs, suspect):
    """The class of the largest share excess of each run that ``suspect``
    flags, counted (``"3: 2; 1: 1"``): which class the verdict blames."""
    classes = []
    for run in runs:
        report = run["fit_report"]
        if suspect(report["scores"]):
            shares = report["predicted_shares"], report["expected_shares"]
            classes.append(largest_excess(*shares))
    counts = sorted(Counter(classes).items(), key=lambda item: (-item[1], item[0]))
    return "; ".join(f"{label}: {count}" for label, count in counts) or "none"


#: The verdict's thresholds were set looking at each recipe's draws below
#: these; the draws from them on test it and get rows of their own. A
#: results file's meta may give its own (``held_out_from``).
HELD_OUT_FROM = {"consistency": 20}


def draw_spans(draws):
    """Draws as the text ``parse_draws`` reads, runs of consecutive draws
    spanned: ``"30, 33, 40-59"``."""
    draws = sorted(set(draws))
    spans, first = [], 0
    for k in range(1, len(draws) + 1):
        if k == len(draws) or draws[k] != draws[k - 1] + 1:
            low, high = draws[first], draws[k - 1]
            spans.append(str(low) if low == high else f"{low}-{high}")
            first = k
    return ", ".join(spans)


def _group(run, held_out_from):
    """A run's table row: its recipe, and whether its draw is held out."""
    held_out = run["draw"] >= held_out_from.get(run["recipe"], h.MAX_DRAWS)
    return run["recipe"], held_out


def _row_groups(runs, failing_above, held_out_from):
    """Each table row's label (recipe, held-out draws apart), and its failed
    and good runs."""
    for group in sorted({_group(r, held_out_from) for r in runs}):
        recipe, held_out = group
        mine = [r for r in runs if _group(r, held_out_from) == group]
        if held_out:
            recipe = f"{recipe}, held out (draws {draw_spans(r['draw'] for r in mine)})"
        bad = [r for r in mine if r["test_error_percent"] > failing_above]
        good = [r for r in mine if r["test_error_percent"] <= failing_above]
        yield recipe, bad, good


def diagnosis_rows(runs, failing_above, held_out_from=HELD_OUT_FROM):
    """Per recipe (held-out draws apart): the draws, and the failed and good
    ones flagged by the verdict, by the share rule alone (where every
    report has a clearing score) and by the ratio thresholds.
    ``held_out_from`` maps a recipe to its first held-out draw (see
    :data:`HELD_OUT_FROM`)."""
    clearing = clearing_score(runs)
    suspect = verdict_rule(clearing)
    rows = []
    for recipe, bad, good in _row_groups(runs, failing_above, held_out_from):
        cells = [recipe, str(len(bad) + len(good))]
        cells += [_flags(bad, suspect), _flags(good, suspect)]
        if clearing:
            cells += [_flags(bad, share_excess), _flags(good, share_excess)]
        for threshold in RATIO_THRESHOLDS:

            def rule(scores, t=threshold):
                return scores["class_share_ratio"] > t

            cells += [_flags(bad, rule), _flags(good, rule)]
        rows.append(cells)
    return rows


def has_both(runs, failing_above, held_out_from=HELD_OUT_FROM):
    """Whether a row of :func:`diagnosis_rows` has failed and good draws
    (without both, no AUC)."""
    groups = _row_groups(runs, failing_above, held_out_from)
    return any(bad and good for _, bad, good in groups)


def score_rows(runs, failing_above, held_out_from=HELD_OUT_FROM):
    """Per row of :func:`diagnosis_rows`: the class each flagged draw blames,
    and each score's AUC (those every report holds), where a row has failed
    and good draws."""
    shown = _shown_scores(runs)
    if not has_both(runs, failing_above, held_out_from):
        shown = []
    suspect = verdict_rule(clearing_score(runs))
    rows = []
    for recipe, bad, good in _row_groups(runs, failing_above, held_out_from):
        cells = [recipe, _excess_classes(bad, suspect), _excess_classes(good, suspect)]
        for score in shown:
            auc = roc_auc(_finite_scores(bad, score), _finite_scores(good, score))
            cells.append(h.fmt(auc))
        rows.append(cells)
    return rows


#: The refit the user guide recommends: the warm start, or a new fit when
#: the warm start's report is suspect (:func:`recommended_refit`).
RECOMMENDED = "{}, " + h.LOOP_REFIT


def recommended_refit(refits, strategy):
    """One draw's record of the refit the user guide recommends, with the
    labels of ``strategy``: its warm start, or its new fit when the warm
    start's verdict is ``"suspect"``. None where the draw lacks either refit
    or the warm start's verdict (runs made before the script recorded it)."""
    warm = refits.get(refit_key(strategy, "warm"))
    new = refits.get(refit_key(strategy, "new"))
    if warm is None or new is None or "verdict" not in warm:
        return None
    return new if warm["verdict"] == "suspect" else warm


def _error_row(recipe, label, errors):
    return [
        recipe,
        label,
        str(len(errors)),
        h.fmt(float(np.median(errors))),
        h.fmt(max(errors)),
    ]


def _recommended_row(recipe, refitted, strategy):
    """The recommended refit's row, labeled with how many draws it refitted
    anew; None where no draw holds what it needs."""
    chosen = [recommended_refit(r["refits"], strategy) for r in refitted]
    pairs = [(r, c) for r, c in zip(refitted, chosen) if c is not None]
    if not pairs:
        return None
    anew = sum(c is r["refits"][strategy] for r, c in pairs)
    label = f"{RECOMMENDED.format(strategy)} ({anew} new)"
    return _error_row(recipe, label, [c["test_error_percent"] for _, c in pairs])


def suggestion_rows(runs):
    rows = []
    for recipe in sorted({r["recipe"] for r in runs}):
        refitted = [r for r in runs if r["recipe"] == recipe]
        if not refitted:
            continue
        before = [r["test_error_percent"] for r in refitted]
        rows.append(_error_row(recipe, "none (the fit)", before))
        for strategy in (refit_key(s, r) for r in REFITS for s in STRATEGIES):
            errors = [
                r["refits"][strategy]["test_error_percent"]
                for r in refitted
                if strategy in r["refits"]
            ]
            if errors:
                rows.append(_error_row(recipe, strategy, errors))
        rows += filter(
            None, (_recommended_row(recipe, refitted, s) for s in STRATEGIES)
        )
    return rows


def render(results, failing_above):
    """The docs' tables: the diagnosis over every draw whose report is
    current, the refits of the failed draws; each where it has runs."""
    runs = list(results["runs"].values())
    # Runs of the diagnosis alone, where a file holds them (see its note).
    reported = list({**results["runs"], **results.get("report_runs", {})}.values())
    refitted = [r for r in runs if r["refits"]]
    commands = h.commands_text(results["meta"])
    parts = []
    if reported:
        held_out_from = results["meta"].get("held_out_from", HELD_OUT_FROM)
        clearing = clearing_score(reported)
        header = ["recipe", "draws", "verdict: failed", "verdict: good"]
        if clearing:
            header += ["shares alone: failed", "shares alone: good"]
        for threshold in RATIO_THRESHOLDS:
            header += [f"ratio > {threshold}: failed", f"ratio > {threshold}: good"]
        diagnosis = h.rst_table(
            header, diagnosis_rows(reported, failing_above, held_out_from)
        )
        aucs = has_both(reported, failing_above, held_out_from)
        scores = h.rst_table(
            ["recipe", "class blamed: failed", "class blamed: good"]
            + [f"AUC {s}" for s in _shown_scores(reported) if aucs],
            score_rows(reported, failing_above, held_out_from),
        )
        parts.append(
            f".. rubric:: {results['meta'].get('title', DIAGNOSIS_TITLE)}\n\n"
            "MNIST, 10 labels a class; a draw fails when its test error is above "
            f"{failing_above} %. Flagged draws (failed, then good ones): "
            + _flagged_by(clearing)
            + f" Made by {commands}. "
            + results["meta"].get("report_runs_note", "")
            + f"\n\n{diagnosis}\n\n"
            "Class blamed: the class of the largest share excess of each draw "
            "the verdict flags, as class: draws."
            + (
                " AUC: the probability that a failed draw's score is above a "
                "good one's."
                if aucs
                else ""
            )
            + f"\n\n{scores}\n"
        )
    if refitted:
        suggestions = _refit_table(refitted)
        parts.append(
            f".. rubric:: {results['meta'].get('refit_title', REFIT_TITLE)}\n\n"
            "The failed draws of the runs with refits, each refitted with the "
            "labels of 10 more samples chosen by each strategy (same seed). "
            + _refit_notes(refitted)
            + ("Made by the commands above" if reported else f"Made by {commands}")
            + f".\n\n{suggestions}\n"
        )
    return "\n".join(parts)


#: The pooled table's title.
POOLED_TITLE = "The failed draws of several runs, pooled"


def _warm_against_new(refitted, strategy):
    """Where the warm start ended against the new fit, as a sentence."""
    pairs = [
        (r["refits"][refit_key(strategy, "warm")], r["refits"][strategy])
        for r in refitted
        if {strategy, refit_key(strategy, "warm")} <= set(r["refits"])
    ]
    if not pairs:
        return ""
    below, level, above = (
        sum(
            np.sign(w["test_error_percent"] - n["test_error_percent"]) == s
            for w, n in pairs
        )
        for s in (-1, 0, 1)
    )
    return (
        f'With the labels of "{strategy}", the warm start ended below the new '
        f"fit on {below} of {len(pairs)} draws, level on {level}, above on {above}. "
    )


def _refit_notes(runs):
    """What the refits table of ``runs`` says of its warm-start rows."""
    warm = any(", warm start" in k for r in runs for k in r["refits"])
    recommended = any(
        recommended_refit(r["refits"], s) for r in runs for s in STRATEGIES
    )
    return (WARM_NOTE if warm else "") + (RECOMMENDED_NOTE if recommended else "")


def _refit_table(runs):
    return h.rst_table(
        [
            "recipe",
            f"{EXTRA_LABELS} more labels from",
            "draws",
            "median error %",
            "worst %",
        ],
        suggestion_rows(runs),
    )


def _pool_main(parser, args):
    if not args.json:
        parser.error("--pool needs --json, the file of the pooled table")
    out = h.Path(args.json)
    if any(h.Path(p).resolve() == out.resolve() for p in args.pool):
        parser.error(f"--json {args.json} is one of the pooled files; name another")
    if out.exists() and "runs" in h.read_results(out):
        parser.error(f"--json {args.json} holds runs; --pool would replace them")
    return pool(args.pool, out)


def _results_problem(data):
    """What keeps ``data`` from being a results file of this script."""
    runs = data.get("runs")
    if not isinstance(runs, dict) or not all(
        isinstance(r, dict) and {"recipe", "refits"} <= set(r) for r in runs.values()
    ):
        return "it holds no runs of bench_trust.py"
    return None


def pool(paths, out):
    """Pool the refits of the results files ``paths`` into one table, written
    beside ``out`` (``.rst``); ``out`` keeps the table's rows and each file's
    meta (its machines and commands)."""
    sources = {h.shown_path(p): h.read_results(p, _results_problem) for p in paths}
    refitted = [
        run
        for results in sources.values()
        for run in results["runs"].values()
        if run["refits"]
    ]
    if not refitted:
        raise SystemExit(f"error: no file of {list(sources)} holds a refitted draw.")
    argv = ["--pool", *sources, "--json", h.shown_path(out)]
    command = h.command_line("benchmarks/bench_trust.py", argv, python=True)
    meta = {name: results.get("meta", {}) for name, results in sources.items()}
    rows = suggestion_rows(refitted)
    h.write_json(out, {"meta": {"commands": [command], "sources": meta}, "rows": rows})
    files = ", ".join(f"``{name}``" for name in sources)
    h.publish_table(
        out,
        f".. rubric:: {POOLED_TITLE}\n\n"
        f"The refits of the failed draws of {files} (their tables give the "
        "commands that made them), pooled: a draw refitted in two runs counts "
        "in each. "
        + _refit_notes(refitted)
        + "".join(_warm_against_new(refitted, s) for s in STRATEGIES)
        + f"Made by ``{command}``.\n\n{_refit_table(refitted)}\n",
    )


def _parser():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cuda", choices=("cuda", "cpu"))
    parser.add_argument(
        "--gpus", type=lambda t: [int(g) for g in t.split(",")], default=[0]
    )
    parser.add_argument("--recipes", nargs="+", default=["fast"])
    parser.add_argument("--draws", type=parse_draws, default=parse_draws("0-9"))
    parser.add_argument(
        "--strategies",
        nargs="*",
        default=list(STRATEGIES),
        choices=STRATEGIES,
        help="none: fit and report only",
    )
    parser.add_argument(
        "--refits",
        nargs="+",
        default=["new"],
        choices=REFITS,
        help="new: refit a new network; warm: continue from the fit's weights",
    )
    parser.add_argument("--failing-above", type=float, default=FAILING_ABOVE)
    parser.add_argument("--suggest-all", action="store_true")
    parser.add_argument("--data-home", default=None)
    parser.add_argument("--max-iter", type=int, default=None, help="smoke tests")
    parser.add_argument("--train-subset", type=int, default=None, help="smoke tests")
    parser.add_argument("--json", default=None)
    parser.add_argument("--render-only", action="store_true")
    parser.add_argument("--title", help="the diagnosis tables' title, kept in --json")
    parser.add_argument(
        "--refit-title", help="the refits table's title, kept in --json"
    )
    parser.add_argument(
        "--pool",
        nargs="+",
        metavar="FILE",
        help="pool the refits of these results files into --json's table; fits nothing",
    )
    return parser


def _measure(args, results, path, argv):
    """Run the draws asked for that ``results`` lacks, and save them."""
    done = results["runs"]
    jobs = [(r, d) for r in args.recipes for d in args.draws if f"{r}/{d}" not in done]
    if not jobs:
        # Nothing run: the file's machines and commands stay its own.
        print("Every draw asked for is in the file already.", file=sys.stderr)
        return
    import torch

    for run in run_all(args, jobs):
        done[f"{run['recipe']}/{run['draw']}"] = run
    device = torch.device("cuda" if args.device == "cuda" else "cpu")
    h.save_results(path, results, "bench_trust.py", argv, device)


def main(argv=None):
    parser = _parser()
    args = parser.parse_args(argv)
    if args.pool:
        return _pool_main(parser, args)
    path = h.Path(args.json or h.RESULTS_DIR / f"trust_{args.device}.json")
    results = h.runs_file(parser, path, args.render_only)
    if "runs" not in results:
        parser.error(
            f"{h.shown_path(path)} is a pooled table, not runs: make it again "
            "with --pool"
        )
    h.keep_titles(path, results, {"title": args.title, "refit_title": args.refit_title})
    if not args.render_only:
        _measure(args, results, path, argv)
    h.publish_table(path, render(results, args.failing_above))


if __name__ == "__main__":
    main()

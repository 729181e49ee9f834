"""Can a suspect few-label fit be mended without new labels? MNIST, recipe "fast".

Each label draw ``d`` (10 labels a class, drawn as ``bench_trust.py`` draws
them, ``random_state=d``) is fitted with recipe "fast". When ``fit_report_``
calls the fit ``"suspect"`` (or with ``--refit-all``), it is refitted by
each plan of ``--plans`` (see ``PLANS``), with the same labels and the
balance loss aiming at class shares estimated in one of these ways:

- ``labels``: the labels' shares, equal here (what recipe "balanced" aims
  at), at the weight of recipe "balanced" or at 2 or 4 times it;
- ``cut``: the fit's predicted shares on the unlabeled samples, the class
  the report blames cut to its expected share and the surplus spread over
  the other classes in proportion to their shares;
- ``inputs``: the same, the surplus moved to the classes that the labels
  spread over the inputs give the blamed class's predictions;
- ``its shares``: after a ``labels`` refit, that refit's predicted shares;
- ``truth``: the shares of all 60,000 training labels. A reference the user
  does not have, not a recipe.

A refit is a new network ("new") or the fit continued ("warm":
``warm_start=True``, another ``max_iter`` steps with the balance loss).
Each fit's test error, verdict and predicted shares go to
``benchmarks/results/trust_prior_<device>.json`` (a run is keyed by its
draw and plans, and skipped when the file has it), the tables to
``trust_prior_<device>.rst``::

    python benchmarks/bench_trust_prior.py --draws 2,3,17,30
    python benchmarks/bench_trust_prior.py --draws 180-199 --plans 'labels x2, new'
    python benchmarks/bench_trust_prior.py --render-only
"""

import argparse
import copy
import warnings

import _harness as h
import numpy as np
from bench_trust import FAILING_ABOVE, draw_spans, parse_draws

from skassoc._diagnosis import largest_excess

#: The recipe the first fits use.
RECIPE = "fast"
#: The test error (%) that a recipe which does not fail must not exceed
#: on any draw.
RECIPE_LINE = 1.2
#: Label draws from this one on were fitted after the plans were chosen.
PLANS_CHOSEN_BEFORE = 180
#: Draws a row of the held-out table holds, at most.
ROW_DRAWS = 20
#: Unlabeled samples the "inputs" estimate reads (at random).
INPUT_SAMPLES = 10_000
#: The balance loss's weight in a refit (that of recipe "balanced").
BALANCE_WEIGHT = 5.0
#: Each refit plan: its steps, each a class-share estimate the balance loss
#: aims at, how the step starts ("new" network or "warm": the previous fit
#: continued) and the balance weight. Estimates: "labels" (the labels'
#: shares), "cut" (see cut_prior), "shares" (the previous fit's predicted
#: shares) and "truth" (all training labels': a reference, not a recipe).
PLANS = {
    "labels, new": [("labels", "new", BALANCE_WEIGHT)],
    "labels, warm": [("labels", "warm", BALANCE_WEIGHT)],
    "cut, new": [("cut", "new", BALANCE_WEIGHT)],
    "cut, warm": [("cut", "warm", BALANCE_WEIGHT)],
    "truth, new": [("truth", "new", BALANCE_WEIGHT)],
    "truth, warm": [("truth", "warm", BALANCE_WEIGHT)],
    "labels x4, new": [("labels", "new", 4 * BALANCE_WEIGHT)],
    "labels x2, new": [("labels", "new", 2 * BALANCE_WEIGHT)],
    "inputs, new": [("inputs", "new", BALANCE_WEIGHT)],
    "inputs, warm": [("inputs", "warm", BALANCE_WEIGHT)],
    "labels, new; its shares, warm": [
        ("labels", "new", BALANCE_WEIGHT),
        ("shares", "warm", BALANCE_WEIGHT),
    ],
    "labels, new; its shares, new": [
        ("labels", "new", BALANCE_WEIGHT),
        ("shares", "new", BALANCE_WEIGHT),
    ],
}


def _shares(report):
    return np.array(list(report.predicted_shares.values()), dtype=float)


def _positive(prior):
    """``prior`` as frequencies that ``class_prior`` takes: none 0 (a class
    that a fit never predicts gets a small share), summing to 1."""
    prior = np.clip(prior, 1e-3, None)
    return prior / prior.sum()


def _surplus_moved(report, destination):
    """The report's predicted shares, with the surplus of the class of the
    largest excess over its expected share moved to the other classes in
    the proportions ``destination(worst)`` gives (its ``worst`` entry 0)."""
    shares = _shares(report)
    expected = np.array(list(report.expected_shares.values()), dtype=float)
    worst = largest_excess(shares, expected)
    surplus = max(shares[worst] - expected[worst], 0.0)
    prior = shares + surplus * destination(worst)
    prior[worst] -= surplus
    return _positive(prior)


def cut_prior(report):
    """The report's predicted shares, with the class of the largest excess
    cut to its expected share and the surplus spread over the other classes
    in proportion to their predicted shares."""
    shares = _shares(report)

    def in_proportion(worst):
        others = np.where(np.arange(len(shares)) == worst, 0.0, shares)
        return others / others.sum()

    return _surplus_moved(report, in_proportion)


def inputs_prior(clf, X, y_semi, seed):
    """The fit's predicted shares, with the surplus of the class of the
    largest excess (over its expected share) moved to the classes that the
    labels spread over the inputs give that class's predictions where they
    disagree with it, in proportion to how often each is given there (as
    :func:`cut_prior` where the labels cannot spread)."""
    from skassoc._input_view import spread_labels

    rng = np.random.default_rng(seed)
    labeled = np.flatnonzero(y_semi >= 0)
    pool = np.flatnonzero(y_semi < 0)
    unlabeled = np.sort(rng.choice(pool, min(INPUT_SAMPLES, len(pool)), replace=False))
    encoded = np.searchsorted(clf.classes_, y_semi[labeled])
    spread = spread_labels(lambda i: X[i], labeled, encoded, unlabeled, seed)
    if spread is None:
        return cut_prior(clf.fit_report_)
    predicted = np.searchsorted(clf.classes_, clf.predict(X[unlabeled]))

    def where_the_inputs_point(worst):
        there = spread[(predicted == worst) & (spread != worst) & (spread >= 0)]
        return np.bincount(there, minlength=len(clf.classes_)) / max(len(there), 1)

    return _surplus_moved(clf.fit_report_, where_the_inputs_point)


def prior_of(name, clf, y, X=None, y_semi=None, seed=0):
    """The ``class_prior`` of a refit step aiming at the estimate ``name``,
    from the previous fit ``clf`` (``y``: every training label, for
    ``"truth"``; ``X`` and ``y_semi`` for ``"inputs"``). The labels are
    drawn as many a class, so their shares are ``"uniform"``."""
    if name == "labels":
        return "uniform"
    if name == "cut":
        return cut_prior(clf.fit_report_)
    if name == "inputs":
        return inputs_prior(clf, X, y_semi, seed)
    if name == "shares":
        return _positive(_shares(clf.fit_report_))
    if name == "truth":
        return np.bincount(y, minlength=len(clf.classes_)) / len(y)
    raise ValueError(f"Unknown class-share estimate {name!r}.")


def _fit(clf, X, y_semi, X_test, y_test):
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        clf.fit(X, y_semi)
        error = h.error_percent(clf.predict(X_test), y_test)
    return {
        "test_error_percent": error,
        "verdict": clf.fit_report_.verdict,
        "predicted_shares": _shares(clf.fit_report_).tolist(),
        "warnings": sorted({w.category.__name__ for w in caught}),
    }


def run_plan(steps, clf, params, data, y_semi):
    """The record of the last fit of a plan's ``steps``, from the fit ``clf``,
    with the class priors of every step and the records of the steps
    before it (``"steps"``)."""
    from skassoc import SemiSupervisedAssociationClassifier

    (X, y), (X_test, y_test) = data
    priors, records = [], []
    for estimate, start, weight in steps:
        prior = prior_of(estimate, clf, y, X, y_semi, params["random_state"])
        changes = {"balance_weight": weight, "class_prior": prior}
        if start == "new":
            clf = SemiSupervisedAssociationClassifier(**{**params, **changes})
        else:
            clf = copy.deepcopy(clf).set_params(warm_start=True, **changes)
        records.append(_fit(clf, X, y_semi, X_test, y_test))
        priors.append(np.asarray(prior).tolist())
    return {**records[-1], "class_priors": priors, "steps": records[:-1]}


def run_draw(draw, data, device, args):
    """Fit label draw ``draw``; refit it by each plan of ``args.plans`` when
    its report is suspect (or with ``args.refit_all``)."""
    from skassoc import SemiSupervisedAssociationClassifier, recipe_params
    from skassoc.datasets import make_semi_supervised_labels

    (X, y), (X_test, y_test) = data
    y_semi = make_semi_supervised_labels(y, 10, random_state=draw)
    params = {**recipe_params(RECIPE), "device": device, "random_state": draw}
    if args.max_iter is not None:  # a smoke test's
        params.update(max_iter=args.max_iter, lr_warmup_steps=0, compile=False)
    clf = SemiSupervisedAssociationClassifier(**params)
    run = {"draw": draw, **_fit(clf, X, y_semi, X_test, y_test), "refits": {}}
    print(f"draw {draw}: {run['test_error_percent']:.2f} % ({run['verdict']})")
    if run["verdict"] != "suspect" and not args.refit_all:
        return run
    for name in args.plans:
        record = run["refits"][name] = run_plan(PLANS[name], clf, params, data, y_semi)
        print(
            f"  {name}: {record['test_error_percent']:.2f} % ({record['verdict']})",
            flush=True,
        )
    return run


def _plans_of(key):
    """The plans a run's key names (``"<draw>/<plan> | <plan>"``); runs made
    before the script took ``--plans`` ran the first six."""
    _, _, plans = key.partition("/")
    return plans.split(" | ") if plans else list(PLANS)[:6]


def _error_cells(errors):
    return [
        h.fmt(float(np.median(errors))),
        h.fmt(max(errors)),
        f"{sum(e > RECIPE_LINE for e in errors)} / {len(errors)}",
    ]


def _whole(runs):
    """Whether ``runs`` hold each draw of their span once, and not only
    suspect ones: a rerun of the suspect draws alone is no row of the recipe."""
    draws = sorted(run["draw"] for run in runs)
    every = draws == list(range(draws[0], draws[-1] + 1))
    return every and any(run["verdict"] != "suspect" for run in runs)


def plan_rows(runs):
    """Per plan, on the draws the plans were chosen on and on later ones:
    the draws of its refits, how many refits (a draw refitted by two
    commands counts twice), their test errors and verdicts."""
    rows = []
    for name in PLANS:
        for later in (False, True):
            refits = [
                (run["draw"], run["refits"][name])
                for run in runs
                if name in run["refits"]
                and (run["draw"] >= PLANS_CHOSEN_BEFORE) == later
            ]
            if not refits:
                continue
            errors = [refit["test_error_percent"] for _, refit in refits]
            suspect = sum(refit["verdict"] == "suspect" for _, refit in refits)
            draws = draw_spans(draw for draw, _ in refits)
            cells = [*_error_cells(errors), f"{suspect} / {len(refits)}"]
            group = "later" if later else "chosen on"
            rows.append([name, draws, group, str(len(refits)), *cells])
    return rows


def recipe_rows(results):
    """Per plan and block of held-out draws: the recipe "fit, refit by the
    plan when suspect", over every draw of the runs that named the plan."""
    rows = []
    for name in PLANS:
        runs = [
            run
            for key, run in results["runs"].items()
            if run["draw"] >= PLANS_CHOSEN_BEFORE and name in _plans_of(key)
        ]
        blocks = {}
        for run in sorted(runs, key=lambda run: run["draw"]):
            blocks.setdefault(
                (run["draw"] - PLANS_CHOSEN_BEFORE) // ROW_DRAWS, []
            ).append(run)
        blocks = [b for b in blocks.values() if _whole(b)]
        if len(blocks) > 1:
            blocks.append([run for block in blocks for run in block])
        for block in blocks:
            first = [run["test_error_percent"] for run in block]
            # The refit replaces a suspect fit only (a run with --refit-all
            # refits the others too).
            final = [
                (run["refits"][name] if run["verdict"] == "suspect" else run)[
                    "test_error_percent"
                ]
                for run in block
            ]
            suspect = sum(run["verdict"] == "suspect" for run in block)
            failed = sum(e > FAILING_ABOVE for e in first)
            draws = draw_spans(run["draw"] for run in block)
            rows.append([name, draws, f"{suspect} / {failed}", *_error_cells(final)])
    return rows


def render(results):
    """The two tables of the results ``results``, with their captions."""
    meta = {"commands": [], **results.get("meta", {})}
    runs = list(results["runs"].values())
    errors = ["median %", "worst %", f"above {RECIPE_LINE} %"]
    plans = h.rst_table(
        ["plan", "draws", "draws are", "refits", *errors, "refits called suspect"],
        plan_rows(runs),
    )
    recipe = h.rst_table(
        ["refit plan", "draws", "first fits suspect / failed", *errors],
        recipe_rows(results),
    )
    return (
        ".. rubric:: Suspect fits refitted with the balance loss "
        f'(recipe "{RECIPE}")\n\n'
        f"MNIST, 10 labels a class. Each suspect fit refitted by each plan, "
        f"without new labels; a plan is named by the class shares the balance "
        f"loss aims at and how the refit starts (see the script). Made by "
        f"{h.commands_text(meta)}. {meta.get('runs_note', '')}\n\n{plans}\n\n"
        f".. rubric:: The recipe on new label draws: fit, refit when suspect\n\n"
        f'Recipe "{RECIPE}" on label draws fitted after the plans were chosen, '
        f"each suspect fit replaced by its refit: how many first fits were "
        f"suspect and how many failed (above {FAILING_ABOVE} %), then the "
        f"test error of what the recipe returns. Same commands.\n\n{recipe}\n"
    )


def main(argv=None):
    """Fit the draws not yet in the results file, then write its tables."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cuda", choices=("cuda", "cpu"))
    parser.add_argument("--draws", type=parse_draws, default=parse_draws("0-9"))
    parser.add_argument("--plans", nargs="+", choices=PLANS, default=list(PLANS)[:6])
    parser.add_argument("--refit-all", action="store_true")
    parser.add_argument("--max-iter", type=h.bounded_int(1), default=None)
    parser.add_argument("--train-subset", type=h.bounded_int(1), default=None)
    parser.add_argument("--data-home", default=None)
    parser.add_argument("--render-only", action="store_true")
    args = parser.parse_args(argv)
    # A smoke test's runs (fewer steps or samples) go to a file of their own.
    smoke = "_smoke" if args.max_iter or args.train_subset else ""
    path = h.RESULTS_DIR / f"trust_prior_{args.device}{smoke}.json"
    results = h.runs_file(parser, path, args.render_only)
    if not args.render_only:
        import torch

        device = torch.device(args.device)
        (X, y), test = h.load_mnist_sets(args.data_home)
        data = (X[: args.train_subset], y[: args.train_subset]), test
        # The command first: a run that stops keeps it with its draws.
        h.save_results(path, results, "bench_trust_prior.py", argv, device)
        for draw in args.draws:
            key = f"{draw}/{' | '.join(args.plans)}"
            if key not in results["runs"]:
                results["runs"][key] = run_draw(draw, data, args.device, args)
                h.write_json(path, results)
    h.publish_table(path, render(results))


if __name__ == "__main__":
    main()

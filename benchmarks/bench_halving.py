"""Successive halving over max_iter: every round retrained vs runs continued.

``docs/benchmarks/speed.rst`` says what the table measures::

    python benchmarks/bench_halving.py --device cpu
    python benchmarks/bench_halving.py --render-only
"""

import contextlib
import os
import sys
import tempfile
import time
from pathlib import Path

import _harness as h
import torch
from sklearn.datasets import load_digits
from sklearn.experimental import enable_halving_search_cv  # noqa: F401
from sklearn.model_selection import HalvingGridSearchCV

import skassoc._engine._step
from skassoc import SemiSupervisedAssociationClassifier
from skassoc.datasets import make_semi_supervised_labels
from skassoc.model_selection import RunStore, SemiSupervisedStratifiedKFold

#: The candidates: the loss weights of bench_search.py's search.
GRID = {"visit_weight": [0.5, 1.0], "walker_weight": [0.5, 1.0, 1.5, 2.0]}
#: The searches, in the order they run: ``store`` says whether with a RunStore.
SEARCHES = {"retrained": False, "continued": True}
#: Steps of the untimed warm-up fit.
WARMUP_STEPS = 5


def parse_args(argv=None):
    parser = h.make_parser(__doc__.split("\n")[0], "halving", cases=False)
    parser.set_defaults(device="cpu")
    add = parser.add_argument
    steps = h.bounded_int(1)
    add("--seed", type=h.seed_int, default=0, help="labels and init seed")
    # Digits' smallest class has 174 images: 36 labels a class are 20 %.
    add("--labeled-per-class", type=h.bounded_int(2, 174), default=36)
    add("--min-steps", type=steps, default=50, help="max_iter of the first round")
    add("--max-steps", type=steps, default=400, help="max_iter of the last round")
    add("--factor", type=h.bounded_int(2), default=2, help="halving factor")
    add("--decay-steps", type=steps, default=100, help="lr_decay_steps of every fit")
    add("--folds", type=h.bounded_int(2), default=2, help="cross-validation folds")
    args = h.parse(parser, argv)
    if not args.render_only and args.min_steps > args.max_steps:
        parser.error("--min-steps must not exceed --max-steps")
    return args


@contextlib.contextmanager
def counted_steps():
    """A list that gains an item per training step taken inside the block
    (``AssociationStep.__call__`` wrapped, and restored on leaving it)."""
    step = skassoc._engine._step.AssociationStep
    original = step.__call__
    taken = []

    def counting(self):
        taken.append(1)
        return original(self)

    step.__call__ = counting
    try:
        yield taken
    finally:
        step.__call__ = original


def load_data(args):
    """Digits with ``--labeled-per-class`` labels a class, drawn with ``--seed``."""
    X, y = load_digits(return_X_y=True)
    return X, make_semi_supervised_labels(
        y, args.labeled_per_class, random_state=args.seed
    )


def estimator_params(args, device):
    """The parameters every fit of both searches shares."""
    # A decay interval in steps, not "auto": a continued run then follows the
    # schedule a retrained one would, and both searches select alike.
    return dict(
        network="mlp",
        lr_decay_steps=args.decay_steps,
        device=str(device),
        random_state=args.seed,
    )


def run_search(args, params, data, device, store):
    """One HalvingGridSearchCV over max_iter (with a RunStore in a temporary
    folder when ``store``): its steps, wall seconds and outcome."""
    X, y = data
    with contextlib.ExitStack() as stack:
        folder = stack.enter_context(tempfile.TemporaryDirectory()) if store else None
        search = HalvingGridSearchCV(
            SemiSupervisedAssociationClassifier(
                **params, resume_from=RunStore(folder) if store else None
            ),
            GRID,
            resource="max_iter",
            min_resources=args.min_steps,
            max_resources=args.max_steps,
            factor=args.factor,
            cv=SemiSupervisedStratifiedKFold(args.folds),
            # The refit is the same with and without a store: left out.
            refit=False,
            random_state=args.seed,
        )
        taken = stack.enter_context(counted_steps())
        # CPU time beside the wall time: on a shared machine other jobs
        # lengthen the wall time of a one-thread CPU search far more.
        load_before, cpu_start = os.getloadavg(), time.process_time()
        _, seconds = h.timed(lambda: search.fit(X, y), device)
        cpu_seconds = time.process_time() - cpu_start
        load_after = os.getloadavg()
    results = search.cv_results_
    return {
        "steps": len(taken),
        "seconds": seconds,
        "cpu_seconds": cpu_seconds,
        # The machine's 1-minute load average (the search's own thread
        # included): more than the search's threads means it shared the CPUs.
        "load_average": [load_before[0], load_after[0]],
        "best_params": search.best_params_,
        "best_score": float(search.best_score_),
        "n_resources": [int(n) for n in search.n_resources_],
        "n_candidates": [int(n) for n in search.n_candidates_],
        "cv_results": {
            "iter": results["iter"].tolist(),
            "n_resources": results["n_resources"].tolist(),
            "params": list(results["params"]),
            "mean_test_score": results["mean_test_score"].tolist(),
        },
    }


def measure(args):
    device = h.resolve_device(args.device)
    if device.type == "cpu":
        # One thread, as bench_defaults.py runs on a CPU: steadier timings on
        # a shared machine, and as fast for this small network.
        torch.set_num_threads(1)
    data = load_data(args)
    params = estimator_params(args, device)
    warm_up = {**params, "max_iter": WARMUP_STEPS}
    SemiSupervisedAssociationClassifier(**warm_up).fit(*data)
    result = {
        "environment": h.environment(device),
        "command": h.command_line(Path(sys.argv[0]).name, sys.argv[1:]),
        "data": "digits",
        "n_samples": int(len(data[1])),
        "n_labeled": int((data[1] != -1).sum()),
        "labeled_per_class": args.labeled_per_class,
        "seed": args.seed,
        "folds": args.folds,
        "factor": args.factor,
        "min_steps": args.min_steps,
        "max_steps": args.max_steps,
        "params": params,
        "grid": GRID,
        "searches": {},
    }
    for name, store in SEARCHES.items():
        record = run_search(args, params, data, device, store)
        result["searches"][name] = record
        print(
            f"{name}: {record['steps']} steps, {record['seconds']:.1f} s, "
            f"best {record['best_params']} ({record['best_score']:.4f})",
            flush=True,
        )
    searches = result["searches"]
    retrained, continued = searches["retrained"], searches["continued"]
    result["speedup"] = retrained["seconds"] / continued["seconds"]
    result["cpu_speedup"] = retrained["cpu_seconds"] / continued["cpu_seconds"]
    return result


def _threads(result):
    env = result["environment"]
    if env["device_type"] != "cpu":
        return f"on one {env['device_type']} device"
    n = env["torch_threads"]
    return f"{n} torch thread{'s' if n != 1 else ''}"


def _caption(result):
    params = result["params"]
    labeled = 100 * result["n_labeled"] / result["n_samples"]
    first = result["searches"]["retrained"]
    rounds = ", ".join(map(str, first["n_resources"]))
    return (
        '``HalvingGridSearchCV(resource="max_iter")`` over the '
        f"{first['n_candidates'][0]} candidates ``visit_weight`` x "
        "``walker_weight`` on scikit-learn's "
        f"digits ({result['labeled_per_class']} labels a class, "
        f"{labeled:.0f} % of {result['n_samples']}, seed {result['seed']}), "
        f'``network="{params["network"]}"``, {result["folds"]} folds of '
        "``SemiSupervisedStratifiedKFold``, factor "
        f"{result['factor']}, rounds of {rounds} steps, no refit, "
        f"{_threads(result)}. Steps are those the searches trained; the times "
        "are the wall and CPU seconds of ``fit``. Both searches "
        f"use ``lr_decay_steps={params['lr_decay_steps']}``, a schedule "
        'independent of ``max_iter``; with the default ``lr_decay_steps="auto"``'
        " the continued runs follow the schedule of each round's ``max_iter`` "
        "(so scores may differ from retraining)."
    )


def render_table(result):
    """The caption, and one row per search: its steps, time and outcome."""
    header = ["search", "steps", "wall s", "CPU s", "speed-up (wall, CPU)"]
    header += ["best params", "best score", "``n_resources_``"]
    retrained = result["searches"]["retrained"]
    names = {"retrained": "retrained each round", "continued": "continued (RunStore)"}
    rows = []
    for name, record in result["searches"].items():
        # max_iter is the last round's, in n_resources_.
        best = record["best_params"].items()
        best = ", ".join(f"{k}={v}" for k, v in sorted(best) if k != "max_iter")
        rows.append(
            [
                names[name],
                str(record["steps"]),
                f"{record['seconds']:.1f}",
                f"{record['cpu_seconds']:.1f}",
                f"{retrained['seconds'] / record['seconds']:.2f}, "
                f"{retrained['cpu_seconds'] / record['cpu_seconds']:.2f}",
                best,
                f"{record['best_score']:.4f}",
                ", ".join(map(str, record["n_resources"])),
            ]
        )
    return "\n".join([_caption(result), "", h.rst_table(header, rows, right=False)])


def main(argv=None):
    h.measure_main(parse_args(argv), measure, render_table)


if __name__ == "__main__":
    main()

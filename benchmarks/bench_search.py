"""A loss-weight search of 8 candidates on one GPU: one after another vs stacked.

``docs/benchmarks/speed.rst`` says what the table measures::

    python benchmarks/bench_search.py --device cuda --steps 2000
    python benchmarks/bench_search.py --device cpu --steps 5 --train-subset 2000
    python benchmarks/bench_search.py --render-only
"""

import warnings

import _harness as h

from skassoc import SemiSupervisedAssociationClassifier, recipe_params
from skassoc._stacked import fit_candidates

CANDIDATES = [
    {"walker_weight": w, "visit_weight": v}
    for v in (0.5, 1.0)
    for w in (0.5, 1.0, 1.5, 2.0)
]
STACKINGS = ("streams",)
WARMUP_STEPS = 50


def parse_args(argv=None):
    parser = h.make_parser(__doc__.split("\n")[0], "search", cases=False)
    parser.set_defaults(device="cuda")
    add = parser.add_argument
    steps, images = h.bounded_int(1), h.bounded_int(1, h.MNIST_TRAIN_IMAGES)
    add("--steps", type=steps, default=2000, help="training steps of every fit")
    add("--seed", type=h.seed_int, default=0, help="labels and init seed")
    add("--precision", default="auto")
    add("--train-subset", type=images, default=None, help="first N training images")
    return h.parse(parser, argv)


def _warm_up(params):
    """``params`` for an untimed warm-up fit (CUDA init, cuDNN autotuning)."""
    steps = min(WARMUP_STEPS, params["max_iter"])
    return {**params, "max_iter": steps, "lr_decay_steps": steps}


def test_error(estimator, X_test, y_test):
    if not hasattr(estimator, "model_"):
        return None
    return h.error_percent(estimator.predict(X_test), y_test)


def run_serial(params, data, device):
    X, y, X_test, y_test = data
    SemiSupervisedAssociationClassifier(**_warm_up(params)).fit(X, y)
    seconds, errors = [], []
    for candidate in CANDIDATES:
        clf, wall = h.timed_fit(X, y, {**params, **candidate}, device)
        seconds.append(wall)
        errors.append(test_error(clf, X_test, y_test))
        print(f"serial {candidate}: {wall:.2f} s, error {errors[-1]:.2f} %", flush=True)
    return {"seconds": float(sum(seconds)), "fit_seconds": seconds, "errors": errors}


def run_stacked(params, data, device, stacking):
    X, y, X_test, y_test = data

    def stack(params):
        clf = SemiSupervisedAssociationClassifier(**params)
        return fit_candidates(clf, CANDIDATES, X, y, stacking=stacking)

    try:
        stack(_warm_up(params))
        fitted, wall = h.timed(lambda: stack(params), device)
    except Exception as exc:  # noqa: BLE001 -- record, and measure the rest
        print(f"stacked {stacking} failed: {exc!r}", flush=True)
        return {"error": repr(exc)}
    errors = [test_error(est, X_test, y_test) for est in fitted]
    print(f"stacked {stacking}: {wall:.2f} s, errors {errors}", flush=True)
    return {"seconds": wall, "errors": errors}


def run_ceiling(params, data, device):
    """One fit whose batches are 8 times those of one candidate's fit."""
    X, y, _, _ = data
    k = len(CANDIDATES)
    big = dict(params, labeled_per_class=params["labeled_per_class"] * k)
    big["unlabeled_batch_size"] = params["unlabeled_batch_size"] * k
    with warnings.catch_warnings():
        # 80 labeled a class from 10: drawn with replacement, which is fine here.
        warnings.simplefilter("ignore", UserWarning)
        SemiSupervisedAssociationClassifier(**_warm_up(big)).fit(X, y)
        _, wall = h.timed_fit(X, y, big, device)
    print(f"ceiling (one fit, 8x batch): {wall:.2f} s", flush=True)
    return {"seconds": wall, "batch_factor": k}


def summarize(result):
    """Speed-ups and the share of the ceiling reached, from the raw timings."""
    serial = result["serial"]["seconds"]
    one_fit = serial / len(CANDIDATES)
    ceiling = len(CANDIDATES) * one_fit / result["ceiling"]["seconds"]
    summary = {"serial_seconds": serial, "ceiling_speedup": ceiling}
    for stacking, record in result["stacked"].items():
        if "seconds" not in record:
            continue
        speedup = serial / record["seconds"]
        summary[stacking] = {
            "seconds": record["seconds"],
            "speedup": speedup,
            "share_of_ceiling": speedup / ceiling,
        }
    return summary


def _error(value):
    return "failed" if value is None else f"{value:.2f}"


def render_table(result):
    """An RST table: per-candidate errors, then the timings."""
    stackings = [s for s, r in result["stacked"].items() if "errors" in r]
    header = ["walker", "visit", "serial error %"] + [f"{s} error %" for s in stackings]
    rows = []
    for i, candidate in enumerate(result["candidates"]):
        row = [str(candidate["walker_weight"]), str(candidate["visit_weight"])]
        row.append(_error(result["serial"]["errors"][i]))
        row += [_error(result["stacked"][s]["errors"][i]) for s in stackings]
        rows.append(row)
    summary, ceiling = result["summary"], result["summary"]["ceiling_speedup"]
    timing = [["serial (8 fits)", f"{summary['serial_seconds']:.1f}", "1.00", "", ""]]
    for stacking in stackings:
        s = summary[stacking]
        cells = [f"{s['seconds']:.1f}", f"{s['speedup']:.2f}", f"{ceiling:.2f}"]
        share = f"{100 * s['share_of_ceiling']:.0f} %"
        timing.append([f"stacked, {stacking}", *cells, share])
    timing_header = ["run", "wall s", "speed-up", "ceiling speed-up"]
    lines = [
        f"{result['steps']} steps per candidate, precision {result['precision']}, "
        f"seed {result['seed']}.",
        "",
        h.rst_table(header, rows, right=False),
        "",
        h.rst_table([*timing_header, "share of ceiling"], timing, right=False),
    ]
    return "\n".join(lines) + "\n"


def measure(args):
    device = h.resolve_device(args.device)
    data = h.mnist_semi(args, args.seed, args.train_subset)
    params = h.scaled_schedule(recipe_params("paper"), args.steps)
    params.update(device=str(device), random_state=args.seed, precision=args.precision)
    result = {
        "environment": h.environment(device),
        "steps": args.steps,
        "seed": args.seed,
        "precision": args.precision,
        "candidates": CANDIDATES,
        "serial": run_serial(params, data, device),
        "stacked": {s: run_stacked(params, data, device, s) for s in STACKINGS},
        "ceiling": run_ceiling(params, data, device),
    }
    result["summary"] = summarize(result)
    return result


def main(argv=None):
    h.measure_main(parse_args(argv), measure, lambda r: render_table(r).rstrip("\n"))


if __name__ == "__main__":
    main()

"""Domain adaptation by association between generated digit domains (GPU).

Two pairs, neither needing a data set beyond MNIST:

``synth-mnist``
    source: ``make_synthetic_digits`` (printed digits on colour backgrounds,
    ``--source-size`` images); target: MNIST (its 60,000 training images
    unlabeled, its 10,000 test images to score).
``mnist-mnistm``
    source: MNIST's training images; target: ``make_mnist_m_like`` of the
    same images (a different texture seed), scored on ``make_mnist_m_like``
    of MNIST's test images.

Both domains are brought to 3x32x32 with ``format_images`` and trained with
the ``"domain_adaptation"`` recipe (the authors' SVHN -> MNIST settings:
SVHN network, 10 source samples per class and 1,000 target samples a step,
Adam 1e-4, 12,000 steps, walker + visit switched on after 500 steps, visit
weight 0.2; 0.6 and random inversion for MNIST -> MNIST-M, as in the
authors' code). For every pair and seed, three models are scored on the
target test set (the last step's weights):

* **source only**: the same recipe and augmentation on the labeled source
  alone, walker and visit weights 0 (what adaptation starts from);
* **adapted**: source labeled, target ``-1``;
* **target only**: the labeled target training images, walker and visit
  weights 0 (the ceiling adaptation aims at without target labels).

The seed draws the synthetic digits, the textures and the network's
initialisation and batches. Figures beside the paper's analogous pairs
(ICCV 2017 "Associative Domain Adaptation": MNIST -> MNIST-M 10.47% error;
synthetic digits -> SVHN 8.14%).

Run (the fits of both pairs and 3 seeds took 16 minutes in all, mostly on
H200s, plus the time to generate the data; pairs can run on separate GPUs
and be merged)::

    python benchmarks/bench_domain_adaptation.py --device cuda
    CUDA_VISIBLE_DEVICES=0 python benchmarks/bench_domain_adaptation.py \\
        --pairs synth-mnist --out a.json &
    CUDA_VISIBLE_DEVICES=1 python benchmarks/bench_domain_adaptation.py \\
        --pairs mnist-mnistm --out b.json; wait
    python benchmarks/bench_domain_adaptation.py --merge a.json b.json
"""

import argparse
import functools
import json
import sys

import numpy as np
from _common import (
    REPO_ROOT,
    default_data_home,
    environment,
    keep_better_run,
    resolve_device,
    run_and_record,
    shortened_schedule,
    summarize,
    text_table,
    write_json,
)

# Benchmark the checkout this script belongs to, installed or not.
sys.path.insert(0, str(REPO_ROOT))

from skassoc import recipe_params  # noqa: E402
from skassoc.datasets import (  # noqa: E402
    format_images,
    load_mnist,
    make_mnist_m_like,
    make_synthetic_digits,
)

RESULTS_DIR = REPO_ROOT / "benchmarks" / "results"

PAIRS = {
    "synth-mnist": {
        "title": "synthetic digits -> MNIST",
        "overrides": {"augmentation": "paper"},
        "paper": None,
    },
    "mnist-mnistm": {
        "title": "MNIST -> MNIST-M-like",
        "overrides": {"visit_weight": 0.6, "augmentation": {"invert_probability": 0.5}},
        # ICCV 2017, MNIST -> MNIST-M (real MNIST-M, photo textures).
        "paper": 10.47,
    },
}
CONDITIONS = ("source only", "adapted", "target only")


def domains(pair, seed, args):
    """``(X_src, y_src, X_tgt, y_tgt, X_tgt_test, y_tgt_test)``, all 3x32x32."""
    mnist = load_mnist("train", data_home=args.data_home, return_X_y=True)
    mnist_test = load_mnist("test", data_home=args.data_home, return_X_y=True)
    if pair == "synth-mnist":
        X_src, y_src = make_synthetic_digits(args.source_size, random_state=seed)
        X_tgt, y_tgt = mnist
        X_test, y_test = mnist_test
    else:
        X_src, y_src = mnist
        X_tgt = make_mnist_m_like(mnist[0], random_state=1000 + seed)
        y_tgt = mnist[1]
        X_test = make_mnist_m_like(mnist_test[0], random_state=2000 + seed)
        y_test = mnist_test[1]
    fmt = dict(size=32, channels=3)
    return (
        format_images(X_src, **fmt),
        np.asarray(y_src),
        format_images(X_tgt, **fmt),
        np.asarray(y_tgt),
        format_images(X_test, **fmt),
        np.asarray(y_test),
    )


def condition_inputs(condition, pair, seed, data, args):
    X_src, y_src, X_tgt, y_tgt, X_test, y_test = data
    params = recipe_params("domain_adaptation")
    params.update(PAIRS[pair]["overrides"], random_state=seed)
    if args.max_iter:
        params = shortened_schedule(params, args.max_iter)
        params["association_delay"] = round(500 * args.max_iter / 12_000)
    if condition == "adapted":
        X = np.concatenate([X_src, X_tgt])
        y = np.concatenate([y_src, np.full(len(X_tgt), -1)])
        return params, X, y, X_test, y_test
    # Without the association losses the unlabeled batch has no effect on
    # training; a small one saves time.
    params.update(walker_weight=0.0, visit_weight=0.0, unlabeled_batch_size=100)
    if condition == "source only":
        return params, X_src, y_src, X_test, y_test
    return params, X_tgt, y_tgt, X_test, y_test


def table(runs):
    rows, records = [], []
    for pair in PAIRS:
        for condition in CONDITIONS:
            done = [
                r
                for r in runs
                if r["pair"] == pair
                and r["condition"] == condition
                and r.get("status") == "ok"
            ]
            if not done:
                continue
            error = summarize([r["test_error_percent"] for r in done])
            seconds = summarize([r["fit_seconds"] for r in done])
            paper = PAIRS[pair]["paper"] if condition == "adapted" else None
            records.append(
                {
                    "pair": pair,
                    "condition": condition,
                    "test_error_percent": error,
                    "fit_seconds": seconds,
                    "paper_analogue": paper,
                }
            )
            rows.append(
                [
                    PAIRS[pair]["title"],
                    condition,
                    len(done),
                    f"{error['median']:.2f}",
                    f"{error['min']:.2f}-{error['max']:.2f}",
                    "n/a" if paper is None else f"{paper:.2f}",
                    f"{seconds['median']:.1f}",
                ]
            )
    header = ["Pair", "Training", "Seeds", "Target error %", "Min-max"]
    header += ["Paper analogue", "Fit s"]
    return records, text_table(header, rows)


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", default="auto")
    parser.add_argument("--data-home", default=None, help="the MNIST folder")
    parser.add_argument("--pairs", nargs="+", choices=list(PAIRS), default=list(PAIRS))
    parser.add_argument(
        "--conditions", nargs="+", choices=CONDITIONS, default=CONDITIONS
    )
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--source-size", type=int, default=60_000)
    parser.add_argument(
        "--max-iter", type=int, default=None, help="shorten the 12,000-step schedule"
    )
    parser.add_argument("--out", default=None)
    parser.add_argument(
        "--merge", nargs="+", default=None, help="merge these result files and exit"
    )
    args = parser.parse_args(argv)
    if len(set(args.seeds)) != len(args.seeds):
        parser.error(f"--seeds holds a seed twice: {args.seeds}")
    return args


def _as_list(value):
    return value if isinstance(value, list) else [value]


def merge(paths, out):
    """Join result files (e.g. one per GPU) into one, refusing mixed settings."""
    parts = [json.loads(open(path).read()) for path in paths]
    # A merged file holds the args of each file it was made from.
    arguments = [a for part in parts for a in _as_list(part.get("args")) if a]
    for name in ("max_iter", "source_size"):
        values = {args[name] for args in arguments if name in args}
        if len(values) > 1:
            flag = "--" + name.replace("_", "-")
            sys.exit(f"cannot merge runs made with different {flag}: {values}")
    runs = {}
    for path, part in zip(paths, parts, strict=True):
        for run in part["runs"]:
            key = (run["pair"], run["condition"], run["seed"])
            earlier = runs.get(key)
            if earlier is not None and earlier.get("params") != run.get("params"):
                sys.exit(f"{path} holds another run of {key} with other parameters")
            # The same run twice (a file merged again) counts once.
            runs[key] = keep_better_run(earlier, run)
    records, text = table(list(runs.values()))
    environments = [env for part in parts for env in _as_list(part["environment"])]
    if out is None:
        device_types = {env.get("device_type") for env in environments}
        if len(device_types) != 1:
            sys.exit(f"runs from devices {device_types}: name the result file, --out")
        out = RESULTS_DIR / f"domain_adaptation_{device_types.pop()}.json"
    merged = {
        "benchmark": "domain_adaptation",
        "environment": environments,
        "args": arguments,
        "runs": list(runs.values()),
        "table": records,
    }
    write_json(out, merged)
    print(text)
    print(f"wrote {out}")


def main(argv=None):
    args = parse_args(argv)
    if args.merge:
        return merge(args.merge, args.out)
    device = resolve_device(args.device)
    args.data_home = args.data_home or default_data_home()
    out = args.out or RESULTS_DIR / f"domain_adaptation_{device.type}.json"
    results = {
        "benchmark": "domain_adaptation",
        "environment": environment(device),
        "args": vars(args),
        "runs": [],
    }
    for pair in args.pairs:
        for seed in args.seeds:
            data = domains(pair, seed, args)
            for condition in args.conditions:
                run_and_record(
                    {"pair": pair, "condition": condition, "seed": seed},
                    functools.partial(
                        condition_inputs, condition, pair, seed, data, args
                    ),
                    results,
                    out,
                    device,
                )
    results["table"], text = table(results["runs"])
    write_json(out, results)
    print(text)
    print(f"wrote {out}")


if __name__ == "__main__":
    main()

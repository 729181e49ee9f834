"""Rerun the semi-supervised SVHN table of "Learning by Association" with skassoc.

Haeusser, Mordvintsev, Cremers, CVPR 2017: test error (%) with 500, 1000 and
2000 labeled training images, 6.25, 5.14 and 4.60 in the paper. Every figure
here is the error of the **last checkpoint** (the fitted model after the last
training step) on the 26,032 SVHN test images: no early stopping and never
the best step on the test set.

Setting (``--labels``) ``L`` keeps ``L / 10`` labels per class of the 73,257
training images, drawn with ``make_semi_supervised_labels(y, L // 10,
random_state=seed)`` for every seed of ``--seeds``; the other training images
are the unlabeled pool (the "extra" set is not used), and the network is
seeded with ``random_state=seed``. The table shows the median and the sample
standard deviation over the seeds and the median wall time of ``fit``
(input validation, copy to the device, CUDA-graph capture and all training
steps; prediction excluded).

Parameters (``PARAMS``): the paper's SVHN network, visit weight 0.25 and
augmentation "paper"; 10 labeled images of every class and 100 unlabeled
ones per step, walker and logit weights 1, L2 1e-4. The paper does not state
its SVHN schedule; the defaults of the authors' ``train.py`` are used:
100,000 steps of Adam at 1e-4, decayed by 0.33 every 60,000 steps.
``--max-iter`` shortens the run and scales the decay interval alike.

The SVHN files ``train_32x32.mat`` and ``test_32x32.mat`` (cropped digits,
format 2, http://ufldl.stanford.edu/housenumbers/) are read from
``--data-home`` (default: ``$SKASSOC_SVHN_DIR``, else
``~/scikit_learn_data/svhn``); nothing is downloaded. The JSON (``--out``,
default ``benchmarks/results/svhn_<device>.json``) holds the machine, library
versions, seeds, parameters, every run and the table, and is rewritten after
every run.

Full run on a GPU::

    python benchmarks/bench_svhn.py --device cuda --seeds 0 1 2

Quick check on a CPU (far from the paper's figures)::

    python benchmarks/bench_svhn.py --device cpu --max-iter 200 --seeds 0 \\
        --labels 1000 --out /tmp/svhn.json
"""

import argparse
import sys
import time
from functools import partial

from _common import (
    REPO_ROOT,
    add_run_arguments,
    environment,
    resolve_device,
    results_table,
    run_and_record,
    shortened_schedule,
    summary_row,
    write_json,
)

# Benchmark the checkout this script belongs to, installed or not.
sys.path.insert(0, str(REPO_ROOT))

from skassoc.datasets import load_svhn, make_semi_supervised_labels  # noqa: E402

N_CLASSES = 10

#: The paper's test error (%) for each number of labeled training images.
PAPER_ERROR = {500: 6.25, 1000: 5.14, 2000: 4.60}

#: Constructor parameters of every run (random_state and device are added).
PARAMS = {
    "network": "svhn",
    "labeled_per_class": 10,
    "unlabeled_batch_size": 100,
    "max_iter": 100_000,
    "learning_rate": 1e-4,
    "lr_decay": 0.33,
    "lr_decay_steps": 60_000,
    "walker_weight": 1.0,
    "visit_weight": 0.25,
    "logit_weight": 1.0,
    "l2_scale": 1e-4,
    "augmentation": "paper",
}

SEED_PROTOCOL = (
    "seed s: make_semi_supervised_labels(y_train, labels // 10, "
    "random_state=s) and random_state=s for the network"
)


def parse_args(argv=None):
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0],
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    add_run_arguments(
        parser,
        "folder with train_32x32.mat and test_32x32.mat (default: "
        "$SKASSOC_SVHN_DIR, else ~/scikit_learn_data/svhn)",
        PARAMS["max_iter"],
    )
    parser.add_argument(
        "--labels",
        default=",".join(str(n) for n in PAPER_ERROR),
        help="comma-separated numbers of labeled training images, multiples "
        "of 10 (default 500,1000,2000)",
    )
    parser.add_argument(
        "--unlabeled-batch-size",
        type=int,
        default=PARAMS["unlabeled_batch_size"],
        help=f"unlabeled images per step (default {PARAMS['unlabeled_batch_size']})",
    )
    parser.add_argument(
        "--out",
        default=None,
        help="JSON file to write (default benchmarks/results/svhn_<device>.json)",
    )
    args = parser.parse_args(argv)
    try:
        args.labels = [int(v) for v in args.labels.split(",") if v.strip()]
    except ValueError:
        parser.error(f"--labels takes integers such as 500,1000; got {args.labels!r}")
    if not args.labels or any(n < N_CLASSES or n % N_CLASSES for n in args.labels):
        parser.error(
            f"--labels must be positive multiples of {N_CLASSES} (labels are "
            f"drawn per class); got {args.labels}"
        )
    if args.max_iter is not None and args.max_iter < 1:
        parser.error("--max-iter must be at least 1")
    if args.unlabeled_batch_size < 1:
        parser.error("--unlabeled-batch-size must be at least 1")
    if len(set(args.seeds)) != len(args.seeds):
        parser.error(f"--seeds must be distinct; got {args.seeds}")
    return args


def load_data(data_home):
    """Train and test sets; exit with a message when the files are missing."""
    try:
        train = load_svhn("train", data_home=data_home)
        test = load_svhn("test", data_home=data_home)
    except FileNotFoundError as exc:
        sys.exit(
            f"error: {exc}\n\nbench_svhn.py needs train_32x32.mat and "
            "test_32x32.mat (SVHN cropped digits, format 2) in one folder; "
            "pass it with --data-home or set SKASSOC_SVHN_DIR."
        )
    return train, test


def run_inputs(train, test, params, per_class, seed):
    """Parameters and data of the run of ``per_class`` labels per class, ``seed``."""
    y_semi = make_semi_supervised_labels(train.target, per_class, random_state=seed)
    run_params = {
        **params,
        # With fewer labels per class than a batch takes, a batch takes them all.
        "labeled_per_class": min(params["labeled_per_class"], per_class),
        "random_state": seed,
    }
    return run_params, train.data, y_semi, test.data, test.target


def main(argv=None):
    argv = sys.argv[1:] if argv is None else list(argv)
    args = parse_args(argv)
    device = resolve_device(args.device)
    out = args.out or REPO_ROOT / "benchmarks" / "results" / f"svhn_{device.type}.json"
    params = {**PARAMS, "unlabeled_batch_size": args.unlabeled_batch_size}
    if args.max_iter is not None:
        params = shortened_schedule(params, args.max_iter)

    start_time = time.perf_counter()
    train, test = load_data(args.data_home)
    meta = {
        **environment(device),
        "benchmark": "svhn",
        "command": " ".join(["bench_svhn.py", *argv]),
        "seeds": args.seeds,
        "seed_protocol": SEED_PROTOCOL,
        "labels": args.labels,
        "params": params,
        "max_iter": params["max_iter"],
        "paper_max_iter": PARAMS["max_iter"],
        "paper_error_percent": PAPER_ERROR,
        "data_home": train.data_home,
        "n_train": int(len(train.target)),
        "n_test": int(len(test.target)),
        "checkpoint": "last (the fitted model); never the best step on the test set",
    }
    results = {"meta": meta, "rows": [], "runs": []}
    print(
        f"device: {meta['device']} | torch {meta['torch']} | train "
        f"{meta['n_train']} | test {meta['n_test']} | steps {params['max_iter']} "
        f"| seeds {args.seeds}",
        flush=True,
    )

    for labels in args.labels:
        per_class = labels // N_CLASSES
        runs = [
            run_and_record(
                {"labels": labels, "seed": seed},
                partial(run_inputs, train, test, params, per_class, seed),
                results,
                out,
                device,
            )
            for seed in args.seeds
        ]
        results["rows"].append(
            summary_row(
                runs,
                "test_error_percent",
                labels=labels,
                labels_per_class=per_class,
                paper=PAPER_ERROR.get(labels),
            )
        )

    meta["wall_seconds"] = time.perf_counter() - start_time
    meta["finished"] = time.strftime("%Y-%m-%d %H:%M:%S %z")
    title = (
        f"SVHN test error (%), last checkpoint after {params['max_iter']} steps; "
        f"{meta['device']}, torch {meta['torch']}, skassoc {meta['skassoc']}"
    )
    table = results_table(
        results["rows"], "labels", "Labels", "test_error_percent", "Error %"
    )
    results["table"] = f"{title}\n{table}"
    write_json(out, results)
    print(f"\n{results['table']}\n\nwrote {out}", flush=True)
    failed = sum(r["status"] != "ok" for r in results["runs"])
    if failed:
        sys.exit(f"error: {failed} of {len(results['runs'])} runs failed; see above")


if __name__ == "__main__":
    main()

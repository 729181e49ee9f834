"""Rerun the STL-10 result of "Learning by Association" with skassoc.

Haeusser, Mordvintsev, Cremers, CVPR 2017: 81% test accuracy on STL-10 with
100 labeled images per class. Every figure here is the accuracy of the
**last checkpoint** (the fitted model after the last training step) on the
8,000 STL-10 test images: no early stopping and never the best step on the
test set.

For every seed of ``--seeds``, ``--labels-per-class`` (default 100) labels of
every class of the 5,000 training images are kept, drawn with
``make_semi_supervised_labels(y_train, k, random_state=seed)``, and the
network is seeded with ``random_state=seed``. The unlabeled pool is the
100,000 unlabeled images plus the training images whose labels were hidden
(``--unlabeled-subset N`` keeps a random N of the 100,000 instead, drawn
with ``numpy.random.RandomState(seed)``; the authors' data loader kept a
random 20,000). The table shows the median and the sample standard deviation
over the seeds and the median wall time of ``fit`` (input validation, copy
to the device, CUDA-graph capture and all training steps; prediction
excluded).

Parameters (``PARAMS``): the paper's STL-10 network (batch norm, ELU, L2
5e-3, as in the authors' code), 10 labeled images of every class and 100 unlabeled ones
per step, walker and logit weights 1. The paper states neither the schedule
nor the visit weight of its STL-10 run; the defaults of the authors'
``train.py`` are used: 100,000 steps of Adam at 1e-4 decayed by 0.33 every
60,000 steps, and visit weight 0 (``--visit-weight`` changes it: the
unlabeled images hold classes that the labeled ones lack, which a visit loss
would pull towards the 10 classes). No augmentation by default: the authors'
STL-10 augmentation (crops, colour changes, flips) is not skassoc's "paper"
augmentation, which ``--augmentation paper`` adds. ``--max-iter`` shortens
the run and scales the decay interval alike.

The binary STL-10 files (``train_X.bin``, ``train_y.bin``, ``test_X.bin``,
``test_y.bin`` and ``unlabeled_X.bin`` from stl10_binary.tar.gz,
https://cs.stanford.edu/~acoates/stl10/) are read from ``--data-home`` or its
``stl10_binary`` folder (default: ``$SKASSOC_STL10_DIR``, else
``~/scikit_learn_data/stl10``); nothing is downloaded. The unlabeled images
are memory-mapped and copied into memory once, together with the training
images, as the training set (about 2.9 GB with all of them). The JSON
(``--out``, default ``benchmarks/results/stl10_<device>.json``) holds the
machine, library versions, seeds, parameters, every run and the table, and
is rewritten after every run.

Full run on a GPU::

    python benchmarks/bench_stl10.py --device cuda --seeds 0 1 2

Quick check on a CPU (far from the paper's figure)::

    python benchmarks/bench_stl10.py --device cpu --max-iter 100 --seeds 0 \\
        --unlabeled-subset 2000 --out /tmp/stl10.json
"""

import argparse
import sys
import time
from functools import partial

import numpy as np
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

from skassoc.datasets import load_stl10, make_semi_supervised_labels  # noqa: E402

#: The paper's test accuracy (%) with 100 labels per class.
PAPER_ACCURACY = {100: 81.0}

#: Constructor parameters of every run (random_state and device are added).
PARAMS = {
    "network": "stl10",
    "labeled_per_class": 10,
    "unlabeled_batch_size": 100,
    "max_iter": 100_000,
    "learning_rate": 1e-4,
    "lr_decay": 0.33,
    "lr_decay_steps": 60_000,
    "walker_weight": 1.0,
    "visit_weight": 0.0,
    "logit_weight": 1.0,
    "l2_scale": 5e-3,
    "augmentation": None,
}

SEED_PROTOCOL = (
    "seed s: make_semi_supervised_labels(y_train, labels_per_class, "
    "random_state=s), the --unlabeled-subset draw from RandomState(s), and "
    "random_state=s for the network"
)


def parse_args(argv=None):
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0],
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    add_run_arguments(
        parser,
        "folder with the STL-10 .bin files or their stl10_binary folder "
        "(default: $SKASSOC_STL10_DIR, else ~/scikit_learn_data/stl10)",
        PARAMS["max_iter"],
    )
    parser.add_argument(
        "--labels-per-class",
        type=int,
        default=100,
        help="labeled training images of every class (default 100, the paper)",
    )
    parser.add_argument(
        "--unlabeled-subset",
        type=int,
        default=None,
        help="use a random N of the 100,000 unlabeled images (default: all)",
    )
    parser.add_argument(
        "--unlabeled-batch-size",
        type=int,
        default=PARAMS["unlabeled_batch_size"],
        help=f"unlabeled images per step (default {PARAMS['unlabeled_batch_size']})",
    )
    parser.add_argument(
        "--visit-weight",
        type=float,
        default=PARAMS["visit_weight"],
        help=f"weight of the visit loss (default {PARAMS['visit_weight']:g})",
    )
    parser.add_argument(
        "--augmentation",
        choices=["none", "paper"],
        default="none",
        help="skassoc's augmentation of both batches (default none)",
    )
    parser.add_argument(
        "--out",
        default=None,
        help="JSON file to write (default benchmarks/results/stl10_<device>.json)",
    )
    args = parser.parse_args(argv)
    for name in ("max_iter", "labels_per_class", "unlabeled_subset"):
        value = getattr(args, name)
        if value is not None and value < 1:
            parser.error(f"--{name.replace('_', '-')} must be at least 1")
    if args.unlabeled_batch_size < 1:
        parser.error("--unlabeled-batch-size must be at least 1")
    if args.visit_weight < 0:
        parser.error("--visit-weight must be at least 0")
    if len(set(args.seeds)) != len(args.seeds):
        parser.error(f"--seeds must be distinct; got {args.seeds}")
    return args


def load_data(data_home):
    """Train, test and (memory-mapped) unlabeled sets; exit when files miss."""
    try:
        train = load_stl10("train", data_home=data_home)
        test = load_stl10("test", data_home=data_home)
        unlabeled = load_stl10("unlabeled", data_home=data_home)
    except FileNotFoundError as exc:
        sys.exit(
            f"error: {exc}\n\nbench_stl10.py needs train_X.bin, train_y.bin, "
            "test_X.bin, test_y.bin and unlabeled_X.bin (STL-10, binary "
            "version) in one folder or its stl10_binary subfolder; pass it "
            "with --data-home or set SKASSOC_STL10_DIR."
        )
    return train, test, unlabeled


def run_inputs(train, test, unlabeled, params, per_class, subset, seed):
    """Parameters and data of the run of ``seed``.

    The training set is the training images (all but ``per_class`` of every
    class unlabeled) followed by the unlabeled images (all of them, or a
    random ``subset``), copied into memory from the memory map.
    """
    y_semi = make_semi_supervised_labels(train.target, per_class, random_state=seed)
    n_unlabeled = len(unlabeled.data)
    if subset is not None and subset < n_unlabeled:
        rng = np.random.RandomState(seed)
        keep = np.sort(rng.choice(n_unlabeled, subset, replace=False))
        extra = unlabeled.data[keep]
    else:
        extra = unlabeled.data
    X = np.concatenate([train.data, extra])
    y = np.concatenate([y_semi, np.full(len(extra), -1, dtype=y_semi.dtype)])
    run_params = {
        **params,
        # With fewer labels per class than a batch takes, a batch takes them all.
        "labeled_per_class": min(params["labeled_per_class"], per_class),
        "random_state": seed,
    }
    return run_params, X, y, test.data, test.target


def main(argv=None):
    argv = sys.argv[1:] if argv is None else list(argv)
    args = parse_args(argv)
    device = resolve_device(args.device)
    out = args.out or REPO_ROOT / "benchmarks" / "results" / f"stl10_{device.type}.json"
    params = {
        **PARAMS,
        "unlabeled_batch_size": args.unlabeled_batch_size,
        "visit_weight": args.visit_weight,
        "augmentation": None if args.augmentation == "none" else args.augmentation,
    }
    if args.max_iter is not None:
        params = shortened_schedule(params, args.max_iter)

    start_time = time.perf_counter()
    train, test, unlabeled = load_data(args.data_home)
    n_unlabeled = len(unlabeled.data)
    if args.unlabeled_subset is not None:
        n_unlabeled = min(n_unlabeled, args.unlabeled_subset)
    per_class = args.labels_per_class
    meta = {
        **environment(device),
        "benchmark": "stl10",
        "command": " ".join(["bench_stl10.py", *argv]),
        "seeds": args.seeds,
        "seed_protocol": SEED_PROTOCOL,
        "labels_per_class": per_class,
        "params": params,
        "max_iter": params["max_iter"],
        "paper_max_iter": PARAMS["max_iter"],
        "paper_accuracy_percent": PAPER_ACCURACY,
        "data_home": train.data_home,
        "n_train": int(len(train.target)),
        "n_unlabeled_file": int(len(unlabeled.data)),
        "n_unlabeled_used": int(n_unlabeled),
        "n_test": int(len(test.target)),
        "checkpoint": "last (the fitted model); never the best step on the test set",
    }
    results = {"meta": meta, "rows": [], "runs": []}
    print(
        f"device: {meta['device']} | torch {meta['torch']} | train "
        f"{meta['n_train']} + unlabeled {n_unlabeled} | test {meta['n_test']} | "
        f"steps {params['max_iter']} | seeds {args.seeds}",
        flush=True,
    )

    runs = [
        run_and_record(
            {"labels_per_class": per_class, "seed": seed},
            partial(
                run_inputs,
                train,
                test,
                unlabeled,
                params,
                per_class,
                args.unlabeled_subset,
                seed,
            ),
            results,
            out,
            device,
        )
        for seed in args.seeds
    ]
    results["rows"].append(
        summary_row(
            runs,
            "test_accuracy_percent",
            labels_per_class=per_class,
            paper=PAPER_ACCURACY.get(per_class),
        )
    )

    meta["wall_seconds"] = time.perf_counter() - start_time
    meta["finished"] = time.strftime("%Y-%m-%d %H:%M:%S %z")
    title = (
        f"STL-10 test accuracy (%), last checkpoint after {params['max_iter']} "
        f"steps; {meta['device']}, torch {meta['torch']}, skassoc {meta['skassoc']}"
    )
    table = results_table(
        results["rows"],
        "labels_per_class",
        "Labels per class",
        "test_accuracy_percent",
        "Accuracy %",
    )
    results["table"] = f"{title}\n{table}"
    write_json(out, results)
    print(f"\n{results['table']}\n\nwrote {out}", flush=True)
    failed = sum(r["status"] != "ok" for r in results["runs"])
    if failed:
        sys.exit(f"error: {failed} of {len(results['runs'])} runs failed; see above")


if __name__ == "__main__":
    main()

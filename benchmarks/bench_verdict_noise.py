"""How often does ``fit_report_`` call a perfect fit suspect? Share noise alone.

A perfect fit predicts every unlabeled sample's true class, so that only
the sampling noise of the class shares can make its verdict "suspect".
Each row simulates such fits: ``n`` unlabeled samples drawn from ``k``
equally frequent classes and predicted exactly, checked against the
classes' shares as given (``class_prior``) or against the shares of ``m``
labels drawn at random (``class_prior="auto"`` with unequal counts). The
share flagged is the verdict's share rule as ``fit`` applies it
(``class_share_scores`` and ``is_suspect``, with the number of classes;
simulated predictions have no inputs to clear a class). Beside it, the
rule on the textbook normal score (the excess over the standard error of
the expected share), which skewed counts of small classes and the
under-counted classes of random labels push far above the rate the
threshold intends. ``docs/benchmarks/trust.rst`` shows the table::

    python benchmarks/bench_verdict_noise.py
    python benchmarks/bench_verdict_noise.py --trials 200 --no-save  # a first look
    python benchmarks/bench_verdict_noise.py --render-only
"""

import math
import sys
import tempfile
import time
from pathlib import Path
from statistics import NormalDist

import _harness as h
import numpy as np

from skassoc._diagnosis import (
    SHARE_EXCESS_Z,
    SHARE_Z_CLASSES,
    class_share_scores,
    is_suspect,
)

#: ``(classes, unlabeled samples, labels drawn at random or None)`` of each
#: row: given shares over the sizes where counts are small or large, then
#: shares of random labels.
CASES = (
    (2, 50, None),
    (10, 100, None),
    (10, 1_000, None),
    (10, 50_000, None),
    (20, 100, None),
    (20, 400, None),
    (100, 500, None),
    (100, 2_000, None),
    (3, 1_000, 30),
    (10, 500, 50),
    (10, 5_000, 200),
    (10, 50_000, 1_000),
    (20, 400, 100),
)
#: Simulated fits of each row.
TRIALS = 2_000


def normal_z(shares, expected, worst, n, m):
    """The excess in standard errors of the expected share (and of the
    labels' share, with ``m`` random labels): the textbook approximation."""
    variance = max(expected[worst] * (1 - expected[worst]), 1e-12)
    noise = math.sqrt(variance / n + (variance / m if m else 0))
    return (shares[worst] - expected[worst]) / noise


def simulate(k, n, m, trials, rng):
    """Flagged fits among ``trials``: by the verdict, by the normal score."""
    truth = np.full(k, 1 / k)
    flagged = {"verdict": 0, "normal": 0}
    for _ in range(trials):
        expected = truth if m is None else rng.multinomial(m, truth) / m
        proba = np.eye(k)[rng.integers(0, k, n)]
        shares, worst, _, z = class_share_scores(proba, expected, m)
        ratio = shares[worst] / expected[worst] if expected[worst] else math.inf
        scores = {"class_share_ratio": ratio, "class_share_z": z}
        flagged["verdict"] += int(is_suspect(scores, k))
        scores["class_share_z"] = normal_z(shares, expected, worst, n, m)
        flagged["normal"] += int(is_suspect(scores, k))
    return flagged


def measure(args):
    import torch

    rng = np.random.default_rng(0)
    start = time.perf_counter()
    rows = []
    for k, n, m in CASES:
        flagged = simulate(k, n, m, args.trials, rng)
        rows.append({"classes": k, "unlabeled": n, "labels": m, **flagged})
        print(rows[-1], flush=True)
    command = " ".join(["python benchmarks/bench_verdict_noise.py", *args.argv])
    meta = h.extended_meta({}, torch.device("cpu"), command)
    seconds = round(time.perf_counter() - start, 1)
    return {"meta": meta, "trials": args.trials, "seconds": seconds, "rows": rows}


def render(results):
    trials = results["trials"]
    # The threshold's own rate: ten classes' chance that one passes it.
    intended = SHARE_Z_CLASSES * NormalDist().cdf(-SHARE_EXCESS_Z)
    cells = [
        [
            str(row["classes"]),
            f"{row['unlabeled']:,}",
            "given" if row["labels"] is None else f"{row['labels']:,} random labels",
            f"{100 * row['verdict'] / trials:.1f}",
            f"{100 * row['normal'] / trials:.1f}",
        ]
        for row in results["rows"]
    ]
    header = ["classes", "unlabeled samples", "expected shares"]
    header += ["suspect %: the verdict", "suspect %: normal score"]
    return (
        ".. rubric:: Perfect fits that look suspect\n\n"
        f"Each row: {trials:,} simulated perfect fits (every unlabeled sample "
        "predicted as its class, the classes equally frequent), the share that "
        "the verdict's share rule flags, and the share it would flag on the "
        "excess over the normal standard error of the expected share. The "
        f"threshold aims at about {100 * intended:.1f} %: the chance that one of "
        f"{SHARE_Z_CLASSES} classes passes {SHARE_EXCESS_Z:g} standard errors "
        "(more classes raise it to keep that chance). Made by "
        f"{h.commands_text(results['meta'])}.\n\n{h.rst_table(header, cells)}"
    )


def parse_args(argv):
    parser = h.make_parser(__doc__.splitlines()[0], "verdict_noise", cases=False)
    parser.set_defaults(device="cpu")
    add = parser.add_argument
    add("--trials", type=h.bounded_int(10), default=TRIALS, help=f"default {TRIALS}")
    add("--no-save", action="store_true", help="keep no files (a temporary folder)")
    args = h.parse(parser, argv)
    if args.device != "cpu":
        parser.error("the benchmark runs on a CPU: leave out --device")
    args.argv = argv
    return args


def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    args = parse_args(argv)
    if args.no_save:
        folder = Path(tempfile.mkdtemp(prefix="skassoc-bench-"))
        args.json = str(folder / "verdict_noise_cpu.json")
        args.table = str(folder / "verdict_noise_cpu.rst")
    return h.measure_main(args, measure, render)


if __name__ == "__main__":
    main()

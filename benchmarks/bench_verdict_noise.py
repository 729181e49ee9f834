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
threshold intends. The last two columns measure what the rules are for:
the same fits with a fifth of one class's samples predicted as another
class. ``docs/benchmarks/trust.rst`` shows the table::

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
#: The share of one class's samples that a failed fit hands to another (a
#: style of the class that no label shows), in the rows' second columns.
HANDED_OVER = 0.2


def normal_z(shares, expected, worst, n, m):
    """The excess in standard errors of the expected share (and of the
    labels' share, with ``m`` random labels): the textbook approximation."""
    variance = max(expected[worst] * (1 - expected[worst]), 1e-12)
    noise = math.sqrt(variance / n + (variance / m if m else 0))
    return (shares[worst] - expected[worst]) / noise


def _flags(predicted, k, expected, m):
    """Whether the verdict, and the rule on the normal score, flag a fit
    that predicts ``predicted``."""
    shares, worst, _, z = class_share_scores(np.eye(k)[predicted], expected, m)
    ratio = shares[worst] / expected[worst] if expected[worst] else math.inf
    scores = {"class_share_ratio": ratio, "class_share_z": z}
    normal = dict(
        scores, class_share_z=normal_z(shares, expected, worst, n=len(predicted), m=m)
    )
    return int(is_suspect(scores, k)), int(is_suspect(normal, k))


def simulate(k, n, m, trials, rng):
    """Flagged fits among ``trials``, by the verdict and by the normal
    score: perfect fits, and fits that hand :data:`HANDED_OVER` of class 0's
    samples to class 1."""
    truth = np.full(k, 1 / k)
    flagged = dict.fromkeys(("verdict", "normal", "failed_verdict", "failed_normal"), 0)
    for _ in range(trials):
        expected = truth if m is None else rng.multinomial(m, truth) / m
        predicted = rng.integers(0, k, n)
        verdict, normal = _flags(predicted, k, expected, m)
        flagged["verdict"] += verdict
        flagged["normal"] += normal
        style = (predicted == 0) & (rng.random(n) < HANDED_OVER)
        verdict, normal = _flags(np.where(style, 1, predicted), k, expected, m)
        flagged["failed_verdict"] += verdict
        flagged["failed_normal"] += normal
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
    command = h.command_line(
        "benchmarks/bench_verdict_noise.py", args.argv, python=True
    )
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
            *(
                f"{100 * row[key] / trials:.1f}"
                for key in ("verdict", "normal", "failed_verdict", "failed_normal")
            ),
        ]
        for row in results["rows"]
    ]
    header = ["classes", "unlabeled samples", "expected shares"]
    header += ["perfect fit: verdict %", "perfect fit: normal score %"]
    header += ["style handed over: verdict %", "style handed over: normal score %"]
    return (
        ".. rubric:: Perfect fits that look suspect\n\n"
        f"Each row: {trials:,} simulated perfect fits (every unlabeled sample "
        "predicted as its class, the classes equally frequent), the share that "
        "the verdict's share rule flags, and the share it would flag on the "
        "excess over the normal standard error of the expected share; then the "
        f"same for fits that hand {100 * HANDED_OVER:.0f} % of one class's samples to "
        "another (a style no label shows), from the same draws. The "
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

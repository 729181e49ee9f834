"""Is a failed few-label fit the labels' doing or the seed's? MNIST, recipe "fast".

Each label draw ``d`` (10 labels a class, drawn as ``bench_trust.py`` draws
them) is fitted with ``--seeds`` training seeds ``1000 k + d`` (``k`` = 1,
2, ...), the labels unchanged: if a failed draw fails whatever the seed, no
choice among seeds (an ensemble voted by ``fit_report_``, a refit) repairs
it without new labels. Each fit's test error and ``fit_report_`` verdict go
to ``benchmarks/results/trust_seeds_<device>.json`` and the table to
``trust_seeds_<device>.rst``::

    python benchmarks/bench_trust_seeds.py --draws 2,3,17,30,33,36,0,1
    python benchmarks/bench_trust_seeds.py --render-only
"""

import argparse
import warnings

import _harness as h
from bench_trust import FAILING_ABOVE, fit_one, parse_draws

#: The recipe the fits use.
RECIPE = "fast"


def run_draw(draw, seeds, data, device):
    """The fits of one label draw, one for each ``k`` of ``seeds`` (seed
    ``1000 k + draw``); ``seeds`` an int means 1 to ``seeds``."""
    from skassoc import recipe_params
    from skassoc.datasets import make_semi_supervised_labels

    (X, y), (X_test, y_test) = data
    y_semi = make_semi_supervised_labels(y, 10, random_state=draw)
    fits = []
    for k in range(1, seeds + 1) if isinstance(seeds, int) else seeds:
        params = {**recipe_params(RECIPE), "device": device}
        params["random_state"] = 1000 * k + draw
        with warnings.catch_warnings():
            # The verdict is recorded; its warning would repeat it.
            warnings.simplefilter("ignore")
            clf, seconds, error = fit_one(params, X, y_semi, X_test, y_test)
        report = clf.fit_report_
        fits.append(
            {
                "draw": draw,
                "seed": params["random_state"],
                "precision": h.resolved_precision(params, device, images=True),
                "test_error_percent": error,
                "verdict": report.verdict,
                "class_share_ratio": report.scores["class_share_ratio"],
            }
        )
        print(f"draw {draw} seed {fits[-1]['seed']}: {error:.2f} % ({report.verdict})")
    return fits


def render(results):
    rows = []
    by_draw = {}
    for fit in results["runs"].values():
        by_draw.setdefault(fit["draw"], []).append(fit)
    for draw, fits in sorted(by_draw.items()):
        fits.sort(key=lambda fit: fit["seed"])
        errors = [f["test_error_percent"] for f in fits]
        failed = [e > FAILING_ABOVE for e in errors]
        rows.append(
            [
                str(draw),
                ", ".join(h.fmt(e) for e in errors),
                f"{sum(failed)} / {len(fits)}",
                ", ".join(f["verdict"] for f in fits),
                ", ".join(h.fmt(f["class_share_ratio"], 3) for f in fits),
            ]
        )
    table = h.rst_table(
        [
            "label draw",
            "test error % by seed",
            f"fits above {FAILING_ABOVE} %",
            "verdicts",
            "class_share_ratio",
        ],
        rows,
    )
    meta = results["meta"]
    ks = sorted({fit["seed"] // 1000 for fit in results["runs"].values()})
    return (
        f'.. rubric:: The same labels, other seeds (recipe "{RECIPE}")\n\n'
        "Each label draw fitted again with training seeds 1000 k + draw, "
        f"k = {', '.join(map(str, ks))}. Made by "
        + h.commands_text(meta)
        + f". {meta.get('runs_note', '')}\n\n{table}\n"
    )


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cuda", choices=("cuda", "cpu"))
    parser.add_argument("--draws", type=parse_draws, default=parse_draws("0-9"))
    parser.add_argument("--seeds", type=h.bounded_int(1, 100), default=3)
    parser.add_argument("--data-home", default=None)
    parser.add_argument("--render-only", action="store_true")
    args = parser.parse_args(argv)
    path = h.RESULTS_DIR / f"trust_seeds_{args.device}.json"
    results = h.runs_file(parser, path, args.render_only)
    if not args.render_only:
        import torch

        device = torch.device(args.device)
        data = h.load_mnist_sets(args.data_home)
        for draw in args.draws:
            # Resumes: only the seeds a draw has not been fitted with.
            todo = [
                k
                for k in range(1, args.seeds + 1)
                if f"{draw}/{1000 * k + draw}" not in results["runs"]
            ]
            for fit in run_draw(draw, todo, data, args.device):
                results["runs"][f"{draw}/{fit['seed']}"] = fit
        h.save_results(path, results, "bench_trust_seeds.py", argv, device)
    h.publish_table(path, render(results))


if __name__ == "__main__":
    main()

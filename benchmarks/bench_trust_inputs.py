"""Does the inputs' opinion clear ``fit_report_``'s false alarms and no failed fit?

``fit_report_``'s verdict clears a class share excess when the labels
spread over the inputs agree with the excess class's predictions clearly
better than with the other classes' (``excess_class_input_disagreement``).
The score depends on the fit only through its predictions, so this script
works in two steps:

1. ``--fit OUT``, on a GPU: fits recipes on MNIST label draws (10 labels a
   class, ``random_state=d``) and keeps each fit's predictions of the
   training images, its test error and its ``fit_report_`` (``OUT.npz``,
   ``OUT.json``);
2. on a CPU, from those files: recomputes the score with skassoc's own
   functions (the report's samples and seed) and the verdict from it, and
   writes ``benchmarks/results/trust_inputs_replay.json`` and its table::

    python benchmarks/bench_trust_inputs.py --fit preds --jobs fast/0,fast/1
    python benchmarks/bench_trust_inputs.py preds other_preds
"""

import argparse
import math

import _harness as h
import numpy as np
from bench_trust import FAILING_ABOVE, draw_spans, roc_auc

from skassoc._diagnosis import (
    FREQUENT_CLASS_MARGIN,
    _input_disagreement,
    graph_step,
    is_suspect,
    largest_excess,
    report_samples,
    share_excess,
)
from skassoc._input_view import spread_labels
from skassoc._settings import fit_seed
from skassoc.datasets import make_semi_supervised_labels

SCORE = "excess_class_input_disagreement"


def fit(out, jobs):
    """Fit each ``recipe/draw`` of ``jobs`` on the GPU; keep its predictions."""
    from skassoc import SemiSupervisedAssociationClassifier, recipe_params

    (X, y), (X_test, y_test) = h.load_mnist_sets()
    arrays, runs = {}, {}
    for recipe, draw in (job.split("/") for job in jobs):
        y_semi = make_semi_supervised_labels(y, 10, random_state=int(draw))
        params = {**recipe_params(recipe), "random_state": int(draw), "device": "cuda"}
        clf = SemiSupervisedAssociationClassifier(**params).fit(X, y_semi)
        key = f"{recipe}_{draw}"
        arrays[key + "_pred"] = clf.predict(X).astype(np.int8)
        runs[key] = {
            "err": h.error_percent(clf.predict(X_test), y_test),
            "report": clf.fit_report_.to_dict(),
        }
        # Written after every fit: a command stopped at its time limit
        # keeps the fits it made.
        np.savez_compressed(out + ".npz", **arrays)
        h.write_json(h.Path(out + ".json"), runs)
        print(key, f"{runs[key]['err']:.2f} %", flush=True)


def replay(prefixes):
    """Each saved fit's score and verdicts, recomputed on the CPU."""
    (X, y), _ = h.load_mnist_sets()
    runs = {}
    for prefix in prefixes:
        arrays = np.load(prefix + ".npz")
        for key, fitted in h.load_json(prefix + ".json").items():
            if key + "_pred" not in arrays:
                continue
            recipe, draw = key.split("_")
            runs[f"{recipe}/{draw}"] = _replayed(
                recipe, int(draw), fitted, arrays[key + "_pred"].astype(int), X, y
            )
    return runs


def _replayed(recipe, draw, fitted, predicted, X, y):
    encoded = make_semi_supervised_labels(y, 10, random_state=draw)
    seed = fit_seed(draw)  # the seed the fit's report used
    labeled, unlabeled = report_samples(encoded, seed)
    graph = unlabeled[:: graph_step(len(unlabeled))]
    spread = spread_labels(lambda rows: X[rows], labeled, encoded[labeled], graph, seed)
    report = fitted["report"]
    excess = largest_excess(report["predicted_shares"], report["expected_shares"])
    n_classes = len(report["predicted_shares"]) or None
    score = _input_disagreement(spread, predicted[graph], excess)
    return {
        "recipe": recipe,
        "draw": draw,
        "test_error_percent": fitted["err"],
        "score": score,
        "shares_alone": bool(share_excess(report["scores"], n_classes)),
        "verdict": bool(is_suspect({**report["scores"], SCORE: score}, n_classes)),
        "verdict_at_fit": report["verdict"] == "suspect",
    }


def _count(runs, key):
    return f"{sum(r[key] for r in runs)} / {len(runs)}"


def rows(runs, failing_above=FAILING_ABOVE):
    table = []
    for recipe in sorted({r["recipe"] for r in runs}):
        mine = [r for r in runs if r["recipe"] == recipe]
        bad = [r for r in mine if r["test_error_percent"] > failing_above]
        good = [r for r in mine if r["test_error_percent"] <= failing_above]
        flagged_good = [r["score"] for r in good if r["shares_alone"]]
        table.append(
            [
                recipe,
                str(len(mine)),
                _count(bad, "shares_alone"),
                _count(good, "shares_alone"),
                _count(bad, "verdict_at_fit"),
                _count(good, "verdict_at_fit"),
                _count(bad, "verdict"),
                _count(good, "verdict"),
                h.fmt(min((r["score"] for r in bad), default=math.nan), 3),
                h.fmt(max(flagged_good, default=math.nan), 3),
                h.fmt(roc_auc([r["score"] for r in bad], [r["score"] for r in good])),
            ]
        )
    return table


def render(results):
    runs = list(results["runs"].values())
    header = [
        "recipe", "draws", "shares alone: failed", "shares alone: good",
        "verdict at fit: failed", "verdict at fit: good",
        "verdict: failed", "verdict: good",
        "score: lowest failed", "score: highest flagged good", "AUC score",
    ]  # fmt: skip
    draws = {
        recipe: draw_spans(r["draw"] for r in runs if r["recipe"] == recipe)
        for recipe in sorted({r["recipe"] for r in runs})
    }
    return (
        ".. rubric:: The inputs' opinion, replayed on the fits' predictions\n\n"
        f"MNIST, 10 labels a class; a draw fails when its test error is above "
        f"{FAILING_ABOVE} %. Flagged draws (failed, then good ones): by the share "
        "rule alone, by the verdict the fit reported (the walks' margin), and by "
        f"the verdict with {SCORE} (below -{FREQUENT_CLASS_MARGIN} clears a share "
        f"excess), recomputed from each fit's predictions. Draws: "
        + "; ".join(f"{k} {v}" for k, v in draws.items())
        + f". Made by {h.commands_text(results['meta'])}. "
        + results["meta"].get("fits_note", "")
        + "\n\n"
        + h.rst_table(header, rows(runs))
        + "\n"
    )


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("predictions", nargs="*", help="prefixes of --fit's files")
    parser.add_argument("--fit", metavar="OUT", help="fit on the GPU, write OUT.*")
    parser.add_argument("--jobs", default="", help="recipe/draw,... for --fit")
    default = h.RESULTS_DIR / "trust_inputs_replay.json"
    parser.add_argument("--json", default=str(default))
    args = parser.parse_args(argv)
    if args.fit:
        return fit(args.fit, [j for j in args.jobs.split(",") if j])
    path = h.Path(args.json)
    results = h.load_json(path) if path.exists() else {"meta": {}}
    if args.predictions:
        import torch

        # New replays replace the runs; the notes on how the fits were made stay.
        results["runs"] = replay(args.predictions)
        cpu = torch.device("cpu")
        h.save_results(path, results, "bench_trust_inputs.py", argv, cpu)
    h.publish_table(path, render(results))


if __name__ == "__main__":
    main()

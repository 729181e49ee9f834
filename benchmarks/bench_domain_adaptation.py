"""Domain adaptation by association between generated digit domains.

Two pairs of domains made from MNIST, each fitted on the source only, adapted
and on the target only; ``docs/benchmarks/domain_adaptation.rst`` says what
the table measures::

    python benchmarks/bench_domain_adaptation.py --device cuda
    python benchmarks/bench_domain_adaptation.py --device cuda --render-only
"""

import functools

import _harness as h
import numpy as np

from skassoc import recipe_params
from skassoc.datasets import format_images, make_mnist_m_like, make_synthetic_digits

#: pair -> (title, overrides of the recipe, the paper's error %).
PAIRS = {
    "synth-mnist": ("synthetic digits -> MNIST", {"augmentation": "paper"}, ""),
    "mnist-mnistm": (
        "MNIST -> MNIST-M-like",
        {"visit_weight": 0.6, "augmentation": {"invert_probability": 0.5}},
        "10.47",  # ICCV 2017, MNIST -> MNIST-M (real MNIST-M, photo textures).
    ),
}
#: Without the association losses the unlabeled batch has no effect on
#: training; a small one saves time.
SUPERVISED = {"walker_weight": 0.0, "visit_weight": 0.0, "unlabeled_batch_size": 100}


def _case(pair, condition):
    _, overrides, paper = PAIRS[pair]
    adapted = condition == "adapted"
    params = recipe_params("domain_adaptation") | overrides
    params |= {} if adapted else SUPERVISED
    row = pair, condition, "all", params, 3, condition, paper if adapted else ""
    return h.Case(*row, fit_on=condition, options={"pair": pair})


CASES = [
    _case(pair, condition)
    for pair in PAIRS
    for condition in ("source only", "adapted", "target only")
]


class Domains:
    """The 3x32x32 images of a pair and seed, made once each."""

    def __init__(self, args):
        self.mnist, self.mnist_test = h.load_mnist_sets(args.data_home)

    @functools.lru_cache(maxsize=1)  # noqa: B019 (one instance a process)
    def __call__(self, pair, seed, source_size):
        (X_mnist, y_mnist), (X_test, y_test) = self.mnist, self.mnist_test
        if pair == "synth-mnist":
            X_src, y_src = make_synthetic_digits(source_size, random_state=seed)
            X_tgt, y_tgt = X_mnist, y_mnist
        else:
            X_src, y_src = X_mnist, y_mnist
            X_tgt = make_mnist_m_like(X_mnist, random_state=1000 + seed)
            y_tgt = y_mnist
            X_test = make_mnist_m_like(X_test, random_state=2000 + seed)
        images = [format_images(X, size=32, channels=3) for X in (X_src, X_tgt, X_test)]
        labels = [np.asarray(y) for y in (y_src, y_tgt, y_test)]
        return images, labels


def fit(config, domains, device):
    params = dict(config["params"])
    # Quick runs switch the association on after the same fraction of steps.
    params["association_delay"] = round(500 * min(1, params["max_iter"] / 12_000))
    seed = params["random_state"]
    images, labels = domains(config["pair"], seed, config["source_size"])
    (X_src, X_tgt, X_test), (y_src, y_tgt, y_test) = images, labels
    X, y = {
        "source only": (X_src, y_src),
        "target only": (X_tgt, y_tgt),
        "adapted": (
            np.concatenate([X_src, X_tgt]),
            np.concatenate([y_src, np.full(len(X_tgt), -1)]),
        ),
    }[config["fit_on"]]
    return h.fit_estimator(params, X, y, X_test, y_test, device)


def render(results):
    notes = [
        "Target test error (%) of the last step's weights; median, sample "
        "standard deviation and range over the seeds; fit s: median wall time "
        "of fit(). Paper: Associative Domain Adaptation (ICCV 2017) on real "
        "MNIST-M, an analogue only."
    ]
    parts = [
        (pair, title, f"Pair {pair}.", h.TABLE_HEADER, h.table_cells)
        for pair, (title, _, _) in PAIRS.items()
    ]
    return h.render_parts(results, "Domain adaptation", notes, parts)


def parse_args(argv=None):
    parser = h.make_parser(__doc__.split("\n\n")[0], "domain_adaptation")
    size = h.bounded_int(1)
    parser.add_argument("--source-size", type=size, default=60_000)
    return h.parse(parser, argv)


def main(argv=None):
    args = parse_args(argv)
    common = {"source_size": args.source_size}
    return h.main(CASES, args, fit, render, Domains, common)


if __name__ == "__main__":
    main()

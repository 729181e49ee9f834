"""Rerun the MNIST experiments of "Learning by Association" with skassoc.

Haeusser, Mordvintsev, Cremers, CVPR 2017. :data:`CASES` are the rows of the
tables in ``docs/benchmarks/mnist.rst``, whose notes say what they measure.
Rerun (part of) them, skipping the runs the JSON holds; rebuild every table from
``benchmarks/results/mnist_cuda.json``; a quick check on a CPU::

    python benchmarks/bench_mnist.py --device cuda --only 'recipes/*'
    python benchmarks/bench_mnist.py --device cuda --render-only
    python benchmarks/bench_mnist.py --device cpu --only 'table1/*/100' \\
        --draws 1 --max-iter 20 --train-subset 3000 --eval-subset 1000 \\
        --json /tmp/m.json
"""

import functools
import time

import _harness as h
import numpy as np

from skassoc import recipe_params
from skassoc.datasets import make_semi_supervised_labels

#: Labels per class of each setting (None: all labels, ``y`` as is).
LABELS_PER_CLASS = {"100": 10, "1000": 100, "all": None}
#: The paper's figures: median (std) test error %.
PAPER_TABLE1 = {"100": "0.89 (0.08)", "1000": "0.74 (0.03)", "all": "0.36 (0.03)"}
PAPER_VISIT = {0.0: "5.68", 0.25: "1.17", 0.5: "0.82", 1.0: "0.85"}
#: Recipes "improved" and "consistency" were chosen on draws 0-9; the
#: recipes table shows the later draws apart.
SELECTION_DRAWS = 10
#: Steps between test-set evaluations of the "checkpoints" part.
CHECKPOINT_INTERVAL = 500
SUBSET_SEED = 12345  # of the --train-subset draw
MNIST_CLASSES = 10
#: Seed of the training labels that estimate class_prior (not in the runs'
#: configurations: a new seed needs new rows, or resuming keeps the old runs).
PRIOR_SAMPLE_SEED = 6789
PCA_COMPONENTS = 50
LABEL_SPREADING = {"kernel": "knn", "n_neighbors": 10, "alpha": 0.2, "max_iter": 30}
SELF_TRAINING = {"threshold": 0.75, "max_iter": 10}
SELF_TRAINING_BASE = {"C": 1.0, "max_iter": 1000}

MILD = {"affine_std": 0.05, "translate_std": 1.0, "blur_probability": 0.0}
MEDIUM = {"affine_std": 0.1, "translate_std": 1.5, "blur_probability": 0.0}
LABELED = {"unlabeled": False}
IMPROVED = {"augmentation": LABELED, "visit_weight": 1.5}
STEPS_12K = {"max_iter": 12_000, "lr_decay_steps": 3_000}
MILD_VISIT = {"augmentation": {**MILD, **LABELED}, "visit_weight": 1.5}
IMPROVED_12K = {"augmentation": LABELED, "visit_weight": 1.5, **STEPS_12K}

#: Overrides of recipe "paper", one row of the ablations table each.
ABLATIONS = {
    "+mild labeled augmentation": {"augmentation": {**MILD, **LABELED}},
    "+mild labeled augmentation+visit1.5": MILD_VISIT | {"visit_weight": 1.5},
    "+mild labeled augmentation+visit2": MILD_VISIT | {"visit_weight": 2.0},
    "+medium labeled augmentation+visit1.5": {
        "augmentation": {**MEDIUM, **LABELED},
        "visit_weight": 1.5,
    },
    "+mild labeled augmentation+visit1.5+12k steps": MILD_VISIT | STEPS_12K,
    "+labeled augmentation+visit1.5": IMPROVED,
    "+labeled augmentation+12k steps": {"augmentation": LABELED, **STEPS_12K},
    "+labeled augmentation+visit1.5+12k steps": {**IMPROVED, **STEPS_12K},
    "+labeled augmentation+visit2+12k steps": IMPROVED_12K | {"visit_weight": 2.0},
    "+strong labeled augmentation+visit1.5+12k steps": IMPROVED_12K
    | {"augmentation": {"affine_std": 0.2, "translate_std": 2.5, **LABELED}},
    "+labeled augmentation without blur+visit1.5": IMPROVED
    | {"augmentation": {"blur_probability": 0.0, **LABELED}},
    "+labeled augmentation+visit1.5+ema": IMPROVED | {"ema_decay": 0.999},
    "+labeled augmentation+visit1.5+300 unlabeled": IMPROVED
    | {"unlabeled_batch_size": 300},
    "+labeled augmentation+visit1.5+20 labeled per class": IMPROVED
    | {"labeled_per_class": 20},
    "+labeled augmentation+visit1.5+svhn network": IMPROVED | {"network": "svhn"},
    "+labeled augmentation+visit1.5+40k steps": IMPROVED
    | {"max_iter": 40_000, "lr_decay_steps": 10_000},
    "+labeled augmentation+visit1.5+lr 5e-4": IMPROVED | {"learning_rate": 5e-4},
    "+labeled augmentation+visit1.5+lr 2e-3": IMPROVED | {"learning_rate": 2e-3},
    "+labeled augmentation+visit1.5+embedding 256": IMPROVED | {"embedding_dim": 256},
    "+labeled augmentation+visit1.5+elastic": IMPROVED
    | {"augmentation": {**LABELED, "elastic_alpha": 34.0, "elastic_sigma": 4.0}},
    "+labeled augmentation+visit1.5+strong elastic": IMPROVED
    | {"augmentation": {**LABELED, "elastic_alpha": 50.0, "elastic_sigma": 4.0}},
    "+labeled augmentation+visit1.5+consistency": IMPROVED
    | {"consistency_weight": 1.0},
    "unlabeled in epochs": {"unlabeled_sampling": "epochs"},
    "as the authors' code": {"precision": "fp32", "unlabeled_sampling": "epochs"},
}
#: Ablations fitted on another training set than "all" (see ``training_set``).
ABLATION_FIT_ON = {"as the authors' code": "all as unlabeled"}
FIT_ON_TITLES = {"all as unlabeled": "labeled images also in the unlabeled pool"}
ABLATION_DRAWS = {"unlabeled in epochs": 40, "as the authors' code": 40}


def _paper(**overrides):
    return {**recipe_params("paper"), **overrides}


def _ablation_title(name):
    shown = ", ".join(f"{k}={v!r}" for k, v in ABLATIONS[name].items())
    fit_on = ABLATION_FIT_ON.get(name, "all")
    extra = f"; {FIT_ON_TITLES[fit_on]}" if fit_on != "all" else ""
    return f"{name} ({shown}{extra})"


PAPER_TITLE = 'skassoc, recipe "paper"'
PCA = {"pca_components": PCA_COMPONENTS, "pca_seed": 0}
BASELINES = {
    "label_spreading": ("LabelSpreading (knn, k=10)", LABEL_SPREADING),
    "self_training": (
        "SelfTraining (LogisticRegression)",
        {**SELF_TRAINING, "estimator": SELF_TRAINING_BASE},
    ),
}


def _cases():
    """The rows of every table, in the order the tables show them."""
    paper, title, published = _paper(), PAPER_TITLE, PAPER_TABLE1
    for n in LABELS_PER_CLASS:
        yield h.Case("table1", "paper", n, paper, 40, title, published[n])
    for w, pub in PAPER_VISIT.items():
        params = _paper(visit_weight=w)
        yield h.Case("visit", f"visit_weight={w:g}", "1000", params, 3, paper=pub)
    for n in ("100", "1000"):
        alone = _paper(walker_weight=0.0, visit_weight=0.0)
        name = "network, labeled samples only"
        yield h.Case("baselines", "supervised", n, alone, 3, name, fit_on="labeled")
        for method, (name, params) in BASELINES.items():
            name = f"{name}, PCA-{PCA_COMPONENTS}"
            yield h.Case("baselines", method, n, params | PCA, 3, name, method=method)
        yield h.Case("baselines", "paper", n, paper, 3, title, published[n])
    for r in ("paper", "improved", "consistency"):
        for n in ("100", "1000"):
            pub = published[n] if r == "paper" else ""
            yield h.Case("recipes", r, n, recipe_params(r), 40, f'recipe "{r}"', pub)
    balanced = "recipes", "balanced", "100", recipe_params("balanced"), 20
    yield h.Case(*balanced, 'recipe "balanced"')
    yield from _prior_cases()
    yield from _precision_cases()
    yield h.Case("ablations", "paper", "100", paper, 40, title, published["100"])
    for name, overrides in ABLATIONS.items():
        params, draws = _paper(**overrides), ABLATION_DRAWS.get(name, 10)
        fit_on = ABLATION_FIT_ON.get(name, "all")
        row = "ablations", name, "100", params, draws, _ablation_title(name)
        yield h.Case(*row, fit_on=fit_on)
    params = _paper(validation_interval=CHECKPOINT_INTERVAL)
    row = "checkpoints", "paper", "100", params, 10, title, published["100"]
    yield h.Case(*row, options={"track_test_error": True})
    yield from _time_cases()
    for r in ("paper", "improved"):
        for d in range(5):
            row = "seeds", f"{r}-draw{d}", "100", recipe_params(r), 3
            yield h.Case(*row, f'recipe "{r}", label draw {d}', label_draw=d)


def _time_cases():
    """Time to accuracy: each fit timed after a short one of the same
    parameters in its process (see ``fit``)."""
    fast, warm_up = recipe_params("fast"), {"warm_up": True}
    short = {**fast, "max_iter": 1_300, "lr_warmup_steps": 130}
    timed = [("paper", _paper(), 3), ("fast", fast, 10), ("fast", short, 10)]
    timed.append(("fast", {**fast, "learning_rate": 3e-3}, 10))
    for recipe, params, draws in timed:
        steps = params["max_iter"]
        setting, title = f"{recipe}-{steps}", f'recipe "{recipe}", {steps:,} steps'
        if params["learning_rate"] != recipe_params(recipe)["learning_rate"]:
            setting += f"-lr{params['learning_rate']:g}"
            title += f", learning_rate={params['learning_rate']:g}"
        yield h.Case("time", setting, "100", params, draws, title, options=warm_up)
    # Recipes given the class frequencies: "fast" plus the balance loss of
    # "balanced", and "balanced" itself, timed alone.
    given = {**warm_up, "class_prior": "training labels"}
    balanced = recipe_params("balanced")
    weight, steps = balanced["balance_weight"], fast["max_iter"]
    params = {**fast, "balance_weight": weight}
    title = f'recipe "fast", {steps:,} steps, balance_weight={weight:g}'
    row = "time", f"fast-{steps}-balance+class_prior", "100", params, 10
    yield h.Case(*row, f"{title}, class_prior given", options=given)
    steps = balanced["max_iter"]
    title = f'recipe "balanced", {steps:,} steps, class_prior given'
    row = "time", f"balanced-{steps}+class_prior", "100", balanced, 3, title
    yield h.Case(*row, options=given)


def _precision_cases():
    """Recipe "paper" in TF32 and in bf16 (``"auto"`` on GPUs from Ampere on):
    each row names its precision."""
    for precision in ("tf32", "bf16"):
        setting = "paper" if precision == "tf32" else f"paper+{precision}"
        title = f'recipe "paper", precision="{precision}"'
        params = _paper(precision=precision)
        yield h.Case("precision", setting, "100", params, 10, title)


def _prior_cases():
    """Recipes given ``class_prior``: the frequencies of every training label
    (a "recipes" row), or of a random sample of them (how close they must be)."""
    title = 'recipe "{}", class_prior: {}'
    every = {"class_prior": "training labels"}
    params = recipe_params("balanced")
    name = title.format("balanced", "frequencies of every training label")
    row = "recipes", "balanced+class_prior", "100", params, 20, name
    yield h.Case(*row, options=every)
    for recipe in ("balanced", "consistency"):
        params = recipe_params(recipe)
        yield h.Case("prior", recipe, "100", params, 10, f'recipe "{recipe}"')
        name = title.format(recipe, "frequencies of every training label")
        row = "prior", f"{recipe}+training labels", "100", params, 10, name
        yield h.Case(*row, options=every)
    for n in (1_000, 5_000):
        name = title.format("balanced", f"frequencies of {n:,} random training labels")
        row = "prior", f"balanced+{n} labels", "100", recipe_params("balanced"), 10
        yield h.Case(*row, name, options={"class_prior": n})


CASES = list(_cases())


class Data:
    """MNIST arrays (``--train-subset``, ``--eval-subset``) and PCA features."""

    def __init__(self, args):
        (x_train, y_train), (x_test, y_test) = h.load_mnist_sets(args.data_home)
        if args.train_subset:
            rng = np.random.RandomState(SUBSET_SEED)
            keep = np.sort(rng.choice(len(y_train), args.train_subset, replace=False))
            x_train, y_train = x_train[keep], y_train[keep]
        test = slice(args.eval_subset or None)
        self.x_train, self.y_train = x_train, y_train
        self.x_test, self.y_test = x_test[test], y_test[test]
        self.meta = dict(n_train=len(y_train), n_eval=len(self.y_test))
        self.meta.update(max_iter_override=args.max_iter)
        self.meta.update(train_subset=args.train_subset)

    @functools.cached_property
    def pca_features(self):
        """PCA of pixels/255, fitted on the training images without labels."""
        from sklearn.decomposition import PCA

        pca = PCA(PCA_COMPONENTS, svd_solver="randomized", random_state=0)
        train, test = (
            x.reshape(len(x), -1).astype(np.float32) / 255.0
            for x in (self.x_train, self.x_test)
        )
        return pca.fit_transform(train), pca.transform(test)


def training_set(fit_on, x_train, y_semi):
    """The samples and labels a skassoc run is fitted on: ``"all"`` training
    images, the ``"labeled"`` ones only, or ``"all as unlabeled"`` and the
    labeled ones once more with their labels (as in the authors' code)."""
    labeled = np.flatnonzero(y_semi != -1)
    if fit_on == "all":
        return x_train, y_semi
    if fit_on == "labeled":
        return x_train[labeled], y_semi[labeled]
    if fit_on == "all as unlabeled":
        return (
            np.concatenate([x_train, x_train[labeled]]),
            np.concatenate([np.full_like(y_semi, -1), y_semi[labeled]]),
        )
    raise ValueError(f"unknown training set {fit_on!r}")


def class_frequencies(source, y_train, label_seed):
    """``class_prior`` of a run: the class frequencies of every training label
    (``source="training labels"``), or of ``source`` random ones."""
    if source != "training labels":
        if source > len(y_train):
            raise ValueError(
                f"class_prior from {source} random training labels needs at least "
                f"that many; the training set has {len(y_train)} (--train-subset)."
            )
        rng = np.random.default_rng([PRIOR_SAMPLE_SEED, label_seed])
        y_train = y_train[rng.choice(len(y_train), source, replace=False)]
    counts = np.bincount(y_train, minlength=MNIST_CLASSES)
    return counts / counts.sum()


def fit(config, data, device):
    """Train and evaluate one run of ``config``; return its measurements."""
    per_class, seed = LABELS_PER_CLASS[config["labels"]], config["label_seed"]
    y_semi = data.y_train.copy()
    if per_class is not None:
        y_semi = make_semi_supervised_labels(data.y_train, per_class, random_state=seed)
    out = {"n_train": len(y_semi), "n_labeled": int(np.sum(y_semi != -1))}
    if config["method"] == "skassoc":
        x_fit, y_fit = training_set(config["fit_on"], data.x_train, y_semi)
        out["n_fit"] = len(y_fit)
        test, tracked = (data.x_test, data.y_test), config.get("track_test_error")
        params = config["params"]
        if "class_prior" in config:
            prior = class_frequencies(config["class_prior"], data.y_train, seed)
            params = {**params, "class_prior": prior}
            out["class_prior"] = prior.tolist()
        if config.get("warm_up"):
            # Timed as a fit after the first of its process: compiling and
            # cuDNN's choice of kernels happen in a short fit before it.
            warm_up = {**params, "max_iter": 10, "lr_warmup_steps": 0}
            h.fit_estimator(warm_up, x_fit, y_fit, *test, device)
        fitted = h.fit_estimator(params, x_fit, y_fit, *test, device, tracked)
        precision = h.resolved_precision(params, device, images=True)
        return {**out, **fitted, "precision": precision}
    from sklearn.linear_model import LogisticRegression
    from sklearn.semi_supervised import LabelSpreading, SelfTrainingClassifier

    train, test = data.pca_features
    if config["method"] == "label_spreading":
        model = LabelSpreading(**LABEL_SPREADING, n_jobs=-1)
    else:
        base = LogisticRegression(**SELF_TRAINING_BASE)
        model = SelfTrainingClassifier(base, **SELF_TRAINING)
    start = time.perf_counter()
    model.fit(train, y_semi)
    out["fit_seconds"] = time.perf_counter() - start
    out["n_iter"] = int(model.n_iter_)
    return {**out, **h.scores(data.y_test, model.predict(test))}


def errors_by_draw(row, runs):
    return {r["draw"]: r["test_error_percent"] for r in h.finished_runs(row, runs)}


def paper_errors(rows, runs):
    """Errors of recipe "paper" by number of labels, then by draw."""
    paper = [row for row in rows if row["setting"] == "paper"]
    return {row["labels"]: errors_by_draw(row, runs) for row in paper}


def draws_below(errors, paper):
    """The draws two rows share, and on how many ``errors`` is below ``paper``."""
    paired = [d for d in errors if d in paper]
    return paired, f"{sum(errors[d] < paper[d] for d in paired)}/{len(paired)}"


#: The recipes' and the ablations' own columns go before "Paper".
AT = h.TABLE_HEADER.index("Paper")
RECIPE_COLUMNS = [f"Median, draws 0-{SELECTION_DRAWS - 1}"]
RECIPE_COLUMNS += [f"Median, draws {SELECTION_DRAWS}+"]
RECIPE_COLUMNS += [f'Draws {SELECTION_DRAWS}+ better than "paper"']
RECIPE_HEADER = h.TABLE_HEADER[:AT] + RECIPE_COLUMNS + h.TABLE_HEADER[AT:]
ABLATION_COLUMNS = ['"paper", same draws', 'Draws below "paper"']
ABLATION_HEADER = h.TABLE_HEADER[:AT] + ABLATION_COLUMNS + h.TABLE_HEADER[AT:]
PRIOR_COLUMNS = ["Without class_prior, same draws", "Draws below it"]
PRIOR_HEADER = h.TABLE_HEADER[:AT] + PRIOR_COLUMNS + h.TABLE_HEADER[AT:]
PRECISION_COLUMNS = ['"tf32", same draws', "Draws below it"]
PRECISION_HEADER = h.TABLE_HEADER[:AT] + PRECISION_COLUMNS + h.TABLE_HEADER[AT:]
CHECKPOINT_HEADER = ["Setting", "Labels", "Runs", "Last: median", "Last: min-max"]
CHECKPOINT_HEADER += ["Lowest: median", "Lowest: min-max", "Step of lowest (median)"]
CHECKPOINT_HEADER += ["Paper"]


def recipe_cells(rows, runs):
    """Common columns, the medians of the draws of the choice and of the later
    ones, and on how many later draws a recipe beats "paper" (same labels)."""
    cells, paper = h.table_cells(rows, runs), paper_errors(rows, runs)
    for row, row_cells in zip(rows, cells, strict=True):
        errors = errors_by_draw(row, runs)
        chosen_on = [e for d, e in errors.items() if d < SELECTION_DRAWS]
        later = {d: e for d, e in errors.items() if d >= SELECTION_DRAWS}
        paired, below = draws_below(later, paper.get(row["labels"], {}))
        row_cells[AT:AT] = [
            h.median_cell(chosen_on) if later else "",
            h.median_cell(list(later.values())) if later else "",
            below if paired and row["setting"] != "paper" else "",
        ]
    return cells


def ablation_cells(rows, runs):
    """Common columns, and each row against "paper" on the row's own draws."""
    cells, paper = h.table_cells(rows, runs), paper_errors(rows, runs)
    for row, row_cells in zip(rows, cells, strict=True):
        own = paper.get(row["labels"], {})
        paired, below = draws_below(errors_by_draw(row, runs), own)
        against = [h.median_cell([own[d] for d in paired]), below]
        shown = paired and row["setting"] != "paper"
        row_cells[AT:AT] = against if shown else ["", ""]
    return cells


def against_recipe_cells(rows, runs):
    """Common columns, and each row of a recipe with a change (given
    class_prior, another precision) against the recipe without it (the row
    named by the recipe alone) on the row's own draws."""
    cells = h.table_cells(rows, runs)
    by_setting = {row["setting"]: errors_by_draw(row, runs) for row in rows}
    for row, row_cells in zip(rows, cells, strict=True):
        recipe, given, _ = row["setting"].partition("+")
        without = by_setting.get(recipe, {}) if given else {}
        paired, below = draws_below(errors_by_draw(row, runs), without)
        against = [h.median_cell([without[d] for d in paired]), below]
        row_cells[AT:AT] = against if paired else ["", ""]
    return cells


def checkpoint_cells(rows, runs):
    """Last checkpoint and lowest error during training."""
    cells = []
    for row in rows:
        done = h.finished_runs(row, runs)
        last = [r["test_error_percent"] for r in done]
        lowest = [r["lowest_test_error_percent"] for r in done]
        steps = [r["lowest_test_error_step"] for r in done]
        stats = [h.median_cell(last), h.range_cell(last)]
        stats += [h.median_cell(lowest), h.range_cell(lowest)]
        step = f"{np.median(steps):.0f}" if steps else "n/a"
        cells.append([*h.row_start(row, done), *stats, step, row["paper"] or "n/a"])
    return cells


#: Each part's heading (its table's columns: :data:`COLUMNS`); what each
#: table shows is told beside it in docs/benchmarks/mnist.rst.
PARTS = {
    "table1": 'Table 1: MNIST test error (%), recipe "paper"',
    "visit": "Effect of the visit loss, MNIST 1000 labels",
    "baselines": "Baselines on the same label draws",
    "recipes": "Recipes",
    "prior": "Class frequencies given as class_prior, MNIST 100 labels",
    "precision": "TF32 and bf16 on the GPU, MNIST 100 labels",
    "ablations": 'Ablations on top of recipe "paper", MNIST 100 labels',
    "checkpoints": "Last checkpoint against the lowest error during training",
    "time": "Time to accuracy, MNIST 100 labels",
    "seeds": "Network seeds, MNIST 100 labels",
}
COLUMNS = {
    "recipes": (RECIPE_HEADER, recipe_cells),
    "ablations": (ABLATION_HEADER, ablation_cells),
    "prior": (PRIOR_HEADER, against_recipe_cells),
    "precision": (PRECISION_HEADER, against_recipe_cells),
    "checkpoints": (CHECKPOINT_HEADER, checkpoint_cells),
}


def render(results):
    meta = results["meta"]
    notes = [
        f"Test error (%) on {meta.get('n_eval', '?')} MNIST test images of the "
        "last checkpoint; medians over label draws; fit s: wall time of fit(). "
        "docs/benchmarks/mnist.rst tells what each table shows."
    ]
    if meta.get("max_iter_override"):
        notes.append(
            f"Quick run: max_iter={meta['max_iter_override']} for every network "
            "(lr_decay_steps scaled alike), not the paper's 20,000."
        )
    if meta.get("train_subset"):
        notes.append(
            f"Quick run: a random {meta['train_subset']}-image subset of the "
            "training set, not all 60,000."
        )
    title = "MNIST: learning by association (Haeusser et al., CVPR 2017)"
    default = h.TABLE_HEADER, h.table_cells
    parts = [(p, PARTS[p], "", *COLUMNS.get(p, default)) for p in PARTS]
    return h.render_parts(results, title, notes, parts)


def parse_args(argv=None):
    parser = h.make_parser(__doc__.split("\n\n")[0], "mnist")
    add = parser.add_argument
    train, test = h.MNIST_TRAIN_IMAGES, h.MNIST_TEST_IMAGES
    add("--train-subset", type=h.bounded_int(1, train), help="N random training images")
    add("--eval-subset", type=h.bounded_int(1, test), help="the first N test images")
    return h.parse(parser, argv)


def main(argv=None):
    args = parse_args(argv)
    seed = SUBSET_SEED if args.train_subset else None
    common = dict(train_subset=args.train_subset, train_subset_seed=seed)
    common["eval_subset"] = args.eval_subset
    return h.main(CASES, args, fit, render, Data, common)


if __name__ == "__main__":
    main()

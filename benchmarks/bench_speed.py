"""Training and prediction speed of skassoc against a bare PyTorch loop.

Parts, described in ``docs/benchmarks/speed.rst``: (a) the bare loop, (b)
skassoc's ``fit()`` of the same steps, (c) complete fits (``--accuracy-steps``)
and their test error, (d) ``predict`` throughput. A run writes
``benchmarks/results/speed_<device>*.json`` (one file per precision,
compilation and recipe of (c)); the table has a row per file::

    python benchmarks/bench_speed.py --device cuda [--precision bf16] [--compile]
    python benchmarks/bench_speed.py --device cpu --accuracy-steps 2000
    python benchmarks/bench_speed.py --device cuda --render-only
"""

import time
from pathlib import Path

import _harness as h
import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from skassoc import RECIPES, recipe_params

#: The bare loop's settings: those of recipe "paper".
LABELED_PER_CLASS = 10
UNLABELED_BATCH = 100
LEARNING_RATE = 1e-3
LR_DECAY = 0.33
LR_DECAY_STEPS = 5000
EMBEDDER_L2 = 1e-3
LOGIT_L2 = 1e-4
LOG_EPSILON = 1e-8


class BareMNISTNet(nn.Module):
    """x/255 -> C32 C32 P C64 C64 P C128 C128 P -> FC128 (ELU) + logit layer."""

    def __init__(self, embedding_dim=128, n_classes=10):
        super().__init__()
        layers = []
        for cin, cout in ((1, 32), (32, 64), (64, 128)):
            layers += [nn.Conv2d(cin, cout, 3, padding=1), nn.ELU()]
            layers += [nn.Conv2d(cout, cout, 3, padding=1), nn.ELU(), nn.MaxPool2d(2)]
        self.features = nn.Sequential(*layers)
        self.embedding = nn.Linear(3 * 3 * 128, embedding_dim)
        self.logits = nn.Linear(embedding_dim, n_classes)
        for module in self.modules():
            if isinstance(module, (nn.Conv2d, nn.Linear)):
                nn.init.xavier_uniform_(module.weight)
                nn.init.zeros_(module.bias)

    def embed(self, x):
        return F.elu(self.embedding(self.features(x / 255.0).flatten(1)))


def bare_losses(model, a, b, labels):
    """Walker, visit and logit losses and the L2 penalty, as in the paper."""
    match = a @ b.T
    p_ab = torch.softmax(match, dim=1)
    p_ba = torch.softmax(match.T, dim=1)
    p_aba = p_ab @ p_ba
    same = (labels[:, None] == labels[None, :]).float()
    target = same / same.sum(dim=1, keepdim=True)
    walker = -(target * torch.log(LOG_EPSILON + p_aba)).sum(dim=1).mean()
    visit = -torch.log(LOG_EPSILON + p_ab.mean(dim=0)).mean()
    logit = F.cross_entropy(model.logits(a), labels)
    l2 = 0.0
    for name, param in model.named_parameters():
        if param.ndim > 1:  # weights, not biases
            scale = LOGIT_L2 if name.startswith("logits.") else EMBEDDER_L2
            l2 = l2 + scale * param.pow(2).sum() / 2
    return walker, visit, logit, l2


def bare_train(x_train, y_semi, n_steps, seed, device):
    """Train a fresh model for ``n_steps``; return it, the loop's seconds, losses."""
    torch.manual_seed(seed)
    rng = np.random.default_rng(seed)
    model = BareMNISTNet().to(device)
    optimizer = torch.optim.Adam(model.parameters(), lr=LEARNING_RATE)
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, LR_DECAY_STEPS, LR_DECAY)
    by_class = [np.flatnonzero(y_semi == c) for c in range(10)]
    losses = []
    model.train()
    h.synchronize(device)
    start = time.perf_counter()
    for _ in range(n_steps):
        lab = np.concatenate(
            [rng.choice(idx, LABELED_PER_CLASS, replace=False) for idx in by_class]
        )
        unl = rng.integers(0, len(y_semi), UNLABELED_BATCH)
        batch = x_train[torch.from_numpy(np.concatenate([lab, unl])).to(device)]
        labels = torch.from_numpy(y_semi[lab]).to(device)
        emb = model.embed(batch)
        a, b = emb[: len(lab)], emb[len(lab) :]
        walker, visit, logit, l2 = bare_losses(model, a, b, labels)
        association = walker + visit + logit
        optimizer.zero_grad()
        (association + l2).backward()
        optimizer.step()
        scheduler.step()
        # Without the L2 term, like skassoc's history_ (where L2 is Adam's
        # weight decay), so that the two final losses compare.
        losses.append(association.item())
    h.synchronize(device)
    return model, time.perf_counter() - start, losses


def time_bare(x_train, y_semi, x_test, y_test, n_steps, n_warmup, seed, device):
    """(a): the bare loop's figures, and its losses."""
    xt, xv = (
        torch.as_tensor(x, dtype=torch.float32, device=device).unsqueeze(1)
        for x in (x_train, x_test)
    )
    bare_train(xt, y_semi, n_warmup, seed, device)
    model, seconds, losses = bare_train(xt, y_semi, n_steps, seed, device)
    model.eval()
    with torch.no_grad():
        logits = torch.cat([model.logits(model.embed(x)) for x in xv.split(1000)])
    error = h.error_percent(logits.argmax(1).cpu().numpy(), y_test)
    out = dict(seconds=seconds, steps_per_s=n_steps / seconds)
    out.update(ms_per_step=1000 * seconds / n_steps)
    return out | {"test_error_percent": error}, losses


def skassoc_fit(x, y_semi, args, device, recipe="paper", **params):
    """Fit a recipe with ``params``; the estimator and the fit's wall seconds."""
    params = recipe_params(recipe) | params
    params.update(device=device.type, precision=args.precision)
    params.update(compile=args.compile, random_state=args.seed)
    return h.timed_fit(x, y_semi, params, device)


def time_training(x_train, y_semi, x_test, y_test, steps, warmup, args, device):
    """(a) and (b): the bare loop, then a warm-up fit, a short fit (the fixed
    cost of a fit) and the timed fit of skassoc; that estimator, the figures."""
    test = x_test, y_test
    bare, losses = time_bare(x_train, y_semi, *test, steps, warmup, args.seed, device)
    _, first_s = skassoc_fit(x_train, y_semi, args, device, max_iter=warmup)
    _, short_s = skassoc_fit(x_train, y_semi, args, device, max_iter=warmup)
    clf, fit_s = skassoc_fit(x_train, y_semi, args, device, max_iter=steps)
    logged = clf.history_["step"]
    window = logged[-1] - (logged[-2] if len(logged) > 1 else 0)
    # Over the same trailing window as skassoc's logged loss.
    bare["final_loss"] = float(np.mean(losses[-window:]))
    marginal = None
    if steps > warmup and fit_s > short_s:
        marginal = (steps - warmup) / (fit_s - short_s)
    sk = dict(seconds=fit_s, steps_per_s=steps / fit_s)
    sk.update(ms_per_step=1000 * fit_s / steps, first_fit_seconds=first_s)
    sk.update(short_fit_steps=warmup, short_fit_seconds=short_s)
    sk.update(
        marginal_steps_per_s=marginal, final_loss=float(clf.history_["total"][-1])
    )
    sk.update(loss_window_steps=window)
    sk["test_error_percent"] = h.error_percent(clf.predict(x_test), y_test)
    training = {"bare": bare, "skassoc": sk}
    training["ratio_skassoc_over_bare"] = bare["seconds"] / fit_s
    training["ratio_marginal_over_bare"] = (
        marginal and marginal * bare["seconds"] / steps
    )
    return clf, training | {"images_per_step": 200}


def time_predict(clf, x_test, predict_rows, repeats, device):
    """(d): images a second of ``predict`` on the test images and on tiles of them."""
    clf.predict(x_test[:1000])  # warm-up
    tiled = np.tile(x_test, (-(-predict_rows // len(x_test)), 1, 1))[:predict_rows]
    runs = {}
    for name, data in [(f"test_{len(x_test)}", x_test), (f"tiled_{len(tiled)}", tiled)]:
        times = [
            h.timed(lambda d=data: clf.predict(d), device)[1] for _ in range(repeats)
        ]
        seconds = float(np.median(times))
        runs[name] = dict(rows=len(data), seconds=seconds)
        runs[name].update(images_per_s=len(data) / seconds, repeats=repeats)
    return {"predict_batch_size": clf.predict_batch_size, "runs": runs}


def time_to_accuracy(x_train, y_semi, x_test, y_test, args, device):
    """(c): complete fits of ``--accuracy-steps``, their seconds and test error."""
    recipe, fits = args.accuracy_recipe, []
    for max_iter in args.accuracy_steps:
        fit = dict(max_iter=max_iter, lr_decay_steps=max(1, max_iter // 4))
        clf, seconds = skassoc_fit(x_train, y_semi, args, device, recipe, **fit)
        error = h.error_percent(clf.predict(x_test), y_test)
        fits.append(fit | {"fit_seconds": seconds, "test_error_percent": error})
    return {"recipe": recipe, "fits": fits}


def measure(args, device):
    """Parts (a)-(d); the results dict, its settings in ``meta``."""
    on_gpu = device.type == "cuda"
    steps = args.steps or (2000 if on_gpu else 200)
    warmup = args.warmup_steps or (50 if on_gpu else 3)
    eval_rows = args.eval_rows or (10_000 if on_gpu else 2_000)
    predict_rows = args.predict_rows or (100_000 if on_gpu else 20_000)
    x_train, y_semi, x_full, y_full = h.mnist_semi(args, args.seed)
    test = x_full[:eval_rows], y_full[:eval_rows]
    meta = h.environment(device)
    meta.update(seed=args.seed, steps=steps, warmup_steps=warmup)
    meta.update(precision=args.precision, compile=args.compile)
    # What "auto" chose on this device, for the table.
    asked = {"precision": args.precision}
    meta["resolved_precision"] = h.resolved_precision(asked, device, images=True)
    meta.update(eval_rows=eval_rows, predict_rows=predict_rows)
    clf, training = time_training(x_train, y_semi, *test, steps, warmup, args, device)
    predict = time_predict(clf, test[0], predict_rows, 3 if on_gpu else 1, device)
    results = {"meta": meta, "training": training, "predict": predict}
    if not args.skip_accuracy:
        fits = time_to_accuracy(x_train, y_semi, x_full, y_full, args, device)
        results["time_to_accuracy"] = fits
    return results


def render(paths):
    """One row per results file: skassoc against the bare loop of its run."""
    header = ["Run", "Precision", "Compile", "skassoc ms/step", "steps/s"]
    header += ["Bare loop ms/step", "vs bare loop", "Marginal ms/step"]
    header += ["Predict images/s", "Complete fits (steps: fit s, error %)"]
    cells = []
    for path in paths:
        results = h.load_json(path)
        meta, training = results["meta"], results["training"]
        sk, bare = training["skassoc"], training["bare"]
        accuracy = results.get("time_to_accuracy", {})
        fits = "; ".join(
            f"{f['max_iter']}: {f['fit_seconds']:.1f}, {f['test_error_percent']:.2f}"
            for f in accuracy.get("fits", [])
        )
        if fits and accuracy.get("recipe", "paper") != "paper":
            fits = f'"{accuracy["recipe"]}" {fits}'
        rate = max(r["images_per_s"] for r in results["predict"]["runs"].values())
        marginal = sk.get("marginal_steps_per_s")
        # Three significant digits, never in exponent form (1.07e+03 -> 1070).
        steps_per_s = float(f"{sk['steps_per_s']:.3g}")
        steps_per_s = f"{steps_per_s:g}"
        ratio = training["ratio_skassoc_over_bare"]
        cells.append([Path(path).name, precision_cell(meta)])
        cells[-1] += ["yes" if meta.get("compile") else "no"]
        cells[-1] += [f"{sk['ms_per_step']:.3g}", steps_per_s]
        cells[-1] += [f"{bare['ms_per_step']:.3g}", f"{ratio:.2f}x"]
        cells[-1] += [f"{1000 / marginal:.3g}" if marginal else "n/a", f"{rate:.0f}"]
        cells[-1] += [fits or "n/a"]
    return h.rst_table(header, cells)


def precision_cell(meta):
    """The precision asked for, and what ``"auto"`` chose."""
    precision = meta.get("precision", "auto")
    if precision != "auto":
        return precision
    resolved = meta.get("resolved_precision")
    if resolved is None and meta.get("device_type") == "cuda":
        resolved = h.AUTO_ON_GPU_BEFORE_BF16
    return f"auto ({resolved})" if resolved else "auto"


def step_counts(text):
    """argparse ``type`` of ``--accuracy-steps``: comma-separated step counts."""
    return [h.bounded_int(1)(part) for part in text.split(",")]


def parse_args(argv=None):
    parser = h.make_parser(__doc__.split("\n\n")[0], "speed", cases=False)
    add = parser.add_argument
    positive = h.bounded_int(1)
    add("--steps", type=positive, help="timed steps of (a), (b) (2000 cuda, 200 cpu)")
    add("--warmup-steps", type=positive, help="warm-up steps (default 50 cuda, 3 cpu)")
    add("--precision", choices=["auto", "fp32", "tf32", "bf16"], default="auto")
    add("--compile", action="store_true", help="skassoc's compile=True")
    add("--seed", type=h.seed_int, default=0, help="labels and init seed")
    add("--skip-accuracy", action="store_true", help="skip (c)")
    fits = "max_iter of (c), comma-separated"
    add("--accuracy-steps", type=step_counts, default="5000,10000,20000", help=fits)
    mnist = sorted(n for n, p in RECIPES.items() if p.get("network") == "mnist")
    add("--accuracy-recipe", choices=mnist, default="paper")
    add("--predict-rows", type=positive, help="tiled rows for (d)")
    test_rows = h.bounded_int(1, h.MNIST_TEST_IMAGES)
    add("--eval-rows", type=test_rows, help="test images of (a), (b), (d)")
    args = h.parse(parser, argv)
    # One file per precision, compilation and recipe of (c).
    suffix = "" if args.precision == "auto" else f"_{args.precision}"
    suffix += "_compile" if args.compile else ""
    if args.accuracy_recipe != "paper" and not args.skip_accuracy:
        suffix += f"_{args.accuracy_recipe}"
    args.measured_json = Path(args.json)
    if suffix and not args.json_given:
        name = f"{args.measured_json.stem}{suffix}.json"
        args.measured_json = args.measured_json.with_name(name)
    h.check_targets(parser, args.measured_json)
    return args


def main(argv=None):
    args = parse_args(argv)
    json_path = args.measured_json
    if not args.render_only:
        h.write_json(json_path, measure(args, h.resolve_device(args.device)))
    stem = Path(args.json).stem
    h.write_table(args, render(sorted(Path(args.json).parent.glob(f"{stem}*.json"))))


if __name__ == "__main__":
    main()

"""Training and prediction speed of skassoc against a bare PyTorch loop.

In one run on one machine (MNIST, 100 labels, the paper's recipe): (a) a bare
PyTorch loop of the same network, losses and batches written the way a user
writes it (eager, float32, indices drawn on the host, ``loss.item()`` every
step; no code of skassoc), timed after a warm-up; (b) skassoc's whole
``fit()`` of the same steps (validation, copy to the device, CUDA-graph
capture and the steps), after a warm-up fit, and a short fit whose time gives
the fixed cost of a fit; (c) complete fits of ``--accuracy-steps`` steps of
``--accuracy-recipe`` (``lr_decay_steps = max_iter // 4``), their wall time
and test error (skip with ``--skip-accuracy``); (d) ``predict`` throughput.

Every table, from the JSON files ``benchmarks/results/speed_<device>*.json``
(one file per precision, compilation and recipe of (c))::

    python benchmarks/bench_speed.py --device cuda --render-only

Runs::

    python benchmarks/bench_speed.py --device cuda [--precision bf16] [--compile]
    python benchmarks/bench_speed.py --device cpu --accuracy-steps 2000
"""

import time
from pathlib import Path

import _harness as h
import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from skassoc import RECIPES, recipe_params
from skassoc.datasets import load_mnist, make_semi_supervised_labels

LABELED_PER_CLASS = 10
UNLABELED_BATCH = 100
LEARNING_RATE = 1e-3
LR_DECAY = 0.33
LR_DECAY_STEPS = 5000
EMBEDDER_L2 = 1e-3
LOGIT_L2 = 1e-4
LOG_EPSILON = 1e-8


# --------------------------------------------------------------- (a) bare loop


class BareMNISTNet(nn.Module):
    """x/255 -> C32 C32 P C64 C64 P C128 C128 P -> FC128 (ELU) + logit layer."""

    def __init__(self, embedding_dim=128, n_classes=10):
        super().__init__()

        def block(cin, cout):
            conv = (
                nn.Conv2d(cin, cout, 3, padding=1),
                nn.Conv2d(cout, cout, 3, padding=1),
            )
            return [conv[0], nn.ELU(), conv[1], nn.ELU(), nn.MaxPool2d(2, 2)]

        blocks = [block(1, 32), block(32, 64), block(64, 128)]
        self.features = nn.Sequential(*(layer for b in blocks for layer in b))
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


def bare_train(x_train, y_train, labeled_idx, n_steps, seed, device):
    """Train a fresh model for ``n_steps``; return it, the loop's seconds, losses."""
    torch.manual_seed(seed)
    rng = np.random.default_rng(seed)
    model = BareMNISTNet().to(device)
    optimizer = torch.optim.Adam(model.parameters(), lr=LEARNING_RATE)
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, LR_DECAY_STEPS, LR_DECAY)
    by_class = [labeled_idx[y_train[labeled_idx] == c] for c in range(10)]
    n_train = len(y_train)
    losses = []
    model.train()
    h.synchronize(device)
    start = time.perf_counter()
    for _ in range(n_steps):
        lab = np.concatenate(
            [rng.choice(idx, LABELED_PER_CLASS, replace=False) for idx in by_class]
        )
        unl = rng.integers(0, n_train, UNLABELED_BATCH)
        batch = x_train[torch.from_numpy(np.concatenate([lab, unl])).to(device)]
        labels = torch.from_numpy(y_train[lab]).to(device)
        emb = model.embed(batch)
        walker, visit, logit, l2 = bare_losses(
            model, emb[: len(lab)], emb[len(lab) :], labels
        )
        association = walker + visit + logit
        loss = association + l2
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        scheduler.step()
        # Without the L2 term, like skassoc's history_ (where L2 is Adam's
        # weight decay), so that the two final losses compare.
        losses.append(association.item())
    h.synchronize(device)
    return model, time.perf_counter() - start, losses


@torch.no_grad()
def bare_test_error(model, x_test, y_test):
    model.eval()
    wrong = 0
    for start in range(0, len(x_test), 1000):
        logits = model.logits(model.embed(x_test[start : start + 1000]))
        wrong += int(
            (logits.argmax(1).cpu().numpy() != y_test[start : start + 1000]).sum()
        )
    return 100.0 * wrong / len(y_test)


def skassoc_fit(x, y_semi, max_iter, args, device, recipe="paper", **overrides):
    """Fit a recipe; return the estimator and the fit's wall seconds."""
    params = recipe_params(recipe)
    params.update(max_iter=max_iter, device=device.type, precision=args.precision)
    params.update(compile=args.compile, random_state=args.seed, **overrides)
    return h.timed_fit(x, y_semi, params, device)


def error(predicted, y):
    return 100.0 * float(np.mean(predicted != y))


def measure(args, device):
    """Parts (a)-(d); the results dict (without its meta)."""
    on_gpu = device.type == "cuda"
    n_steps = args.steps or (2000 if on_gpu else 200)
    n_warmup = args.warmup_steps or (50 if on_gpu else 3)
    eval_rows = args.eval_rows or (10_000 if on_gpu else 2_000)
    predict_rows = args.predict_rows or (100_000 if on_gpu else 20_000)
    home = h.mnist_home(args.data_home)
    x_train, y_train = load_mnist("train", data_home=home, return_X_y=True)
    x_full, y_full = load_mnist("test", data_home=home, return_X_y=True)
    x_test, y_test = x_full[:eval_rows], y_full[:eval_rows]
    y_semi = make_semi_supervised_labels(y_train, 10, random_state=args.seed)
    labeled_idx = np.flatnonzero(y_semi != -1)
    settings = dict(seed=args.seed, steps=n_steps, warmup_steps=n_warmup)
    settings.update(precision=args.precision, compile=args.compile)
    settings.update(eval_rows=eval_rows, predict_rows=predict_rows)

    # (a) bare loop
    xt = torch.as_tensor(x_train, dtype=torch.float32, device=device).unsqueeze(1)
    xv = torch.as_tensor(x_test, dtype=torch.float32, device=device).unsqueeze(1)
    bare_train(xt, y_train, labeled_idx, n_warmup, args.seed, device)
    model, bare_s, losses = bare_train(
        xt, y_train, labeled_idx, n_steps, args.seed, device
    )
    bare_err = bare_test_error(model, xv, y_test)
    del model, xt, xv

    # (b) skassoc: a warm-up fit, a short fit (the fixed cost), the timed fit.
    _, first_s = skassoc_fit(x_train, y_semi, n_warmup, args, device)
    _, short_s = skassoc_fit(x_train, y_semi, n_warmup, args, device)
    clf, fit_s = skassoc_fit(x_train, y_semi, n_steps, args, device)
    steps = clf.history_["step"]
    window = steps[-1] - (steps[-2] if len(steps) > 1 else 0)
    marginal = None
    if n_steps > n_warmup and fit_s > short_s:
        marginal = (n_steps - n_warmup) / (fit_s - short_s)
    training = {
        "bare": {
            "seconds": bare_s,
            "steps_per_s": n_steps / bare_s,
            "ms_per_step": 1000 * bare_s / n_steps,
            # Over the same trailing window as skassoc's logged loss.
            "final_loss": float(np.mean(losses[-window:])),
            "test_error_percent": bare_err,
        },
        "skassoc": {
            "seconds": fit_s,
            "steps_per_s": n_steps / fit_s,
            "ms_per_step": 1000 * fit_s / n_steps,
            "first_fit_seconds": first_s,
            "short_fit_steps": n_warmup,
            "short_fit_seconds": short_s,
            "marginal_steps_per_s": marginal,
            "final_loss": float(clf.history_["total"][-1]),
            "loss_window_steps": window,
            "test_error_percent": error(clf.predict(x_test), y_test),
        },
        "ratio_skassoc_over_bare": bare_s / fit_s,
        "ratio_marginal_over_bare": marginal and marginal * bare_s / n_steps,
        "images_per_step": 200,
    }

    # (d) predict throughput
    clf.predict(x_test[:1000])  # warm-up
    tiled = np.tile(x_test, (-(-predict_rows // len(x_test)), 1, 1))[:predict_rows]
    predict = {"predict_batch_size": clf.predict_batch_size, "runs": {}}
    for name, data in [(f"test_{eval_rows}", x_test), (f"tiled_{len(tiled)}", tiled)]:
        times = []
        for _ in range(3 if on_gpu else 1):
            h.synchronize(device)
            start = time.perf_counter()
            clf.predict(data)
            h.synchronize(device)
            times.append(time.perf_counter() - start)
        seconds = float(np.median(times))
        predict["runs"][name] = {
            "rows": len(data),
            "seconds": seconds,
            "images_per_s": len(data) / seconds,
            "repeats": len(times),
        }
    results = {"settings": settings, "training": training, "predict": predict}
    if args.skip_accuracy:
        return results

    # (c) complete fits
    fits = []
    for max_iter in (int(s) for s in args.accuracy_steps.split(",") if s):
        decay = max(1, max_iter // 4)
        clf, seconds = skassoc_fit(
            x_train,
            y_semi,
            max_iter,
            args,
            device,
            recipe=args.accuracy_recipe,
            lr_decay_steps=decay,
        )
        fits.append(
            {
                "max_iter": max_iter,
                "lr_decay_steps": decay,
                "fit_seconds": seconds,
                "test_error_percent": error(clf.predict(x_full), y_full),
            }
        )
    results["time_to_accuracy"] = {"recipe": args.accuracy_recipe, "fits": fits}
    return results


RATIO = "ratio_skassoc_over_bare"


def render(paths):
    """One row per results file: skassoc against the bare loop of its run."""
    header = ["Run", "Precision", "Compile", "skassoc ms/step", "steps/s"]
    header += ["Bare loop ms/step", "vs bare loop", "Marginal ms/step"]
    header += ["Predict images/s", "Complete fits (steps: fit s, error %)"]
    header += ["Device", "torch", "Revision"]
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
        cells.append([Path(path).name, meta.get("precision", "auto")])
        cells[-1] += [
            "yes" if meta.get("compile") else "no",
            f"{sk['ms_per_step']:.3g}",
        ]
        cells[-1] += [f"{sk['steps_per_s']:.3g}".replace("e+03", "000")]
        cells[-1] += [f"{bare['ms_per_step']:.3g}", f"{training[RATIO]:.2f}x"]
        cells[-1] += [f"{1000 / marginal:.3g}" if marginal else "n/a", f"{rate:.0f}"]
        cells[-1] += [fits or "n/a", meta["device"], meta["torch"]]
        cells[-1] += [(meta.get("git_revision") or "?")[:7]]
    return h.rst_table(header, cells)


def main(argv=None):
    parser = h.make_parser(__doc__.split("\n\n")[0], "speed", cases=False)
    add = parser.add_argument
    add("--steps", type=int, help="timed steps of (a), (b) (2000 cuda, 200 cpu)")
    add("--warmup-steps", type=int, help="warm-up steps (default 50 cuda, 3 cpu)")
    add("--precision", choices=["auto", "fp32", "tf32", "bf16"], default="auto")
    add("--compile", action="store_true", help="skassoc's compile=True")
    add("--seed", type=int, default=0, help="labels and init seed")
    add("--skip-accuracy", action="store_true", help="skip (c)")
    add("--accuracy-steps", default="5000,10000,20000", help="max_iter of (c)")
    mnist = sorted(n for n, p in RECIPES.items() if p.get("network") == "mnist")
    add("--accuracy-recipe", choices=mnist, default="paper")
    add("--predict-rows", type=int, help="tiled rows for (d)")
    add("--eval-rows", type=int, help="test images of (a), (b), (d)")
    args = h.parse(parser, argv)
    # One file per precision, compilation and recipe of (c).
    suffix = "" if args.precision == "auto" else f"_{args.precision}"
    suffix += "_compile" if args.compile else ""
    if args.accuracy_recipe != "paper" and not args.skip_accuracy:
        suffix += f"_{args.accuracy_recipe}"
    json_path = Path(args.json)
    if suffix and not args.json_given:
        json_path = json_path.with_name(f"{json_path.stem}{suffix}.json")
    if not args.render_only:
        device = h.resolve_device(args.device)
        results = {"meta": h.environment(device), **measure(args, device)}
        results["meta"].update(results.pop("settings"))
        h.write_json(json_path, results)
    stem = Path(args.json).stem
    paths = sorted(Path(args.json).parent.glob(f"{stem}*.json"))
    text = render(paths)
    if args.table:
        h.write_text(args.table, text + "\n")
    print(f"{text}\n\nwrote {'' if args.render_only else json_path} {args.table}")


if __name__ == "__main__":
    main()

"""Training and prediction speed of skassoc against a bare PyTorch loop.

What is measured, on one machine in one run (MNIST, the paper's recipe:
10 labeled images per class out of 100 fixed labeled ones plus 100
unlabeled images a step, Adam 1e-3 with StepLR(5000, 0.33)):

(a) **bare loop**: the paper's MNIST network and losses written the way a
    typical user writes them: all 60k training images as a float32 tensor
    on the device, batch indices drawn with numpy on the host every step,
    ``loss.item()`` every step, float32 (no autocast, PyTorch's default
    backend flags), no CUDA graph, one forward pass of the 200 images
    concatenated, unlabeled images drawn from all 60k (skassoc draws them
    from the 59,900 unlabeled ones). Network and losses are transcribed into
    this file; nothing of skassoc is used. A short loop runs first as
    warm-up; the timed loop is a fresh model trained for ``--steps`` steps
    (the model's construction is not timed, the loop is).
(b) **skassoc**: ``SemiSupervisedAssociationClassifier(**recipe_params("paper"),
    max_iter=N, ...)`` fitted on the same images and labels. A short fit runs
    first (CUDA init, cuDNN autotuning); the figure is the wall time of a
    whole second ``fit`` of N steps, which includes what ``fit`` does besides
    training: input validation, the copy of the data to the device and the
    capture of the CUDA graph. A third, short timed fit of ``--warmup-steps``
    steps gives the fixed cost of a fit, and from it the marginal speed of
    the training steps alone. With ``--compile``, every skassoc fit of (b)
    and (c) compiles its network (``compile=True``); the first, untimed
    fit pays for the compilation, and its wall time is recorded as
    ``first_fit_seconds``.
(c) **time to accuracy** (skip with ``--skip-accuracy``): skassoc, recipe
    ``--accuracy-recipe`` (default "paper"), 100 labels drawn with
    ``make_semi_supervised_labels(y, 10, random_state=seed)``. Scores during
    one fit (``fit(X, y, X_val=..., y_val=...)``) would show a single
    schedule part-way through; the question here is how short a whole
    schedule can be, so this runs complete fits of ``--accuracy-steps``
    steps (default 5000, 10000, 20000; each a full schedule with
    ``lr_decay_steps = max_iter // 4``) and reports each fit's wall time
    (evaluation excluded) and test error, and the shortest fit whose test
    error is at most ``--target-error`` percent.
(d) **predict throughput**: images/s of ``predict`` of the model of (b) on
    the 10,000 test images, and on ``--predict-rows`` rows made by tiling
    them (default 100,000 on a GPU, 20,000 on a CPU; shows the batching of
    ``predict``).

The test error of the models of (a) and (b) is printed as a sanity check
(both should train alike); it is not part of any timing.

Run on a GPU (about 1.5 minutes on an H200 with (c), 25 s without)::

    python benchmarks/bench_speed.py --device cuda
    python benchmarks/bench_speed.py --device cuda --precision bf16 --skip-accuracy
    python benchmarks/bench_speed.py --device cuda --compile

and on a CPU (short)::

    python benchmarks/bench_speed.py --device cpu --steps 20 --skip-accuracy

The MNIST files are read from ``--data-home`` (default: ``$SKASSOC_MNIST_DIR``,
else ``../shared/data/mnist`` next to the repository, else
``data_local/mnist`` in it). Results go to ``--json`` (default
``benchmarks/results/speed_<device>.json``) with the machine, the library
versions and all figures.
"""

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from _common import (
    REPO_ROOT,
    default_data_home,
    environment,
    synchronize,
)
from torch import nn

# Benchmark the checkout this script belongs to, installed or not.
sys.path.insert(0, str(REPO_ROOT))


from skassoc import (  # noqa: E402
    RECIPES,
    SemiSupervisedAssociationClassifier,
    recipe_params,
)
from skassoc.datasets import load_mnist, make_semi_supervised_labels  # noqa: E402

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

        def conv(cin, cout):
            return nn.Conv2d(cin, cout, 3, padding=1)

        self.features = nn.Sequential(
            conv(1, 32),
            nn.ELU(),
            conv(32, 32),
            nn.ELU(),
            nn.MaxPool2d(2, 2),
            conv(32, 64),
            nn.ELU(),
            conv(64, 64),
            nn.ELU(),
            nn.MaxPool2d(2, 2),
            conv(64, 128),
            nn.ELU(),
            conv(128, 128),
            nn.ELU(),
            nn.MaxPool2d(2, 2),
        )
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
    synchronize(device)
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
    synchronize(device)
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


# ------------------------------------------------------------------- helpers


def skassoc_fit(x, y_semi, max_iter, args, device, recipe="paper", **overrides):
    """Fit a recipe; return the estimator and the fit's wall seconds."""
    params = recipe_params(recipe)
    params.update(
        max_iter=max_iter,
        device=device.type,
        precision=args.precision,
        compile=args.compile,
        random_state=args.seed,
    )
    params.update(overrides)
    clf = SemiSupervisedAssociationClassifier(**params)
    synchronize(device)
    start = time.perf_counter()
    clf.fit(x, y_semi)
    synchronize(device)
    return clf, time.perf_counter() - start


def classifier_test_error(clf, x_test, y_test):
    return 100.0 * float(np.mean(clf.predict(x_test) != y_test))


def backend_flags():
    return {
        "cudnn_benchmark": torch.backends.cudnn.benchmark,
        "cudnn_allow_tf32": torch.backends.cudnn.allow_tf32,
        "matmul_allow_tf32": torch.backends.cuda.matmul.allow_tf32,
    }


def save(results, path):
    """Write the figures so far (after every part, so a crash keeps them)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w") as f:
        json.dump(results, f, indent=2)


def fmt(value):
    """Three significant figures, without exponent notation for large values."""
    if value >= 100:
        return f"{value:.0f}"
    return f"{value:.3g}"


def print_table(title, header, rows):
    widths = [
        max(len(str(row[i])) for row in [header, *rows]) for i in range(len(header))
    ]
    print(f"\n{title}")
    line = "  ".join(
        str(h).ljust(w) if i == 0 else str(h).rjust(w)
        for i, (h, w) in enumerate(zip(header, widths))
    )
    print(line)
    print("-" * len(line))
    for row in rows:
        print(
            "  ".join(
                str(c).ljust(w) if i == 0 else str(c).rjust(w)
                for i, (c, w) in enumerate(zip(row, widths))
            )
        )


def parse_args(argv=None):
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0],
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--device", choices=["auto", "cpu", "cuda"], default="auto")
    parser.add_argument(
        "--steps",
        type=int,
        default=None,
        help="timed training steps of (a) and (b) (default 2000 on cuda, 200 on cpu)",
    )
    parser.add_argument(
        "--warmup-steps",
        type=int,
        default=None,
        help="steps of the untimed warm-up loop and fit (default 50 cuda, 3 cpu)",
    )
    parser.add_argument(
        "--data-home",
        default=None,
        help="folder with the MNIST files (default: $SKASSOC_MNIST_DIR, else "
        "../shared/data/mnist beside the repository, else data_local/mnist)",
    )
    parser.add_argument(
        "--precision",
        choices=["auto", "fp32", "tf32", "bf16"],
        default="auto",
        help="skassoc's precision parameter (the bare loop is always float32)",
    )
    parser.add_argument(
        "--compile",
        action="store_true",
        help="skassoc's compile=True (torch.compile of the network) in (b) and (c)",
    )
    parser.add_argument("--seed", type=int, default=0, help="labels and init seed")
    parser.add_argument("--skip-accuracy", action="store_true", help="skip (c)")
    parser.add_argument(
        "--accuracy-steps",
        default="5000,10000,20000",
        help="comma-separated max_iter of the full fits of (c)",
    )
    parser.add_argument(
        "--target-error", type=float, default=1.0, help="test error %% of (c)"
    )
    parser.add_argument(
        "--accuracy-recipe",
        # The recipes for the MNIST network: this benchmark's data.
        choices=sorted(n for n, p in RECIPES.items() if p.get("network") == "mnist"),
        default="paper",
        help="recipe of the fits of (c) ((a) and (b) always use 'paper')",
    )
    parser.add_argument(
        "--predict-rows",
        type=int,
        default=None,
        help="tiled rows for (d) (default 100000 on cuda, 20000 on cpu)",
    )
    parser.add_argument(
        "--eval-rows",
        type=int,
        default=None,
        help="test images for the sanity-check test error of (a) and (b) "
        "(default all 10000 on cuda, 2000 on cpu); (c) always uses all",
    )
    parser.add_argument(
        "--json",
        default=None,
        help="where to write the results (default "
        "benchmarks/results/speed_<device>.json, speed_<device>_<precision>.json "
        "with --precision other than auto, _compile appended with --compile, "
        "and _<recipe> with --accuracy-recipe other than paper unless "
        "--skip-accuracy)",
    )
    return parser.parse_args(argv)


# ---------------------------------------------------------------------- main


def main(argv=None):
    args = parse_args(argv)
    if args.device == "auto":
        device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    else:
        device = torch.device(args.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        sys.exit("--device cuda was asked for, but torch sees no GPU.")
    on_gpu = device.type == "cuda"
    n_steps = args.steps or (2000 if on_gpu else 200)
    n_warmup = args.warmup_steps or (50 if on_gpu else 3)
    predict_rows = args.predict_rows or (100_000 if on_gpu else 20_000)
    eval_rows = args.eval_rows or (10_000 if on_gpu else 2_000)
    data_home = args.data_home or default_data_home()
    # One file per precision and recipe of (c) asked for, so that a bf16 run
    # or one of another recipe keeps the default file.
    suffix = "" if args.precision == "auto" else f"_{args.precision}"
    if args.compile:
        suffix += "_compile"
    if args.accuracy_recipe != "paper" and not args.skip_accuracy:
        suffix += f"_{args.accuracy_recipe}"
    json_path = Path(
        args.json
        or REPO_ROOT / "benchmarks" / "results" / f"speed_{device.type}{suffix}.json"
    )

    x_train, y_train = load_mnist("train", data_home=data_home, return_X_y=True)
    x_test, y_test = load_mnist("test", data_home=data_home, return_X_y=True)
    y_semi = make_semi_supervised_labels(
        y_train, LABELED_PER_CLASS, random_state=args.seed
    )
    labeled_idx = np.flatnonzero(y_semi != -1)

    meta = {
        **environment(device),
        "torch_interop_threads": torch.get_num_interop_threads(),
        "seed": args.seed,
        "label_seed": args.seed,
        "skassoc_random_state": args.seed,
        "steps": n_steps,
        "warmup_steps": n_warmup,
        "precision": args.precision,
        "compile": args.compile,
        "eval_rows": eval_rows,
        "predict_rows": predict_rows,
        "data_home": str(Path(data_home).resolve()),
    }
    print(
        f"device: {meta['device']} | torch {meta['torch']} | "
        f"threads {meta['torch_threads']} | steps {n_steps} | "
        f"warm-up {n_warmup} | skassoc precision {args.precision} | "
        f"compile {args.compile}"
    )
    results = {"meta": meta}

    # (a) bare loop
    xt = torch.as_tensor(x_train, dtype=torch.float32, device=device).unsqueeze(1)
    x_eval, y_eval = x_test[:eval_rows], y_test[:eval_rows]
    xv = torch.as_tensor(x_eval, dtype=torch.float32, device=device).unsqueeze(1)
    bare_flags = backend_flags()
    bare_train(xt, y_train, labeled_idx, n_warmup, args.seed, device)
    model, bare_s, bare_losses_ = bare_train(
        xt, y_train, labeled_idx, n_steps, args.seed, device
    )
    bare_err = bare_test_error(model, xv, y_eval)
    del model, xt, xv
    if on_gpu:
        torch.cuda.empty_cache()

    # (b) skassoc
    # Warm-up (CUDA context, cuDNN autotuning, compilation with --compile).
    _, first_s = skassoc_fit(x_train, y_semi, n_warmup, args, device)
    _, short_s = skassoc_fit(x_train, y_semi, n_warmup, args, device)
    clf, fit_s = skassoc_fit(x_train, y_semi, n_steps, args, device)
    sk_err = classifier_test_error(clf, x_eval, y_eval)
    # Compare the training loss over the same trailing window as skassoc's log.
    window = clf.history_["step"][-1] - (
        clf.history_["step"][-2] if len(clf.history_["step"]) > 1 else 0
    )
    bare_final = float(np.mean(bare_losses_[-window:]))
    sk_final = float(clf.history_["total"][-1])
    marginal = (
        (n_steps - n_warmup) / (fit_s - short_s)
        if n_steps > n_warmup and fit_s > short_s
        else None
    )
    images_per_step = LABELED_PER_CLASS * 10 + UNLABELED_BATCH

    training = {
        "bare": {
            "description": "eager loop, float32 tensors (no autocast, PyTorch "
            "default backend flags), numpy indices on the host, loss.item() "
            "every step; loop time only",
            "backend_flags": bare_flags,
            "seconds": bare_s,
            "steps_per_s": n_steps / bare_s,
            "ms_per_step": 1000 * bare_s / n_steps,
            "final_loss": bare_final,
            "test_error_percent": bare_err,
        },
        "skassoc": {
            "description": "wall time of fit(): validation, copy to the device, "
            "CUDA-graph capture (on GPUs) and the N steps",
            "seconds": fit_s,
            "steps_per_s": n_steps / fit_s,
            "ms_per_step": 1000 * fit_s / n_steps,
            "first_fit_seconds": first_s,
            "short_fit_steps": n_warmup,
            "short_fit_seconds": short_s,
            "marginal_steps_per_s": marginal,
            "final_loss": sk_final,
            "loss_window_steps": window,
            "test_error_percent": sk_err,
        },
        "ratio_skassoc_over_bare": bare_s / fit_s,
        "ratio_marginal_over_bare": (
            marginal * bare_s / n_steps if marginal is not None else None
        ),
        "images_per_step": images_per_step,
    }
    results["training"] = training
    save(results, json_path)

    def row(name, seconds, steps, loss=None, err=None):
        return [
            name,
            fmt(steps / seconds),
            fmt(1000 * seconds / steps),
            fmt(steps * images_per_step / seconds),
            fmt(seconds),
            "" if loss is None else f"{loss:.3f}",
            "" if err is None else f"{err:.2f}",
        ]

    rows = [
        row(
            "(a) bare PyTorch loop (eager, fp32)", bare_s, n_steps, bare_final, bare_err
        ),
        row("(b) skassoc fit(), whole call", fit_s, n_steps, sk_final, sk_err),
        row(f"    skassoc fit() of {n_warmup} steps", short_s, n_warmup),
    ]
    if args.compile:
        rows.append(row("    first fit (compiles), untimed above", first_s, n_warmup))
    if marginal is not None:
        rows.append(
            row(
                f"    skassoc marginal: fit({n_steps}) - fit({n_warmup})",
                (n_steps - n_warmup) / marginal,
                n_steps - n_warmup,
            )
        )
    blank = [""] * 5
    rows.append(["ratio (b)/(a), steps/s", f"{bare_s / fit_s:.2f}x", *blank])
    if marginal is not None:
        rows.append(
            [
                "ratio marginal/(a), steps/s",
                f"{training['ratio_marginal_over_bare']:.2f}x",
                *blank,
            ]
        )
    print_table(
        f"Training, {n_steps} timed steps after a {n_warmup}-step warm-up "
        f"(skassoc precision={args.precision}, compile={args.compile}, "
        f"{images_per_step} images/step)",
        [
            "",
            "steps/s",
            "ms/step",
            "images/s",
            "wall s",
            "final loss",
            f"err % ({eval_rows} test)",
        ],
        rows,
    )
    print(
        "(a): the loop alone, loss.item() every step. (b): wall time of the "
        "whole fit() call,\nincluding input validation, the copy to the device "
        "and (on GPUs) its CUDA-graph capture.\nfinal loss: mean total loss of "
        f"the last {window} steps. err: sanity check, not part of the timing."
    )

    # (d) predict throughput
    clf.predict(x_test[:1000])  # warm-up
    tiled = np.tile(x_test, (-(-predict_rows // len(x_test)), 1, 1))
    tiled = tiled[:predict_rows]
    predict = {"predict_batch_size": clf.predict_batch_size, "runs": {}}
    for name, data in [("test_10k", x_test), (f"tiled_{len(tiled)}", tiled)]:
        repeats = 3 if on_gpu else 1
        times = []
        for _ in range(repeats):
            synchronize(device)
            start = time.perf_counter()
            clf.predict(data)
            synchronize(device)
            times.append(time.perf_counter() - start)
        seconds = float(np.median(times))
        predict["runs"][name] = {
            "rows": len(data),
            "seconds": seconds,
            "images_per_s": len(data) / seconds,
            "repeats": repeats,
        }
    results["predict"] = predict
    save(results, json_path)
    print_table(
        "predict() throughput (median of 3 on GPU, 1 on CPU; numpy uint8 in, "
        "labels out)",
        ["", "rows", "seconds", "images/s"],
        [
            [name, v["rows"], f"{v['seconds']:.3f}", f"{v['images_per_s']:.0f}"]
            for name, v in predict["runs"].items()
        ],
    )

    # (c) time to accuracy
    if not args.skip_accuracy:
        fits = []
        for max_iter in [int(s) for s in args.accuracy_steps.split(",") if s]:
            clf, seconds = skassoc_fit(
                x_train,
                y_semi,
                max_iter,
                args,
                device,
                recipe=args.accuracy_recipe,
                lr_decay_steps=max(1, max_iter // 4),
            )
            err = classifier_test_error(clf, x_test, y_test)
            fits.append(
                {
                    "max_iter": max_iter,
                    "lr_decay_steps": max(1, max_iter // 4),
                    "fit_seconds": seconds,
                    "test_error_percent": err,
                }
            )
            print(
                f"  full schedule of {max_iter} steps: {seconds:.1f} s, "
                f"test error {err:.2f}%",
                flush=True,
            )
        reached = [f for f in fits if f["test_error_percent"] <= args.target_error]
        best = min(reached, key=lambda f: f["fit_seconds"]) if reached else None
        results["time_to_accuracy"] = {
            "description": "complete fits (full lr schedule, lr_decay_steps = "
            "max_iter // 4), fit wall time, evaluation excluded",
            "recipe": args.accuracy_recipe,
            "target_error_percent": args.target_error,
            "fits": fits,
            "seconds_to_target": best["fit_seconds"] if best else None,
            "max_iter_to_target": best["max_iter"] if best else None,
        }
        print_table(
            f"Time to <= {args.target_error}% test error, MNIST 100 labels "
            f"(recipe {args.accuracy_recipe!r}, label seed {args.seed}); each row "
            "a complete fit",
            ["", "fit wall s", "test err %", f"<= {args.target_error}%"],
            [
                [
                    f"full schedule of {f['max_iter']} steps",
                    f"{f['fit_seconds']:.1f}",
                    f"{f['test_error_percent']:.2f}",
                    "yes" if f["test_error_percent"] <= args.target_error else "no",
                ]
                for f in fits
            ],
        )
        if best:
            print(
                f"time to <= {args.target_error}%: {best['fit_seconds']:.1f} s "
                f"(full schedule of {best['max_iter']} steps)"
            )
        else:
            print(f"no fit reached <= {args.target_error}% test error")

        save(results, json_path)
    print(f"\nwrote {json_path}")


if __name__ == "__main__":
    main()

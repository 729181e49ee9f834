"""One fit on 1, 2 and 4 GPUs: training throughput and scaling efficiency.

``docs/benchmarks/speed.rst`` says what the tables measure::

    python benchmarks/bench_multi_gpu.py --gpus 1,2,4
    python benchmarks/bench_multi_gpu.py --gpus 1,2 --only throughput \\
        --json benchmarks/results/multi_gpu_cuda_x2.json
    python benchmarks/bench_multi_gpu.py --gpus 1,4 --only accuracy
    python benchmarks/bench_multi_gpu.py --device cpu --only accuracy \\
        --gpus 1,2 --accuracy-steps 5 --train-subset 2000 --eval-subset 500
    python benchmarks/bench_multi_gpu.py --render-only

Every run starts one process per GPU, as ``torchrun`` would, joins them in an
NCCL group (gloo with ``--device cpu``), and fits the same data in each
(skassoc then trains data-parallel: each process embeds its share of every
step's batch). Two sections (``--only SECTION``; the JSON keeps the other):

``throughput``
    The time of the steps between the first and the last log point of a fit
    (after a warm-up fit), so process start-up, input checks and CUDA-graph
    capture are left out.
``accuracy``
    The test error of ``--accuracy-draws`` label draws fitted with
    ``--accuracy-recipe`` on one GPU and on the most GPUs of ``--gpus``: the
    same global batch and steps, so the errors should agree within the
    spread of the draws; each fit's wall time and time a step are recorded
    beside its error. Rendered under a rubric of its own, after the
    throughput table. A rerun keeps the runs before it (``earlier_accuracy``)
    as rows marked "earlier run".

The JSON is written as each section grows (after every case, after every
process count's fits), so a run stopped at a time limit keeps what it
measured.
"""

import os
import tempfile
import time
import warnings

import _harness as h
import numpy as np
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from skassoc import RECIPES, SemiSupervisedAssociationClassifier, recipe_params
from skassoc.callbacks import Callback
from skassoc.datasets import make_semi_supervised_labels

#: The cases: estimator parameters on MNIST with 10 labels a class.
CASES = {
    # Compute-bound: the SVHN network on 32x32 colour images, a large batch.
    "svhn32, 2,000 unlabeled": dict(
        network="svhn", image_size=32, image_channels=3, unlabeled_batch_size=2000
    ),
    # Compute-bound, and a network with batch norm (synchronised over the
    # processes): the STL-10 network on 96x96 colour images.
    "stl10 96x96, 1,000 unlabeled": dict(
        network="stl10", image_size=96, image_channels=3, unlabeled_batch_size=1000
    ),
    # The paper's MNIST recipe with a 4x unlabeled batch: latency-bound.
    "mnist paper, 400 unlabeled": {
        **recipe_params("paper"),
        "unlabeled_batch_size": 400,
    },
}
LABELED = 10 * 10  # 10 classes, 10 labeled samples a class a step
SECTIONS = ("throughput", "accuracy")
#: Labels a class of every accuracy draw, as the other MNIST benchmarks draw them.
ACCURACY_LABELS = 10
ACCURACY_RUBRIC = "Test error on one GPU and on several, the same global batch"


def parse_args(argv=None):
    parser = h.make_parser(__doc__.split("\n")[0], "multi_gpu", cases=False)
    parser.set_defaults(device="cuda")
    add = parser.add_argument
    add(
        "--gpus",
        default="1,2,4",
        help="GPU counts to run (those available; processes with --device cpu)",
    )
    add("--only", action="append", choices=SECTIONS, help="run this section")
    add("--steps", type=h.bounded_int(20), default=400, help="steps of a timed fit")
    add("--seed", type=h.seed_int, default=0, help="labels and init seed")
    add("--cuda-graph", choices=["auto", "off"], default="auto")
    draws = h.bounded_int(1, h.MAX_DRAWS)
    add("--accuracy-draws", type=draws, default=5, help="label draws 0..N-1")
    mnist = sorted(n for n, r in RECIPES.items() if r.get("network") == "mnist")
    add("--accuracy-recipe", choices=mnist, default="fast")
    add("--accuracy-steps", type=h.bounded_int(1), help="default: the recipe's")
    add(
        "--train-subset",
        type=h.bounded_int(1, h.MNIST_TRAIN_IMAGES),
        help="accuracy: the first N training images (default all)",
    )
    add(
        "--eval-subset",
        type=h.bounded_int(1, h.MNIST_TEST_IMAGES),
        help="accuracy: the first N test images (default all)",
    )
    args = h.parse(parser, argv)
    args.gpu_counts = _counts(parser, args.gpus)
    args.only = args.only or list(SECTIONS)
    if not args.device.startswith("cuda") and "throughput" in args.only:
        parser.error(
            "the throughput section times GPUs (--device cuda); on another "
            "device run --only accuracy"
        )
    return args


def _counts(parser, text):
    """``--gpus`` as a sorted list of distinct positive ints, else a usage error."""
    try:
        counts = sorted({int(c) for c in text.split(",")})
    except ValueError:
        counts = []
    if not counts or counts[0] < 1:
        parser.error(f"--gpus takes counts such as 1,2,4, not {text!r}")
    return counts


class _StepClock(Callback):
    """The time of every log point (rank 0 reads it back) of a fit on
    ``device``."""

    def __init__(self, device):
        self.device = torch.device(device)
        self.points = []

    def on_log(self, run):
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
        self.points.append((run.step, time.perf_counter()))

    def span(self):
        """The steps and seconds between the first and the last log point."""
        (first, start), (last, end) = self.points[0], self.points[-1]
        return last - first, end - start

    def ms_per_step(self):
        """Milliseconds a step between the first and the last log point
        (None for a fit of fewer than two log points)."""
        steps, seconds = self.span()
        return 1000 * seconds / steps if steps else None


def _join(rank, world, rendezvous, device_type):
    """Process ``rank`` of ``world`` on its GPU (or a CPU), in the group."""
    if device_type == "cuda":
        torch.cuda.set_device(rank)
    else:
        torch.set_num_threads(1)  # one core a process, as a CPU fit would get
    if world > 1:
        backend = "nccl" if device_type == "cuda" else "gloo"
        dist.init_process_group(
            backend, init_method=f"file://{rendezvous}", rank=rank, world_size=world
        )


def _worker(rank, world, rendezvous, args, case, out):
    _join(rank, world, rendezvous, "cuda")
    X, y_semi, _, _ = h.mnist_semi(args, args.seed)
    # The step count is the benchmark's, not the recipe's.
    recipe = {k: v for k, v in CASES[case].items() if k != "max_iter"}
    params = {
        **recipe,
        "device": "cuda",
        "random_state": args.seed,
        "labeled_per_class": 10,
        "lr_decay_steps": 10**6,
        "cuda_graph": args.cuda_graph == "auto",
    }
    warm = SemiSupervisedAssociationClassifier(**params, max_iter=30)
    warm.fit(X, y_semi)
    clock = _StepClock("cuda")
    clf = SemiSupervisedAssociationClassifier(
        **params, max_iter=args.steps, callbacks=[clock]
    )
    clf.fit(X, y_semi)
    if rank == 0:
        steps, seconds = clock.span()
        h.write_json(out, {"steps": steps, "seconds": seconds})
    if world > 1:
        dist.destroy_process_group()


def _spawn(worker, world, *args):
    """Run ``worker(rank, world, rendezvous, *args, out)`` in ``world``
    processes; what process 0 wrote to ``out``."""
    with tempfile.TemporaryDirectory() as folder:
        out = os.path.join(folder, "result.json")
        mp.start_processes(
            worker,
            args=(world, os.path.join(folder, "rendezvous"), *args, out),
            nprocs=world,
            start_method="spawn",
        )
        return h.load_json(out)


def run_case(args, case, world):
    timing = _spawn(_worker, world, args, case)
    unlabeled = CASES[case]["unlabeled_batch_size"]
    timing["samples_per_s"] = (
        timing["steps"] * (LABELED + unlabeled) / timing["seconds"]
    )
    print(
        f"{case}, {world} GPU(s): {timing['samples_per_s']:.0f} samples/s", flush=True
    )
    return timing


def measure_throughput(args, counts, save):
    """The throughput section, handed to ``save`` after every case."""
    results = {
        "environment": h.environment(h.resolve_device("cuda")),
        # What precision="auto" chose for these image networks.
        "precision": h.resolved_precision({}, "cuda", images=True),
        "steps": args.steps,
        "seed": args.seed,
        "cuda_graph": args.cuda_graph,
        "cases": {},
    }
    for case in CASES:
        runs = {str(n): run_case(args, case, n) for n in counts}
        one = runs[str(counts[0])]["samples_per_s"] / counts[0]
        for n, run in runs.items():
            run["speedup"] = run["samples_per_s"] / (one * counts[0])
            run["efficiency"] = run["samples_per_s"] / (one * int(n))
        results["cases"][case] = runs
        save(results)
    return results


def _accuracy_worker(rank, world, rendezvous, params, data, draws, out):
    """Fit label draws ``0..draws-1`` in this group; process 0 scores them."""
    _join(rank, world, rendezvous, params["device"])
    X, y, X_test, y_test = data
    fits = []
    device = torch.device(params["device"])
    for draw in range(draws):
        y_semi = make_semi_supervised_labels(y, ACCURACY_LABELS, random_state=draw)
        clock = _StepClock(device)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            fit_params = {**params, "random_state": draw, "callbacks": [clock]}
            clf, seconds = h.timed_fit(X, y_semi, fit_params, device)
        if rank == 0:
            error = h.error_percent(clf.predict(X_test), y_test)
            fits.append({"draw": draw, "test_error_percent": error})
            fits[-1].update(fit_seconds=seconds, n_iter=int(clf.n_iter_))
            # Beside the wall time: the fit less its steps is its fixed work.
            fits[-1]["step_ms"] = clock.ms_per_step()
            # What the fit told its user (a collapse warns, for one).
            fits[-1]["warnings"] = sorted({w.category.__name__ for w in caught})
            print(f"accuracy, {world} process(es), draw {draw}: {error:.2f} %")
    if rank == 0:
        h.write_json(out, {"fits": fits})
    if world > 1:
        dist.destroy_process_group()


def load_sets(args):
    """MNIST's training and test images and labels, cut to the subsets asked."""
    (X, y), (X_test, y_test) = h.load_mnist_sets(args.data_home)
    train, test = slice(args.train_subset), slice(args.eval_subset)
    return X[train], y[train], X_test[test], y_test[test]


def accuracy_params(args, device):
    """The recipe's parameters, cut to ``--accuracy-steps`` (schedule scaled)."""
    params = recipe_params(args.accuracy_recipe)
    if args.accuracy_steps is not None:
        params = h.scaled_schedule(params, args.accuracy_steps)
    if device.type != "cuda":
        params["compile"] = False  # compiling on a CPU outlasts a short fit
    return {**params, "device": device.type}


def measure_accuracy(args, counts, save):
    """Errors of the same draws on one device and on the most devices asked;
    the section is handed to ``save`` after each process count's fits."""
    device = h.resolve_device(args.device)
    params = accuracy_params(args, device)
    data = load_sets(args)
    section = {
        "environment": h.environment(device),
        "recipe": args.accuracy_recipe,
        "params": params,
        "draws": args.accuracy_draws,
        "labels_per_class": ACCURACY_LABELS,
        "train_images": len(data[0]),
        "test_images": len(data[2]),
        "runs": {},
    }
    for n in sorted({1, counts[-1]}):
        fits = _spawn(_accuracy_worker, n, params, data, args.accuracy_draws)
        section["runs"][str(n)] = fits
        save(section)
    return section


def measure(args):
    """The sections asked for, added to what the JSON holds."""
    device = h.resolve_device(args.device)
    results = {}
    if os.path.exists(args.json):
        results = h.read_results(args.json)
        held = [
            results.get("environment"),
            results.get("accuracy", {}).get("environment"),
        ]
        for environment in filter(None, held):
            h.check_device(args.json, environment.get("device_type"), device.type)
    counts = args.gpu_counts
    if device.type == "cuda":
        counts = [n for n in counts if n <= torch.cuda.device_count()]
        if not counts:
            raise SystemExit(
                f"error: --gpus {args.gpus} asks for more GPUs than the "
                f"{torch.cuda.device_count()} torch sees here"
            )
    # Each section is written as it grows: a run stopped at a time limit
    # keeps the cases and process counts it measured.
    if "throughput" in args.only:
        measure_throughput(args, counts, lambda section: _save(args, results, section))
    if "accuracy" in args.only:
        if "accuracy" in results:
            # A rerun keeps the earlier runs' fits: a rare outcome (one
            # collapsed draw) stays on record rather than being overwritten.
            results.setdefault("earlier_accuracy", []).append(results.pop("accuracy"))
        measure_accuracy(
            args, counts, lambda section: _save(args, results, {"accuracy": section})
        )
    return results


def _save(args, results, section):
    """Add ``section``'s keys to ``results`` and write them to ``--json``."""
    results.update(section)
    h.write_json(args.json, results)


def render(results):
    """The throughput table (if measured), then the accuracy table under a
    rubric of its own (the docs show it ``:after:`` the rubric)."""
    parts = [render_table(results).rstrip("\n")] if "cases" in results else []
    if "accuracy" in results:
        parts.append(f".. rubric:: {ACCURACY_RUBRIC}\n\n{accuracy_table(results)}")
    return "\n\n".join(parts) if parts else None


def _accuracy_rows(section, suffix=""):
    """A row per process count of one run of the accuracy section."""
    rows = []
    for n, run in section["runs"].items():
        errors = [fit["test_error_percent"] for fit in run["fits"]]
        seconds = [fit["fit_seconds"] for fit in run["fits"]]
        by_draw = ", ".join(f"{e:.2f}" for e in errors)
        step_ms = [fit["step_ms"] for fit in run["fits"] if fit.get("step_ms")]
        step_cell = f"{float(np.median(step_ms)):.2f}" if step_ms else "n/a"
        rows.append(
            [n + suffix, str(len(errors)), h.median_cell(errors)]
            + [f"{max(errors):.2f}", by_draw, f"{float(np.median(seconds)):.1f}"]
            + [step_cell, _warned(run["fits"])]
        )
    return rows


#: What an accuracy run's rows depend on besides its draws and machine.
SETTINGS = ("recipe", "params", "labels_per_class", "train_images", "test_images")


def accuracy_table(results):
    """A row per process count: the draws' median and worst test error; then
    the rows of earlier runs, numbered from the oldest."""
    section = results["accuracy"]
    params = section["params"]
    rows = _accuracy_rows(section)
    earlier = results.get("earlier_accuracy", [])
    for number, run in enumerate(earlier, 1):
        rows += _accuracy_rows(run, f", earlier run {number}")
    unit = "GPUs" if section["environment"]["device_type"] == "cuda" else "Processes"
    header = [unit, "Draws", "Error % (median)", "Worst", "Error % by draw"]
    header += ["Fit s (median)", "Step ms (median)", "Draws that warned"]
    note = (
        f'Recipe "{section["recipe"]}", {params["max_iter"]:,} steps of '
        f"{params['labeled_per_class']} labeled a class and "
        f"{params['unlabeled_batch_size']} unlabeled images (the global batch, "
        f"split among the processes), {section['labels_per_class']} labels a "
        f"class, label draws 0-{section['draws'] - 1}, "
        f"{section['test_images']:,} test images. Step ms: the time of a step "
        "between the first and the last log point of a fit (n/a: not recorded, "
        "or fewer than two log points); Fit s less the steps' time is roughly "
        "its fixed work (checks, set-up, capture and compiling, the work after "
        "training)."
    )
    if earlier:
        same = all(
            run.get(key) == section.get(key) for run in earlier for key in SETTINGS
        )
        note += (
            ' Rows marked "earlier run" are previous runs of the section, '
            + ("with the same settings" if same else "with other settings")
            + ", numbered from the oldest (their machines and revisions are in "
            "the JSON)."
        )
    return note + "\n\n" + h.rst_table(header, rows)


def _warned(fits):
    """The draws whose fit warned, with the warnings' classes."""
    if any("warnings" not in fit for fit in fits):
        return "not recorded"
    warned = [
        f"{fit['draw']} ({', '.join(fit['warnings'])})"
        for fit in fits
        if fit["warnings"]
    ]
    return "; ".join(warned) or "none"


def render_table(results):
    rows = []
    for case, runs in results["cases"].items():
        for n, run in runs.items():
            rows.append(
                [
                    case,
                    n,
                    f"{run['samples_per_s']:,.0f}",
                    f"{1000 * run['seconds'] / run['steps']:.2f}",
                    f"{run['speedup']:.2f}",
                    f"{100 * run['efficiency']:.0f} %",
                ]
            )
    header = ["case", "GPUs", "samples/s", "ms/step", "speed-up", "efficiency"]
    precision = results.get("precision", h.AUTO_ON_GPU_BEFORE_BF16)
    note = (
        f"{results['steps']} steps a fit (timed between its first and last log "
        f"point), seed {results['seed']}, precision {precision}, CUDA graphs "
        f"{results.get('cuda_graph', 'auto')}."
    )
    return note + "\n\n" + h.rst_table(header, rows, right=False) + "\n"


def main(argv=None):
    h.measure_main(parse_args(argv), measure, render)


if __name__ == "__main__":
    main()

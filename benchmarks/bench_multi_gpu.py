"""One fit on 1, 2 and 4 GPUs: training throughput and scaling efficiency.

``docs/benchmarks/speed.rst`` says what the table measures::

    python benchmarks/bench_multi_gpu.py --gpus 1,2,4
    python benchmarks/bench_multi_gpu.py --render-only

Every run starts one process per GPU, as ``torchrun`` would, joins them in an
NCCL group, and fits the same data in each (skassoc then trains
data-parallel: each process embeds its share of every step's batch). The
time is that of the steps between the first and the last log point of a fit
(after a warm-up fit), so process start-up, input checks and CUDA-graph
capture are left out.
"""

import os
import tempfile
import time

import _harness as h
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from skassoc import SemiSupervisedAssociationClassifier, recipe_params
from skassoc.callbacks import Callback

#: The cases: estimator parameters on MNIST with 10 labels a class.
CASES = {
    # Compute-bound: the SVHN network on 32x32 colour images, a large batch.
    "svhn32, 2,000 unlabeled": dict(
        network="svhn", image_size=32, image_channels=3, unlabeled_batch_size=2000
    ),
    # The paper's MNIST recipe with a 4x unlabeled batch: latency-bound.
    "mnist paper, 400 unlabeled": {
        **recipe_params("paper"),
        "unlabeled_batch_size": 400,
    },
}
LABELED = 10 * 10  # 10 classes, 10 labeled samples a class a step


def parse_args(argv=None):
    parser = h.make_parser(__doc__.split("\n")[0], "multi_gpu", cases=False)
    parser.set_defaults(device="cuda")
    add = parser.add_argument
    add("--gpus", default="1,2,4", help="GPU counts to run (those available)")
    add("--steps", type=h.bounded_int(20), default=400, help="steps of a timed fit")
    add("--seed", type=h.seed_int, default=0, help="labels and init seed")
    add("--cuda-graph", choices=["auto", "off"], default="auto")
    return h.parse(parser, argv)


class _StepClock(Callback):
    """The time of every log point (rank 0 reads it back)."""

    def __init__(self):
        self.points = []

    def on_log(self, run):
        torch.cuda.synchronize()
        self.points.append((run.step, time.perf_counter()))


def _worker(rank, world, rendezvous, args, case, out):
    torch.cuda.set_device(rank)
    if world > 1:
        dist.init_process_group(
            "nccl", init_method=f"file://{rendezvous}", rank=rank, world_size=world
        )
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
    clock = _StepClock()
    clf = SemiSupervisedAssociationClassifier(
        **params, max_iter=args.steps, callbacks=[clock]
    )
    clf.fit(X, y_semi)
    if rank == 0:
        (first, start), (last, end) = clock.points[0], clock.points[-1]
        h.write_json(out, {"steps": last - first, "seconds": end - start})
    if world > 1:
        dist.destroy_process_group()


def run_case(args, case, world):
    with tempfile.TemporaryDirectory() as folder:
        out = os.path.join(folder, "result.json")
        mp.start_processes(
            _worker,
            args=(world, os.path.join(folder, "rendezvous"), args, case, out),
            nprocs=world,
            start_method="spawn",
        )
        timing = h.load_json(out)
    unlabeled = CASES[case]["unlabeled_batch_size"]
    timing["samples_per_s"] = (
        timing["steps"] * (LABELED + unlabeled) / timing["seconds"]
    )
    print(
        f"{case}, {world} GPU(s): {timing['samples_per_s']:.0f} samples/s", flush=True
    )
    return timing


def measure(args):
    available = torch.cuda.device_count()
    counts = [n for n in (int(c) for c in args.gpus.split(",")) if n <= available]
    results = {
        "environment": h.environment(h.resolve_device("cuda")),
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
    return results


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
    note = (
        f"{results['steps']} steps a fit (timed between its first and last log "
        f"point), seed {results['seed']}, default precision, CUDA graphs "
        f"{results.get('cuda_graph', 'auto')}."
    )
    return note + "\n\n" + h.rst_table(header, rows, right=False) + "\n"


def main(argv=None):
    h.measure_main(parse_args(argv), measure, lambda r: render_table(r).rstrip("\n"))


if __name__ == "__main__":
    main()

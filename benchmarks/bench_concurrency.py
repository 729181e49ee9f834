"""How much one GPU gains from running several small training steps at once.

``GridSearchCV`` with ``device="cuda"`` fits candidates in threads, each on a
CUDA stream of its own. Parts (a)-(c) bound what that can gain at the paper's
batch (100 labeled + 100 unlabeled 28x28 images), free of skassoc: the bare
loop of ``bench_speed.py`` (Adam with ``capturable=True``), each model's step
captured as a CUDA graph on random inputs, in TF32 and in bf16 autocast.
(a) One graph replayed alone. (b) ``N`` models (``--streams``) replayed in
turn from one thread, each on its own stream. (c) One model with an ``N``-fold
batch: an estimate of stacking ``N`` candidates into one network (which would
have ``N`` sets of weights and association matrices where this has one).
(d) ``N`` skassoc fits of recipe "paper" on synthetic images, one after
another, then in ``N`` threads as joblib's threading backend runs them.

``python benchmarks/bench_concurrency.py`` measures (on a GPU);
``--render-only`` rewrites the table from ``results/concurrency_cuda.json``.
"""

import time
from concurrent.futures import ThreadPoolExecutor

import _harness as h
import numpy as np
import torch
from bench_speed import BareMNISTNet, bare_losses

from skassoc import SemiSupervisedAssociationClassifier, recipe_params

IMAGES_PER_STEP = 200
LABELED = 100
#: The backend settings of every measurement, recorded in the JSON.
BACKEND = {"cudnn_benchmark": True, "cudnn_allow_tf32": True, "matmul_allow_tf32": True}


def parse_args(argv=None):
    parser = h.make_parser(__doc__.split("\n\n")[0], "concurrency", cases=False)
    add = parser.add_argument
    add("--streams", type=int, nargs="+", default=[2, 4, 8], help="values of N")
    add("--steps", type=int, default=500, help="timed replays")
    add("--fit-steps", type=int, default=1000, help="steps of a fit of (d); 0 skips")
    add("--pool-size", type=int, default=10_000, help="images of a fit of (d)")
    add("--precisions", nargs="+", default=["tf32", "bf16"], choices=["tf32", "bf16"])
    parser.set_defaults(device="cuda")
    args = h.parse(parser, argv)
    if min(args.streams) < 1 or args.steps < 1 or args.fit_steps < 0:
        parser.error("--streams, --steps and --fit-steps take positive integers")
    if args.pool_size < 200:
        parser.error("--pool-size must be at least 200 (100 labeled images)")
    # Each figure once: a repeated value would be measured twice.
    args.streams = sorted(set(args.streams))
    args.precisions = list(dict.fromkeys(args.precisions))
    return args


def captured_step(device, bf16, images=IMAGES_PER_STEP, seed=0):
    """A fresh model's training step on fixed random inputs, as a CUDA graph.

    Returns the graph and the step function: the graph holds no Python
    references to the tensors it reads, so the caller must keep the step.
    """
    torch.manual_seed(seed)
    model = BareMNISTNet().to(device)
    optimizer = torch.optim.Adam(
        model.parameters(), lr=torch.tensor(1e-3, device=device), capturable=True
    )
    x = torch.randint(0, 256, (images, 1, 28, 28), device=device).float()
    labels = torch.arange(LABELED * images // IMAGES_PER_STEP, device=device) % 10
    n_labeled = len(labels)

    def step():
        with torch.autocast("cuda", torch.bfloat16, enabled=bf16, cache_enabled=False):
            embeddings = model.embed(x)
        embeddings = embeddings.float()
        a, b = embeddings[:n_labeled], embeddings[n_labeled:]
        optimizer.zero_grad(set_to_none=False)
        sum(bare_losses(model, a, b, labels)).backward()
        optimizer.step()

    # Eager warm-up on a side stream (optimizer state, cuDNN autotuning).
    side = torch.cuda.Stream(device)
    side.wait_stream(torch.cuda.current_stream(device))
    with torch.cuda.stream(side):
        for _ in range(3):
            step()
    torch.cuda.current_stream(device).wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        step()
    return graph, step


def seconds_per_round(graphs, streams, rounds, device):
    """Wall seconds per round of one replay of every graph, each on its stream."""

    def replay():
        for _ in range(rounds):
            for graph, stream in zip(graphs, streams):
                with torch.cuda.stream(stream):
                    graph.replay()

    return h.timed(replay, device)[1] / rounds


def measure(precision, args, device):
    """Parts (a) to (d) in one precision."""
    bf16 = precision == "bf16"
    n_max = max(args.streams)
    steps = [captured_step(device, bf16, seed=i) for i in range(n_max)]
    graphs = [graph for graph, _ in steps]
    streams = [torch.cuda.Stream(device) for _ in range(n_max)]
    seconds_per_round(graphs, streams, 20, device)  # warm-up
    alone = seconds_per_round(graphs[:1], streams[:1], args.steps, device)
    rows = [{"models": 1, "ms_per_step": alone * 1e3, "speedup": 1.0}]
    for n in (n for n in args.streams if n > 1):
        per_step = seconds_per_round(graphs[:n], streams[:n], args.steps, device) / n
        speedup = alone / per_step
        rows.append({"models": n, "ms_per_step": per_step * 1e3, "speedup": speedup})
    del steps, graphs
    stacked = []
    for n in args.streams:
        graph, step = captured_step(device, bf16, images=n * IMAGES_PER_STEP)
        stream = torch.cuda.Stream(device)
        seconds_per_round([graph], [stream], 10, device)
        seconds = seconds_per_round([graph], [stream], args.steps, device)
        row = dict(batch_multiple=n, images_per_step=n * IMAGES_PER_STEP)
        row.update(ms_per_step=seconds * 1e3, ms_per_200_images=seconds / n * 1e3)
        stacked.append(row | {"speedup": alone / (seconds / n)})
        del graph, step
    results = {"side_by_side": rows, "stacked": stacked}
    if args.fit_steps:
        results["skassoc_threads"] = measure_fits(precision, args, device)
    return results


def synthetic_images(n_images, seed=0):
    """Random 28 x 28 uint8 images with 10 labels of each of 10 classes."""
    rng = np.random.default_rng(seed)
    X = rng.integers(0, 256, size=(n_images, 28, 28), dtype=np.uint8)
    y = np.full(n_images, -1)
    y[:100] = np.arange(100) % 10
    return X, y


def measure_fits(precision, args, device):
    """Part (d): skassoc fits on ``device`` one after another, then in threads
    (the serial time of fewer than the most fits: that many mean fits)."""
    X, y = synthetic_images(args.pool_size)

    def fit(seed, steps=args.fit_steps):
        params = dict(max_iter=steps, device=str(device), precision=precision)
        params = recipe_params("paper") | params | {"random_state": seed}
        SemiSupervisedAssociationClassifier(**params).fit(X, y)

    # cuDNN autotuning, CUDA context, first capture.
    fit(0, steps=min(50, args.fit_steps))
    n_max = max(args.streams)
    start = time.perf_counter()
    for seed in range(n_max):
        fit(seed)
    per_fit = (time.perf_counter() - start) / n_max

    def row(n, seconds):
        ms = seconds / (n * args.fit_steps) * 1e3
        row = dict(fits=n, serial_s=n * per_fit, threads_s=seconds)
        return row | {"ms_per_step": ms, "speedup": n * per_fit / seconds}

    rows = [row(1, per_fit)]
    for n in (n for n in args.streams if n > 1):
        start = time.perf_counter()
        with ThreadPoolExecutor(n) as pool:
            list(pool.map(fit, range(n)))
        rows.append(row(n, time.perf_counter() - start))
    return rows


def render(results):
    """(b), (c) and (d) side by side: ms a step per model and the speed-up."""
    header = ["N", "side by side (bare)", "N x batch (bare)", "skassoc in threads"]
    cells = []
    for precision in ("tf32", "bf16"):
        if precision not in results:
            continue
        part = results[precision]
        cells.append([precision.upper().replace("BF", "bf"), "", "", ""])
        side = {r["models"]: r for r in part["side_by_side"]}
        stacked = {r["batch_multiple"]: r for r in part["stacked"]}
        stacked.setdefault(1, {**side[1], "ms_per_200_images": side[1]["ms_per_step"]})
        fits = {r["fits"]: r for r in part.get("skassoc_threads", [])}

        def cell(row, key="ms_per_step"):
            return f"{row[key]:.3f} ms ({row['speedup']:.2f}x)" if row else "n/a"

        for n in sorted(side):
            stack = cell(stacked.get(n), "ms_per_200_images")
            cells.append([str(n), cell(side[n]), stack, cell(fits.get(n))])
    return f"{h.env_line(results['environment'])}\n\n{h.rst_table(header, cells)}"


def run(args):
    """Every part in every precision, the JSON rewritten after each."""
    if not torch.cuda.is_available():
        raise SystemExit(
            "error: bench_concurrency.py measures CUDA streams and graphs and "
            "needs a GPU; torch sees none."
        )
    device = torch.device("cuda")
    if "bf16" in args.precisions and not torch.cuda.is_bf16_supported():
        # Autocast would fall back to float32 with only a warning.
        raise SystemExit(
            "error: this GPU has no bf16 arithmetic; use --precisions tf32"
        )
    torch.backends.cudnn.benchmark = True
    torch.backends.cuda.matmul.allow_tf32 = True
    torch.backends.cudnn.allow_tf32 = True
    env = h.environment(device)
    results = {"environment": env, "args": vars(args), "backend": BACKEND}
    for precision in args.precisions:
        results[precision] = measure(precision, args, device)
        h.write_json(args.json, results)
    return results


def main(argv=None):
    """Measure, write the JSON and the table; see the module docstring."""
    h.measure_main(parse_args(argv), run, render)


if __name__ == "__main__":
    main()

"""Scaling out and up: parallel search, large unlabeled batches, memmap pools.

Three sections (``--only SECTION``; the JSON keeps the others), described in
``docs/benchmarks/speed.rst``; the table file shows each section held in the
JSON under a rubric of its own::

    python benchmarks/bench_scale.py --device cuda
    python benchmarks/bench_scale.py --device cpu --only memmap \\
        --memmap-steps 20 --pool-size 200000 --json /tmp/scale.json
    python benchmarks/bench_scale.py --device cuda --render-only
"""

import os
import re
import tempfile
import threading
import time
from functools import partial
from itertools import product
from pathlib import Path

import _harness as h
import joblib
import numpy as np
import torch
from sklearn.model_selection import GridSearchCV

from skassoc import SemiSupervisedAssociationClassifier, recipe_params

SEARCH_GRID = {
    "visit_weight": [0.5, 1.0],
    "walker_weight": [0.5, 1.0],
    "learning_rate": [1e-3, 2e-3],
}


def recipe(max_iter, device, **overrides):
    decay = max(1, max_iter // 4)
    params = dict(max_iter=max_iter, lr_decay_steps=decay, device=str(device))
    return recipe_params("paper") | params | {"random_state": 0, **overrides}


def peak_gpu_mib(device):
    return torch.cuda.max_memory_allocated(device) / 2**20


def run_search(data, args, device):
    X_train, y_semi, X_test, y_test = data
    X = np.concatenate([X_train, X_test])
    y = np.concatenate([y_semi, y_test])
    split = [(np.arange(len(X_train)), np.arange(len(X_train), len(X)))]
    estimator = SemiSupervisedAssociationClassifier(**recipe(args.search_steps, device))
    # Warm-up: CUDA context, cuDNN autotuning, allocator.
    h.timed_fit(X_train, y_semi, recipe(50, device), device)
    rows = []
    for mode in ("serial", "threads"):
        search = GridSearchCV(estimator, SEARCH_GRID, cv=split, refit=False)
        with joblib.parallel_backend("threading", n_jobs=8 if mode == "threads" else 1):
            _, seconds = h.timed(lambda search=search: search.fit(X, y), device)
        errors = [100 * (1 - s) for s in search.cv_results_["mean_test_score"]]
        row = dict(mode=mode, candidates=len(errors), steps_per_fit=args.search_steps)
        rows.append(row | {"seconds": seconds, "test_error_percent": errors})
        print(f"search {mode}: {seconds:.1f} s", flush=True)
    for row in rows:
        row["speedup_vs_serial"] = rows[0]["seconds"] / row["seconds"]
    return rows


def run_batch(data, args, device):
    X_train, y_semi, _, _ = data
    on_gpu = device.type == "cuda"

    def seconds(steps, **params):
        return h.timed_fit(X_train, y_semi, recipe(steps, device, **params), device)[1]

    rows = []
    for size, precision in product(args.unlabeled_sizes, args.precisions):
        params = dict(unlabeled_batch_size=size, precision=precision)
        try:
            seconds(3, **params)  # The first fit of a shape pays for cuDNN's tuning.
            short = seconds(3, **params)
            if on_gpu:
                torch.cuda.reset_peak_memory_stats(device)
            steps = seconds(args.batch_steps, **params) - short
            row = params | {"ms_per_step": 1000 * steps / (args.batch_steps - 3)}
            if on_gpu:
                row["peak_gpu_mib"] = peak_gpu_mib(device)
            row["status"] = "ok"
        except torch.cuda.OutOfMemoryError as exc:
            row = params | {"status": f"out of memory: {str(exc)[:200]}"}
        if on_gpu:
            torch.cuda.empty_cache()
        rows.append(row)
        print(row, flush=True)
    return rows


def _status_kib(field):
    """A field of ``/proc/self/status`` in KiB, or None."""
    status = Path("/proc/self/status").read_text()
    match = re.search(rf"^{field}:\s*(\d+)", status, re.MULTILINE)
    return int(match[1]) if match else None


def peak_private_growth(function):
    """``function()`` and the peak growth (MiB) of the process's private memory
    while it ran: ``RssAnon``, sampled every 5 ms in a thread."""
    start = peak = _status_kib("RssAnon") or 0
    done = threading.Event()

    def watch():
        nonlocal peak
        while not done.is_set():
            peak = max(peak, _status_kib("RssAnon") or 0)
            time.sleep(0.005)

    thread = threading.Thread(target=watch, daemon=True)
    thread.start()
    try:
        result = function()
    finally:
        done.set()
        thread.join()
    return result, (peak - start) / 1024


def write_pool(path, X_train, labeled_images, pool_size, seed):
    """The labeled images, then ``pool_size`` shifted copies of the training images."""
    rng = np.random.RandomState(seed)
    n_labeled = len(labeled_images)
    pool = np.lib.format.open_memmap(
        path, mode="w+", dtype=np.uint8, shape=(n_labeled + pool_size, 28, 28)
    )
    pool[:n_labeled] = labeled_images
    for start in range(0, pool_size, len(X_train)):
        stop = min(start + len(X_train), pool_size)
        shift = tuple(rng.randint(-2, 3, size=2))
        pool[n_labeled + start : n_labeled + stop] = np.roll(
            X_train[: stop - start], shift, axis=(1, 2)
        )
    pool.flush()
    del pool
    return np.load(path, mmap_mode="r")


def run_memmap(data, args, device):
    X_train, y_semi, X_test, y_test = data
    labeled = y_semi != -1
    with tempfile.TemporaryDirectory(prefix="skassoc_pool_") as folder:
        path = Path(args.pool_dir or folder) / "pool.npy"
        start = time.perf_counter()
        pool = write_pool(path, X_train, X_train[labeled], args.pool_size, args.seed)
        write_seconds = time.perf_counter() - start
        y_pool = np.full(len(pool), -1)
        y_pool[: labeled.sum()] = y_semi[labeled]
        params = recipe(args.memmap_steps, device)
        h.timed_fit(X_train, y_semi, recipe(10, device), device)  # warm-up
        _, in_memory_seconds = h.timed_fit(X_train, y_semi, params, device)
        if device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(device)
        fit = partial(h.timed_fit, pool, y_pool, params, device)
        (clf, seconds), grown = peak_private_growth(fit)
        row = dict(pool_images=int(len(pool)), file_mib=path.stat().st_size / 2**20)
        row.update(write_seconds=write_seconds, steps=args.memmap_steps)
        row["ms_per_step_memmap"] = 1000 * seconds / args.memmap_steps
        row["ms_per_step_in_memory_60k"] = 1000 * in_memory_seconds / args.memmap_steps
        row["peak_private_memory_growth_mib"] = grown
        row["process_peak_rss_mib"] = (_status_kib("VmHWM") or 0) / 1024
        row["test_error_percent"] = h.error_percent(clf.predict(X_test), y_test)
        if device.type == "cuda":
            row["peak_gpu_mib"] = peak_gpu_mib(device)
        del pool, clf, fit
    print(row, flush=True)
    return row


SECTIONS = {"search": run_search, "batch": run_batch, "memmap": run_memmap}


def measure(args):
    """The sections asked for, added to those the JSON holds."""
    device = h.resolve_device(args.device)
    results = {}
    if os.path.exists(args.json):
        results = h.read_results(args.json)
        for section in results.values():
            if isinstance(section, dict) and "environment" in section:
                held = section["environment"].get("device_type")
                h.check_device(args.json, held, device.type)
    data = h.mnist_semi(args, args.seed)
    for name, section in SECTIONS.items():
        if args.only and name not in args.only:
            continue
        env = {"environment": h.environment(device), "args": vars(args)}
        key = "row" if name == "memmap" else "rows"
        results[name] = {**env, key: section(data, args, device)}
        h.write_json(args.json, results)
    return results


def render(results):
    """The table of every section the results hold, each under a rubric of
    its own (the docs show each one ``:after:`` its rubric)."""
    parts = [
        f".. rubric:: {title}\n\n{table(results[name])}"
        for name, title, table in (
            ("search", "GridSearchCV on one GPU, serial and in threads", _search_table),
            ("batch", "Large unlabeled batches on one GPU", _batch_table),
            ("memmap", "A memory-mapped pool of images", _memmap_table),
        )
        if name in results
    ]
    return "\n\n".join(parts) if parts else None


def _search_table(section):
    """Section ``search``: the grid's wall time one fit after another and in
    joblib's threads, and the spread of the candidates' test errors."""
    header = ["Search", "Candidates", "Steps a fit", "Wall s", "Speed-up"]
    header.append("Error % (min-max)")
    modes = {"serial": "one after another", "threads": "in threads (joblib)"}
    cells = []
    for r in section["rows"]:
        errors = r["test_error_percent"]
        cells.append(
            [
                modes.get(r["mode"], r["mode"]),
                f"{r['candidates']}",
                f"{r['steps_per_fit']:,}",
                f"{r['seconds']:.1f}",
                f"{r['speedup_vs_serial']:.2f}",
                f"{min(errors):.2f}-{max(errors):.2f}",
            ]
        )
    return h.rst_table(header, cells)


def _batch_table(section):
    """Section ``batch``: ms per step and peak GPU memory by batch size."""
    header = ["Unlabeled batch", "Precision", "ms/step", "Peak GPU MiB"]
    cells = []
    for r in section["rows"]:
        ms = f"{r['ms_per_step']:.2f}" if "ms_per_step" in r else r["status"]
        mib = f"{r['peak_gpu_mib']:,.0f}" if "peak_gpu_mib" in r else "n/a"
        cells.append([f"{r['unlabeled_batch_size']:,}", r["precision"], ms, mib])
    return h.rst_table(header, cells)


def _memmap_table(section):
    """Section ``memmap``: the pool's fit against the in-memory one, and the
    growth of the process's private memory during the pool's fit."""
    r = section["row"]
    header = ["Pool images", "File MiB", "Steps", "ms/step, memory map"]
    header += ["ms/step, in memory", "Private memory growth MiB", "Peak GPU MiB"]
    header.append("Error %")
    gpu = f"{r['peak_gpu_mib']:,.0f}" if "peak_gpu_mib" in r else "n/a"
    cells = [
        [
            f"{r['pool_images']:,}",
            f"{r['file_mib']:,.0f}",
            f"{r['steps']:,}",
            f"{r['ms_per_step_memmap']:.2f}",
            f"{r['ms_per_step_in_memory_60k']:.2f}",
            f"{r['peak_private_memory_growth_mib']:.1f}",
            gpu,
            f"{r['test_error_percent']:.2f}",
        ]
    ]
    return h.rst_table(header, cells)


def parse_args(argv=None):
    parser = h.make_parser(__doc__.split("\n\n")[0], "scale", cases=False)
    add = parser.add_argument
    positive = h.bounded_int(1)
    add("--only", action="append", choices=list(SECTIONS), help="run this section")
    add("--seed", type=h.seed_int, default=0, help="label draw")
    add("--search-steps", type=positive, default=2000)
    sizes = [1000, 5000, 20000, 60000]
    add("--unlabeled-sizes", type=positive, nargs="+", default=sizes)
    add("--precisions", nargs="+", default=["tf32", "bf16"])
    # The step time is the difference to a 3-step fit of the same shape.
    add("--batch-steps", type=h.bounded_int(4), default=23, help="4 or more")
    add("--pool-size", type=positive, default=1_000_000)
    add("--pool-dir", default=None, help="default: a temporary folder")
    add("--memmap-steps", type=positive, default=2000)
    return h.parse(parser, argv)


def main(argv=None):
    h.measure_main(parse_args(argv), measure, render)


if __name__ == "__main__":
    main()

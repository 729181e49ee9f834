"""A search of 8 candidates x 2 folds on one GPU and on a Dask worker per GPU.

``docs/benchmarks/speed.rst`` says what the table measures::

    python benchmarks/bench_multi_gpu_search.py --steps 2000
    python benchmarks/bench_multi_gpu_search.py --device cpu --workers 2 \\
        --steps 3 --train-subset 2000 --json /tmp/search.json
    python benchmarks/bench_multi_gpu_search.py --render-only

MNIST with 20 labels a class, recipe ``"paper"`` cut to ``--steps``, the
``walker_weight`` x ``visit_weight`` grid of ``bench_search.py`` and
``SemiSupervisedStratifiedKFold(2)``, searched four ways in one run:
``GridSearchCV`` and ``StackedGridSearchCV`` in this process on one GPU,
then both under ``joblib.parallel_backend("dask")`` on a cluster of one
single-threaded worker process per GPU, as the user guide's "A search over
several GPUs" starts them. Every search has ``refit=False`` and the
estimator ``fit_report=False`` (as the user guide advises): the time is
that of its 16 fits (and, under Dask, of shipping the data and the fitted
scores), after an untimed warm-up fit in every process that trains. With
``--device cpu`` the workers are ``--workers`` CPU processes (smoke runs).
"""

import contextlib
import logging

import _harness as h
import joblib
import torch
from bench_search import CANDIDATES
from sklearn.base import clone
from sklearn.model_selection import GridSearchCV

from skassoc import SemiSupervisedAssociationClassifier, recipe_params
from skassoc._stacked import fit_candidates
from skassoc.datasets import make_semi_supervised_labels
from skassoc.model_selection import SemiSupervisedStratifiedKFold, StackedGridSearchCV

#: The candidates of bench_search.py as a grid (ParameterGrid lists them in
#: the same order: visit_weight, then walker_weight).
GRID = {name: sorted({c[name] for c in CANDIDATES}) for name in CANDIDATES[0]}
FOLDS = 2
LABELS_PER_CLASS = 20  # 10 a class in each training fold, as recipe "paper" takes
WARMUP_STEPS = 50
#: The estimator's fit_report (runs before it was recorded had the default).
FIT_REPORT = False
#: The searches, in the order they run: (key, search class, on the cluster).
SEARCHES = [
    ("grid, one", GridSearchCV, False),
    ("stacked, one", StackedGridSearchCV, False),
    ("stacked, dask", StackedGridSearchCV, True),
    ("grid, dask", GridSearchCV, True),
]


def parse_args(argv=None):
    parser = h.make_parser(__doc__.split("\n")[0], "multi_gpu_search", cases=False)
    parser.set_defaults(device="cuda")
    add = parser.add_argument
    images = h.bounded_int(1, h.MNIST_TRAIN_IMAGES)
    add("--steps", type=h.bounded_int(1), default=2000, help="steps of every fit")
    add("--seed", type=h.seed_int, default=0, help="labels and init seed")
    add("--workers", type=h.bounded_int(1), help="Dask workers (default: the GPUs)")
    add("--train-subset", type=images, default=None, help="first N training images")
    args = h.parse(parser, argv)
    if args.workers is None and not args.device.startswith("cuda"):
        parser.error("--device cpu needs --workers (CPU worker processes)")
    return args


def load_train(data_home):
    """MNIST's training images and labels."""
    (X, y), _ = h.load_mnist_sets(data_home)
    return X, y


def make_searches(args, device_type, workers):
    """The estimator every search starts from, and a function that builds
    search ``cls`` on it (``n_jobs=-1`` for the stacked one on the cluster,
    each fold's candidates cut into as many groups as there are workers a
    fold, so that every worker trains one; GridSearchCV's left unset, as the
    user guide says)."""
    params = h.scaled_schedule(recipe_params("paper"), args.steps)
    # No fit_report_, as the user guide advises for a search: every search
    # then does the same work for a candidate (StackedGridSearchCV skips
    # its folds' reports itself; GridSearchCV cannot know to).
    estimator = SemiSupervisedAssociationClassifier(
        **params, device=device_type, random_state=args.seed, fit_report=FIT_REPORT
    )
    cv = SemiSupervisedStratifiedKFold(FOLDS)

    def build(cls, on_cluster):
        if not (on_cluster and cls is StackedGridSearchCV):
            return cls(estimator, GRID, cv=cv, refit=False)
        groups = max(1, workers // FOLDS)
        return cls(
            estimator, GRID, cv=cv, refit=False, n_jobs=-1, groups_per_fold=groups
        )

    return estimator, build


def warm_up(estimator, X, y):
    """Untimed: CUDA start-up and cuDNN's kernel choice, for a plain fit and
    for the candidates trained together, in the process that runs this."""
    steps = min(WARMUP_STEPS, estimator.max_iter)
    short = clone(estimator).set_params(max_iter=steps, lr_decay_steps=steps)
    short.fit(X, y)
    fit_candidates(short, CANDIDATES, X, y)
    return True


def worker_devices():
    """What one worker sees: its CUDA_VISIBLE_DEVICES and torch's GPU count."""
    import os

    import torch

    return os.environ.get("CUDA_VISIBLE_DEVICES"), torch.cuda.device_count()


@contextlib.contextmanager
def worker_cluster(n_workers, device_type):
    """A client of ``n_workers`` single-threaded worker processes on this
    machine; with ``device_type="cuda"`` worker ``k`` sees GPU ``k`` alone.

    Each worker is a Nanny of its own spec (``SpecCluster``, the base of
    ``LocalCluster``), because ``LocalCluster`` gives all its workers one
    environment, and the GPU a worker may see must be in its environment
    when the process starts: CUDA reads ``CUDA_VISIBLE_DEVICES`` once, when
    it initializes, so a worker plugin or a task that sets it (or calls
    ``torch.cuda.set_device``) may come after something has initialized
    CUDA, and ``set_device`` alone leaves every GPU visible to code that
    asks for ``cuda:0``. dask-cuda's ``LocalCUDACluster`` does the same.
    Workers are spawned, not forked: this process has initialized CUDA, and
    a forked child of it cannot use CUDA.
    """
    import dask
    import distributed

    def env(k):
        gpu = str(k) if device_type == "cuda" else ""
        return {"CUDA_VISIBLE_DEVICES": gpu, "OMP_NUM_THREADS": "1"}

    workers = {
        f"worker{k}": {
            "cls": distributed.Nanny,
            "options": {"nthreads": 1, "env": env(k), "silence_logs": logging.ERROR},
        }
        for k in range(n_workers)
    }
    scheduler = {
        "cls": distributed.Scheduler,
        "options": {"dashboard_address": "127.0.0.1:0"},
    }
    with dask.config.set({"distributed.worker.multiprocessing-method": "spawn"}):
        with distributed.SpecCluster(
            workers=workers, scheduler=scheduler, silence_logs=logging.ERROR
        ) as cluster:
            with distributed.Client(cluster) as client:
                client.wait_for_workers(n_workers)
                yield client


def warm_up_workers(client, estimator, X, y):
    """Run :func:`warm_up` once on every worker; what each worker sees."""
    seen = client.run(worker_devices)  # {worker address: what it sees}
    [X_future, y_future] = client.scatter([X, y], broadcast=True)
    futures = [
        client.submit(warm_up, estimator, X_future, y_future, workers=[w], pure=False)
        for w in seen
    ]
    client.gather(futures)
    return sorted(seen.values())


def run_search(search, X, y, device, client=None):
    """Fit ``search`` (under the Dask backend with ``client``): its wall
    seconds, best candidate, mean scores and the workers its tasks ran on."""
    import distributed

    with contextlib.ExitStack() as stack:
        if client is not None:
            stack.enter_context(joblib.parallel_backend("dask"))
            stream = stack.enter_context(distributed.get_task_stream(client))
        _, seconds = h.timed(lambda: search.fit(X, y), device)
    record = {
        "seconds": seconds,
        "best_params": search.best_params_,
        "best_score": float(search.best_score_),
        "mean_test_scores": search.cv_results_["mean_test_score"].tolist(),
        "workers_used": 1,
    }
    if client is not None:
        record["tasks"] = len(stream.data)
        record["workers_used"] = len({task["worker"] for task in stream.data})
    return record


def measure(args):
    device = h.resolve_device(args.device)
    n_workers = args.workers or torch.cuda.device_count()
    if device.type == "cuda" and n_workers > torch.cuda.device_count():
        raise SystemExit(
            f"error: --workers {n_workers} asks for more GPUs than the "
            f"{torch.cuda.device_count()} torch sees here"
        )
    if device.type == "cpu":
        torch.set_num_threads(1)  # as each single-threaded CPU worker
    X, y = load_train(args.data_home)
    X, y = X[: args.train_subset], y[: args.train_subset]
    y_semi = make_semi_supervised_labels(y, LABELS_PER_CLASS, random_state=args.seed)
    estimator, build = make_searches(args, device.type, n_workers)
    results = {
        "environment": h.environment(device),
        "steps": args.steps,
        "seed": args.seed,
        "labels_per_class": LABELS_PER_CLASS,
        "folds": FOLDS,
        "candidates": CANDIDATES,
        "train_images": len(X),
        "fit_report": FIT_REPORT,
        "workers": n_workers,
        "runs": {},
    }
    warm_up(estimator, X, y_semi)
    for key, cls, on_cluster in SEARCHES[:2]:
        search = build(cls, on_cluster)
        _record(results, key, run_search(search, X, y_semi, device), args)
    if device.type == "cuda":
        torch.cuda.empty_cache()  # worker 0 shares this process's GPU
    with worker_cluster(n_workers, device.type) as client:
        results["worker_devices"] = warm_up_workers(client, estimator, X, y_semi)
        for key, cls, on_cluster in SEARCHES[2:]:
            search = build(cls, on_cluster)
            _record(results, key, run_search(search, X, y_semi, device, client), args)
    return results


def _record(results, key, record, args):
    """Add search ``key``'s record, with its speed-up over the first search,
    and write the results so far (a later search that fails keeps them)."""
    first = results["runs"].get(SEARCHES[0][0], record)
    record["speedup"] = first["seconds"] / record["seconds"]
    results["runs"][key] = record
    h.write_json(args.json, results)
    print(f"{key}: {record}", flush=True)


def render_table(results):
    """A row per search: where it ran, its time and speed-up, its best candidate."""
    unit = "GPU" if results["environment"]["device_type"] == "cuda" else "CPU"
    n = results["workers"]
    where = {False: f"this process, one {unit}", True: f"Dask, {n} {unit} workers"}
    names = {GridSearchCV: "GridSearchCV", StackedGridSearchCV: "StackedGridSearchCV"}
    header = ["search", "runs on", "workers used", "wall s", "speed-up"]
    header += ["best walker", "best visit", "best score"]
    rows = []
    for key, cls, on_cluster in SEARCHES:
        if key not in results["runs"]:
            continue  # a run that stopped before this search
        run = results["runs"][key]
        best = run["best_params"]
        rows.append(
            [names[cls], where[on_cluster], str(run["workers_used"])]
            + [f"{run['seconds']:.1f}", f"{run['speedup']:.2f}"]
            + [f"{best['walker_weight']:g}", f"{best['visit_weight']:g}"]
            + [f"{run['best_score']:.3f}"]
        )
    fits = len(results["candidates"]) * results["folds"]
    note = (
        f"{len(results['candidates'])} candidates x {results['folds']} folds "
        f"({fits} fits) of {results['steps']:,} steps, "
        f"{results['labels_per_class']} labels a class of "
        f"{results['train_images']:,} training images, seed {results['seed']}, "
        f"refit off, fit reports {'on' if results.get('fit_report', True) else 'off'}; "
        "best score: the mean accuracy on the held-out labels."
    )
    return note + "\n\n" + h.rst_table(header, rows, right=False)


def main(argv=None):
    h.measure_main(parse_args(argv), measure, render_table)


if __name__ == "__main__":
    main()

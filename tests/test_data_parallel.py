"""One fit over several processes (torch.distributed): 2 gloo processes on
CPU, and 2 NCCL processes on two GPUs where there are two.

Each process calls ``fit`` on the same data, as under ``torchrun``; they
embed a share of every step's batch each, gather the embeddings and average
the gradients. The test compares them with one process on the whole batch.
"""

import json
import re
import subprocess
import sys
import textwrap

import numpy as np
import pytest
import torch
from conftest import BACKENDS, data_parallel_params

from skassoc import SemiSupervisedAssociationClassifier

pytestmark = pytest.mark.skipif(
    not torch.distributed.is_available(), reason="torch.distributed is missing"
)

WORKER = textwrap.dedent(
    """
    import json, os, pickle, sys
    import numpy as np, torch, torch.distributed as dist
    from sklearn.datasets import make_blobs
    from skassoc import SemiSupervisedAssociationClassifier
    from skassoc.callbacks import Callback, Checkpoint

    rank, world, rendezvous, out, params, backend, norm_params = sys.argv[1:8]
    rank, world, params = int(rank), int(world), json.loads(params)
    BATCH_NORM_PARAMS = json.loads(norm_params)
    torch.set_num_threads(1)
    if backend == "nccl":
        torch.cuda.set_device(rank)
    dist.init_process_group(
        backend, init_method="file://" + rendezvous, rank=rank, world_size=world
    )
    # A device the group cannot serve, for process 1 alone.
    unserved = "cpu" if backend == "nccl" else "cuda:0"
    X, y = make_blobs(150, centers=3, n_features=5, random_state=0)
    y[30:] = -1

    class RaiseOnRankOne(Callback):
        def on_log(self, run):
            if rank == 1 and run.step >= 10:
                raise OSError("disk full on rank 1")

    class InterruptsOnRankOne(Callback):
        def __init__(self, at_begin=False):
            self.at_begin = at_begin

        def on_fit_begin(self, run):
            if rank == 1 and self.at_begin:
                raise KeyboardInterrupt

        def on_log(self, run):
            if rank == 1 and run.step >= 10:
                raise KeyboardInterrupt

    class RowsEmbedded(Callback):
        # The rows this process embeds in each pass of its network.

        def __init__(self):
            self.rows = []

        def on_fit_begin(self, run):
            results["run_rank"] = [run.rank, run.world_size]
            run.model.embedder.register_forward_pre_hook(
                lambda module, args: self.rows.append(args[0].shape[0])
            )

    results = {}
    rows = RowsEmbedded()
    first = SemiSupervisedAssociationClassifier(
        **params, max_iter=1, callbacks=[rows]
    ).fit(X, y)
    results["rows"] = rows.rows
    torch.save(first.training_state_.exp_avg, f"{out}/first{rank}.pt")
    # Every process is given a checkpoint of its own path: process 0's
    # alone writes.
    checkpoint = Checkpoint(f"{out}/checkpoint{rank}-{{step}}.skassoc", every=10)
    fitted = SemiSupervisedAssociationClassifier(
        **params, max_iter=30, callbacks=[checkpoint]
    ).fit(X, y)
    torch.save(fitted.model_.state_dict(), f"{out}/weights{rank}.pt")
    results["history"] = fitted.history_
    try:
        SemiSupervisedAssociationClassifier(
            **params, max_iter=30, callbacks=[RaiseOnRankOne()]
        ).fit(X, y)
    except Exception as exc:
        results["raised"] = [type(exc).__name__, str(exc)]
    interrupted = SemiSupervisedAssociationClassifier(
        **params, max_iter=30, callbacks=[InterruptsOnRankOne()]
    )
    try:
        interrupted.fit(X, y)
    except KeyboardInterrupt:
        results["interrupted_at"] = interrupted.n_iter_
    try:
        SemiSupervisedAssociationClassifier(
            **params, max_iter=30, callbacks=[InterruptsOnRankOne(at_begin=True)]
        ).fit(X, y)
    except KeyboardInterrupt:
        results["interrupted_at_begin"] = True
    try:
        rows = slice(None) if rank == 0 else slice(1, None)
        SemiSupervisedAssociationClassifier(**params, max_iter=5).fit(X[rows], y[rows])
    except ValueError as exc:
        results["other_data"] = str(exc)
    try:
        bad = X.copy()
        bad[0, 0] = np.nan if rank == 1 else bad[0, 0]
        SemiSupervisedAssociationClassifier(**params, max_iter=5).fit(bad, y)
    except ValueError as exc:
        results["bad_input"] = str(exc)
    # Parameters that may differ between processes, failing in one only:
    # a checkpoint missing on its host, a callback that is no callback, a
    # device that is missing (or that the gloo group cannot serve).
    for name, value in [
        ("resume_from", f"{out}/missing.skassoc"),
        ("callbacks", [1]),
        ("device", unserved),
        ("devices", ["cpu", "cpu"]),
        ("verbose", "loud"),
    ]:
        try:
            mine = {**params, "max_iter": 5, **({name: value} if rank == 1 else {})}
            SemiSupervisedAssociationClassifier(**mine).fit(X, y)
        except Exception as exc:
            results[name] = [type(exc).__name__, str(exc)]
    # A network with batch norm: every process normalises its share with
    # the whole batch's statistics (one step, in float32).
    class NormSeen(Callback):
        # What callbacks see of the network: its own batch norm, whose
        # hooks ran in the steps; a snapshot pickles (a checkpoint's copy).

        def on_fit_begin(self, run):
            self.norm, self.calls = run.model.embedder.features[1], []
            self.hook = self.norm.register_forward_hook(
                lambda *args: self.calls.append(1)
            )

        def on_fit_end(self, run):
            now = run.model.embedder.features[1]
            results["norm_seen"] = [now is self.norm, len(self.calls)]
            self.hook.remove()  # (a lambda does not pickle)
            results["snapshot_bytes"] = len(pickle.dumps(run.snapshot()))

    normed = SemiSupervisedAssociationClassifier(
        **{**params, **BATCH_NORM_PARAMS}, max_iter=1, callbacks=[NormSeen()]
    ).fit(np.load(f"{out}/images.npy"), y[:40])
    torch.save(normed.training_state_.exp_avg, f"{out}/normed_first{rank}.pt")
    torch.save(normed.model_.state_dict(), f"{out}/normed{rank}.pt")
    kinds = {type(module).__name__ for module in normed.model_.modules()}
    results["norm_types"] = sorted(kind for kind in kinds if "Norm" in kind)
    # Work after training: process 0's alone, its result (or failure)
    # given to every process.
    from skassoc._engine._runner import computed_by_process_0

    with computed_by_process_0(dist.group.WORLD, lambda: rank) as computed:
        results["computed"] = computed

    def fails_in_process_0():
        if rank == 0:
            raise OSError("no space left for the report")
        return rank

    try:
        with computed_by_process_0(dist.group.WORLD, fails_in_process_0):
            pass
    except Exception as exc:
        results["after_training"] = [type(exc).__name__, str(exc)]
    results["report"] = [fitted.fit_report_.verdict, repr(fitted.class_prior_)]

    # A Ctrl-C to process 1 while it waits for process 0's result: held back
    # until process 1 has used the result (its fitted state), then raised.
    def slow_in_process_0():
        if rank == 0:
            import time

            time.sleep(0.5)
        return "result"

    if rank == 1:
        import signal, threading

        threading.Timer(0.1, os.kill, (os.getpid(), signal.SIGINT)).start()
    used = []
    try:
        with computed_by_process_0(dist.group.WORLD, slow_in_process_0) as value:
            used.append(value)
    except KeyboardInterrupt:
        used.append("KeyboardInterrupt")
    results["held_back"] = used
    # A stacked search trains in each process on its own, even with one
    # candidate (its processes' seeds differ here).
    from skassoc.model_selection import (
        SemiSupervisedStratifiedKFold,
        StackedGridSearchCV,
    )

    alone = SemiSupervisedAssociationClassifier(
        **{**params, "max_iter": 5, "random_state": rank}
    )
    search = StackedGridSearchCV(
        alone, {"visit_weight": [1.0]}, cv=SemiSupervisedStratifiedKFold(2), refit=False
    )
    results["stacked"] = search.fit(X, y).cv_results_["mean_test_score"].tolist()
    # The fit of ``fitted`` again, after a failed one: as a torchrun script
    # fits one estimator after another in one group.
    again = SemiSupervisedAssociationClassifier(**params, max_iter=30).fit(X, y)
    torch.save(again.model_.state_dict(), f"{out}/again{rank}.pt")
    results["history_again"] = again.history_
    dist.destroy_process_group()
    with open(f"{out}/results{rank}.json", "w") as handle:
        json.dump(results, handle)
    # gloo's threads can abort the interpreter's teardown ("terminate called
    # without an active exception"); everything is written by now.
    os._exit(0)
    """
)


#: The batch-norm fit of the workers: the STL-10 network on 40 random 32x32
#: colour images (``images.npy``, the first 40 labels of the blobs), float32.
BATCH_NORM_PARAMS = {
    "network": "stl10",
    "embedding_dim": 8,
    "labeled_per_class": 2,
    "unlabeled_batch_size": 9,
    "precision": "fp32",
}


def batch_norm_images():
    """The images of the batch-norm fit."""
    return np.random.default_rng(0).integers(0, 256, (40, 3, 32, 32), dtype=np.uint8)


@pytest.fixture(scope="module", params=BACKENDS)
def two_processes(request, tmp_path_factory):
    """Run the worker in 2 processes of a backend; the folder of their
    files, their results by rank, and the backend."""
    backend = request.param
    out = tmp_path_factory.mktemp(f"data_parallel_{backend}")
    np.save(out / "images.npy", batch_norm_images())
    rendezvous = out / "rendezvous"
    processes = [
        subprocess.Popen(
            [
                sys.executable,
                "-c",
                WORKER,
                str(rank),
                "2",
                str(rendezvous),
                str(out),
                json.dumps(data_parallel_params(backend, rank)),
                backend,
                json.dumps(BATCH_NORM_PARAMS),
            ],
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        for rank in range(2)
    ]
    logs = [process.communicate(timeout=180)[0] for process in processes]
    for process, log in zip(processes, logs, strict=True):
        assert process.returncode == 0, log
    results = [json.loads((out / f"results{r}.json").read_text()) for r in range(2)]
    return out, results, backend


def one_process(backend, **params):
    """The estimator of the processes' fit, fitted in this process alone
    (on the first GPU for NCCL's pair)."""
    return SemiSupervisedAssociationClassifier(
        **{**data_parallel_params(backend), **params}
    )


def load(path):
    return torch.load(path, map_location="cpu")


def close(backend):
    """Tolerances of one process against several: float rounding on two
    CPU cores (one thread each); GPU reductions in other orders."""
    if backend == "gloo":
        return dict(rtol=1e-5, atol=1e-7)
    return dict(rtol=1e-4, atol=1e-6)


def test_gradients_of_the_first_step_are_those_of_one_process(
    two_processes, blobs_for_workers
):
    """Adam's first moment after one step is a tenth of the gradient."""
    out, _, backend = two_processes
    X, y = blobs_for_workers
    one = one_process(backend, max_iter=1).fit(X, y)
    for rank in range(2):
        moments = load(out / f"first{rank}.pt")
        for name, moment in one.training_state_.exp_avg.items():
            torch.testing.assert_close(moments[name], moment.cpu(), **close(backend))


def test_each_process_embeds_its_share_of_the_batch(two_processes):
    """Not the whole batch each: the shares differ by a row at most and add
    up to the batch (labeled 3 x 3, unlabeled 31, its second view 31)."""
    _, results, _ = two_processes
    shares = [results[rank]["rows"][0] for rank in range(2)]
    assert sum(shares) == 3 * 3 + 2 * 31
    assert abs(shares[0] - shares[1]) <= 1


def test_the_processes_train_the_model_of_one_process(two_processes, blobs_for_workers):
    out, results, backend = two_processes
    X, y = blobs_for_workers
    one = one_process(backend, max_iter=30).fit(X, y)
    weights = [load(out / f"weights{rank}.pt") for rank in range(2)]
    for name, tensor in one.model_.state_dict().items():
        # Every process ends with the same model...
        assert torch.equal(weights[0][name], weights[1][name])
        # ... that of one process on the whole batch, up to float rounding.
        torch.testing.assert_close(weights[0][name], tensor.cpu(), rtol=1e-4, atol=1e-5)
    for name in ("total", "walker", "visit", "logit"):
        np.testing.assert_allclose(
            results[0]["history"][name], one.history_[name], rtol=1e-4
        )
    assert results[0]["history"] == results[1]["history"]


def test_batch_norm_sees_the_whole_batch_in_every_process(
    two_processes, blobs_for_workers
):
    """The STL-10 network's batch norms: the first step's gradients and
    running statistics are those of one process on the whole batch;
    callbacks and the fitted model see the network's own batch norms."""
    out, results, backend = two_processes
    one = one_process(backend, **BATCH_NORM_PARAMS, max_iter=1).fit(
        batch_norm_images(), blobs_for_workers[1][:40]
    )
    moments = one.training_state_.exp_avg
    # The convolutions' biases before a batch norm have no true gradient
    # (the norm takes the mean out): theirs is rounding noise, so the
    # tolerance is relative to the largest gradient of the model.
    largest = max(moment.abs().max().item() for moment in moments.values())
    buffers = {k: v for k, v in one.model_.state_dict().items() if "running" in k}
    assert buffers
    for rank in range(2):
        assert results[rank]["norm_types"] == ["BatchNorm2d"]
        # One step, one pass of the network: its norm's hook ran once.
        assert results[rank]["norm_seen"] == [True, 1]
        assert results[rank]["snapshot_bytes"] > 0
        first = load(out / f"normed_first{rank}.pt")
        for name, moment in moments.items():
            torch.testing.assert_close(
                first[name], moment.cpu(), rtol=0, atol=1e-4 * largest
            )
        weights = load(out / f"normed{rank}.pt")
        for name, tensor in buffers.items():
            # Means of values near zero, summed in another order: absolute.
            torch.testing.assert_close(
                weights[name], tensor.cpu(), rtol=1e-4, atol=1e-6
            )


def test_work_after_training_is_process_0s_and_every_process_gets_it(
    two_processes,
):
    _, results, _ = two_processes
    assert [results[rank]["computed"] for rank in range(2)] == [0, 0]
    assert results[0]["report"] == results[1]["report"]
    assert results[0]["held_back"] == ["result"]
    assert results[1]["held_back"] == ["result", "KeyboardInterrupt"]
    assert results[0]["after_training"] == ["OSError", "no space left for the report"]
    kind, message = results[1]["after_training"]
    assert kind == "RuntimeError" and "Process 0 of the group failed" in message


def test_callbacks_know_their_process_and_process_0_alone_checkpoints(
    two_processes,
):
    out, results, _ = two_processes
    assert [results[rank]["run_rank"] for rank in range(2)] == [[0, 2], [1, 2]]
    written = sorted(path.name for path in out.glob("checkpoint*"))
    assert written == [f"checkpoint0-{step}.skassoc" for step in (10, 20, 30)]


def test_a_later_fit_in_the_group_trains_what_an_earlier_one_did(two_processes):
    """Nothing of the fits before it (one of them failed) reaches a fit."""
    out, results, backend = two_processes
    for rank in range(2):
        weights = load(out / f"weights{rank}.pt")
        again = load(out / f"again{rank}.pt")
        if backend == "gloo":
            # One thread a process: the same operations, the same bits.
            assert all(torch.equal(again[name], weights[name]) for name in weights)
            assert results[rank]["history_again"] == results[rank]["history"]
        else:  # GPU kernels may add in another order from one fit to the next
            for name in weights:
                torch.testing.assert_close(again[name], weights[name], **close(backend))
            np.testing.assert_allclose(
                results[rank]["history_again"]["total"],
                results[rank]["history"]["total"],
                rtol=1e-4,
            )


def test_a_callback_that_raises_in_one_process_stops_every_process(two_processes):
    _, results, _ = two_processes
    assert results[1]["raised"] == ["OSError", "disk full on rank 1"]
    kind, message = results[0]["raised"]
    assert kind == "RuntimeError"
    assert "another process" in message


def test_a_callbacks_ctrl_c_in_one_process_stops_all_at_one_step_with_the_model(
    two_processes,
):
    """As a Ctrl-C does: every process raises KeyboardInterrupt after the
    log point at which process 1's callback raised, keeping the model."""
    _, results, _ = two_processes
    assert [results[rank].get("interrupted_at") for rank in range(2)] == [10, 10]
    # In on_fit_begin: every process raises it before the first step.
    assert [results[rank].get("interrupted_at_begin") for rank in range(2)] == [
        True,
        True,
    ]


def test_a_stacked_search_does_not_join_the_group(two_processes):
    """Under torchrun, a one-candidate search of other seeds per process
    trains in each process alone, as stacked candidates always do (its
    refit is a fit like any other, which trains with the group)."""
    _, results, _ = two_processes
    for rank in range(2):
        assert np.isfinite(results[rank]["stacked"]).all()


def test_processes_given_different_data_are_refused(two_processes):
    _, results, _ = two_processes
    for rank in range(2):
        assert "different training data" in results[rank]["other_data"]


def test_input_that_fails_its_checks_in_one_process_stops_every_process(
    two_processes,
):
    """Rather than leave the others waiting for it in their first collective."""
    _, results, _ = two_processes
    assert "NaN" in results[1]["bad_input"]
    assert (
        "processes [1] of the group failed the checks of their device and input"
        in (results[0]["bad_input"])
    )


@pytest.mark.parametrize(
    ("name", "error", "stage"),
    [
        ("resume_from", "ValueError", "their start"),
        ("callbacks", "TypeError", "the checks of their callbacks"),
        ("device", "CUDA|nccl", "the checks of their device and input"),
        ("devices", "Leave devices=None", "the checks of their device and input"),
        ("verbose", "verbose", "the checks of their parameters"),
    ],
)
def test_a_setup_that_fails_in_one_process_stops_every_process(
    two_processes, name, error, stage
):
    """Per-process parameters fail before the first collective in one
    process: that one raises its error, the other one names it."""
    _, results, _ = two_processes
    if error in ("ValueError", "TypeError"):
        assert results[1][name][0] == error
    else:  # its message
        assert re.search(error, results[1][name][1])
    kind, message = results[0][name]
    assert kind == "ValueError"
    assert f"processes [1] of the group failed {stage}" in message

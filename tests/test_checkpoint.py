"""Checkpoints: the model and its run's state on disk, loaded and continued.

A checkpoint is a model file with the optional member
``training_state.safetensors``: it loads as a model, a warm start of the
loaded estimator continues the run as if it had never stopped (bitwise on a
CPU), and a tampered training state is refused before it is read.
"""

import hashlib
import json
import struct
import types
import zipfile

import numpy as np
import pytest
import safetensors.torch
import torch
from torch import nn

import skassoc._io._training_state
from skassoc import SemiSupervisedAssociationClassifier
from skassoc._engine._callback import Callback
from skassoc._io._checkpoint import Checkpoint
from skassoc._io._format import METADATA_MEMBER, TRAINING_STATE_MEMBER, WEIGHTS_MEMBER
from skassoc._io._model_file import save_model
from skassoc._io._training_state import CPU_RNG_BYTES

load = SemiSupervisedAssociationClassifier.load
N = 10  # steps before the stop; the default log interval puts a log point there
# Every part of a training state: the moving average (with the trained
# weights), the balance loss's class mass and the sampler's shuffled epochs.
FULL_STATE = {"ema_decay": 0.9, "unlabeled_sampling": "epochs", "balance_weight": 0.5}


class StopAt(Callback):
    """Stop the run at the log point of ``step``, as a callback (``run.stop``)
    or as a Ctrl-C would (``interrupt``)."""

    def __init__(self, step, interrupt=False):
        self.step = step
        self.interrupt = interrupt

    def on_log(self, run):
        if run.step >= self.step:
            if self.interrupt:
                raise KeyboardInterrupt
            run.stop()


class Snapshots(Callback):
    """Keep ``run.snapshot()`` at every log point, by step."""

    def __init__(self):
        self.taken = {}

    def on_log(self, run):
        self.taken[run.step] = run.snapshot()


def classifier(fast_params, **params):
    return SemiSupervisedAssociationClassifier(
        **{**fast_params, "max_iter": 2 * N, **params}
    )


def fit_quietly(estimator, X, y):
    """Fit; a KeyboardInterrupt from a callback ends it as a Ctrl-C does."""
    try:
        estimator.fit(X, y)
    except KeyboardInterrupt:
        pass
    return estimator


def assert_same_weights(a, b):
    state_a, state_b = a.model_.state_dict(), b.model_.state_dict()
    assert state_a.keys() == state_b.keys()
    for key in state_a:
        assert torch.equal(state_a[key], state_b[key]), key


def assert_same_state(a, b):
    """Two TrainingStates hold the same values."""
    assert (a.n_iter, a.adam_step) == (b.n_iter, b.adam_step)
    for group in ("exp_avg", "exp_avg_sq", "average", "weights", "rng"):
        tensors_a, tensors_b = getattr(a, group), getattr(b, group)
        assert (tensors_a is None) == (tensors_b is None), group
        for key in tensors_a or {}:
            assert torch.equal(tensors_a[key], tensors_b[key]), (group, key)
    assert (a.class_mass is None) == (b.class_mass is None)
    if a.class_mass is not None:
        assert torch.equal(a.class_mass, b.class_mass)
    assert a.sampler.keys() == b.sampler.keys()
    for key, value in a.sampler.items():
        same = torch.equal if isinstance(value, torch.Tensor) else (lambda x, y: x == y)
        assert same(value, b.sampler[key]), key


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory, fast_params, blobs_semi):
    """A checkpoint with every part of a training state, its members, and
    the snapshot of the run at its step."""
    X, y = blobs_semi
    path = tmp_path_factory.mktemp("checkpoint") / "run.skassoc"
    snapshots = Snapshots()
    callbacks = [Checkpoint(path, every=N), snapshots, StopAt(N)]
    classifier(fast_params, **FULL_STATE, callbacks=callbacks).fit(X, y)
    with zipfile.ZipFile(path) as archive:
        metadata = json.loads(archive.read(METADATA_MEMBER))
        weights = archive.read(WEIGHTS_MEMBER)
        state = archive.read(TRAINING_STATE_MEMBER)
    return path, metadata, weights, state, snapshots.taken[N]


# ------------------------------------------------- a checkpoint is a model


def test_a_checkpoint_loads_as_the_model_of_its_step(checkpoint, blobs_semi):
    path, _, _, _, snapshot = checkpoint
    X, _ = blobs_semi
    loaded = load(path, device="cpu")
    assert loaded.n_iter_ == snapshot.n_iter_ == N
    assert_same_weights(loaded, snapshot)
    np.testing.assert_array_equal(loaded.class_prior_, snapshot.class_prior_)
    np.testing.assert_array_equal(loaded.predict_proba(X), snapshot.predict_proba(X))
    assert loaded.history_ == snapshot.history_
    assert_same_state(loaded.training_state_, snapshot.training_state_)
    # Loaded on the CPU, as a fit keeps it.
    assert loaded.training_state_.exp_avg_sq["logits.weight"].device.type == "cpu"


def test_a_checkpoint_holds_no_callbacks(checkpoint):
    path, metadata, _, _, _ = checkpoint
    assert "callbacks" not in metadata["params"]
    assert load(path, device="cpu").callbacks is None


# ---------------------------------------------------- continuing the run


@pytest.mark.parametrize(
    "params",
    [{}, {"ema_decay": 0.9}, {"unlabeled_sampling": "epochs"}, FULL_STATE],
    ids=["plain", "ema", "epochs", "full"],
)
@pytest.mark.parametrize("interrupt", [False, True], ids=["stop", "ctrl-c"])
def test_a_run_continued_from_a_checkpoint_is_the_uninterrupted_run(
    tmp_path, fast_params, blobs_semi, params, interrupt
):
    X, y = blobs_semi
    straight = classifier(fast_params, **params).fit(X, y)
    path = tmp_path / "run-{step}.skassoc"
    checkpoint = Checkpoint(path, every=N)
    # A stop at a log point: the checkpoint of that point is the last one.
    # Ctrl-C: the stopper raises before Checkpoint sees the log point, so the
    # file is on_fit_end's.
    if interrupt:
        callbacks = [StopAt(N, interrupt=True), checkpoint]
    else:
        callbacks = [checkpoint, StopAt(N)]
    fit_quietly(classifier(fast_params, **params, callbacks=callbacks), X, y)
    assert sorted(p.name for p in tmp_path.iterdir()) == [f"run-{N}.skassoc"]

    resumed = load(str(path).format(step=N), device="cpu")
    resumed.set_params(warm_start=True, callbacks=[checkpoint])
    resumed.fit(X, y)
    assert resumed.n_iter_ == straight.n_iter_ == 2 * N
    assert_same_weights(resumed, straight)
    assert resumed.history_ == straight.history_
    # The continued run counts from its checkpoint: no second file for step N.
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        f"run-{N}.skassoc",
        f"run-{2 * N}.skassoc",
    ]


def test_an_interrupted_fit_leaves_its_last_step_on_disk(
    tmp_path, fast_params, blobs_semi
):
    X, y = blobs_semi
    path = tmp_path / "run.skassoc"
    callbacks = [StopAt(N, interrupt=True), Checkpoint(path, every=1000)]
    estimator = classifier(fast_params, callbacks=callbacks)
    with pytest.raises(KeyboardInterrupt):
        estimator.fit(X, y)
    loaded = load(path, device="cpu")
    assert loaded.n_iter_ == estimator.n_iter_ == N
    assert_same_weights(loaded, estimator)
    assert_same_state(loaded.training_state_, estimator.training_state_)


# ------------------------------------------------------------ file names


def test_step_paths_keep_one_file_per_checkpoint(tmp_path, fast_params, blobs_semi):
    X, y = blobs_semi
    callbacks = [Checkpoint(tmp_path / "c-{step:03d}.skassoc", every=N)]
    classifier(fast_params, max_iter=3 * N, callbacks=callbacks).fit(X, y)
    names = sorted(p.name for p in tmp_path.iterdir())
    assert names == [f"c-{step:03d}.skassoc" for step in (N, 2 * N, 3 * N)]
    assert [load(tmp_path / name, device="cpu").n_iter_ for name in names] == [
        N,
        2 * N,
        3 * N,
    ]


def test_a_plain_path_is_replaced_and_reused_by_later_fits(
    tmp_path, fast_params, blobs_semi
):
    X, y = blobs_semi
    path = tmp_path / "run.skassoc"
    checkpoint = Checkpoint(str(path), every=N)
    estimator = classifier(fast_params, max_iter=3 * N, callbacks=[checkpoint])
    estimator.fit(X, y)
    assert [p.name for p in tmp_path.iterdir()] == ["run.skassoc"]
    assert load(path, device="cpu").n_iter_ == 3 * N
    # A second fit of the same callback counts its steps anew.
    estimator.set_params(max_iter=N).fit(X, y)
    loaded = load(path, device="cpu")
    assert loaded.n_iter_ == N
    assert_same_weights(loaded, estimator)


def test_the_last_checkpoint_comes_after_the_last_step(
    tmp_path, fast_params, blobs_semi
):
    # every=15 is no multiple of the log interval (10): the first checkpoint
    # waits for the log point of step 20, the last one is written at the end.
    X, y = blobs_semi
    callbacks = [Checkpoint(tmp_path / "{step}.skassoc", every=15)]
    classifier(fast_params, max_iter=25, callbacks=callbacks).fit(X, y)
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "20.skassoc",
        "25.skassoc",
    ]


# ------------------------------------------------------------- arguments


@pytest.mark.parametrize(
    "path, every, error, match",
    [
        ("{step}.skassoc", 0, ValueError, "every"),
        ("{step}.skassoc", 2.5, ValueError, "every"),
        (5, 10, TypeError, "path"),
        ("{epoch}.skassoc", 10, ValueError, "Use {step}"),
        ("{}.skassoc", 10, ValueError, "literal brace"),
        ("missing/{step}.skassoc", 10, FileNotFoundError, "does not exist"),
    ],
)
def test_bad_arguments_are_refused_before_training(
    tmp_path, monkeypatch, fast_params, blobs_semi, path, every, error, match
):
    monkeypatch.chdir(tmp_path)
    X, y = blobs_semi
    estimator = classifier(fast_params, callbacks=[Checkpoint(path, every=every)])
    with pytest.raises(error, match=match):
        estimator.fit(X, y)
    assert not hasattr(estimator, "model_")
    assert list(tmp_path.iterdir()) == []


def test_an_estimator_that_cannot_be_saved_is_refused_at_fit_begin(tmp_path):
    run = types.SimpleNamespace(
        estimator=SemiSupervisedAssociationClassifier(network=nn.Linear(4, 8)),
        step=0,
        rank=0,
    )
    with pytest.raises(ValueError, match="built-in network"):
        Checkpoint(tmp_path / "c.skassoc").on_fit_begin(run)


def test_a_failed_run_writes_no_last_checkpoint(tmp_path):
    def snapshot():
        raise AssertionError("a failed run is not saved")

    run = types.SimpleNamespace(
        estimator=SemiSupervisedAssociationClassifier(),
        step=0,
        snapshot=snapshot,
        rank=0,
    )
    checkpoint = Checkpoint(tmp_path / "c.skassoc", every=10)
    checkpoint.on_fit_begin(run)
    run.step, run.failed = 5, True
    checkpoint.on_fit_end(run)
    assert list(tmp_path.iterdir()) == []


# ------------------------------------------------------ without the state


def test_a_file_without_training_state_loads_as_before(tmp_path, checkpoint):
    path, _, _, _, _ = checkpoint
    loaded = load(path, device="cpu")
    plain = tmp_path / "plain.skassoc"
    save_model(loaded, plain)
    with zipfile.ZipFile(plain) as archive:
        assert sorted(archive.namelist()) == [METADATA_MEMBER, WEIGHTS_MEMBER]
        assert "training_state" not in json.loads(archive.read(METADATA_MEMBER))
    again = load(plain, device="cpu")
    assert again.training_state_ is None
    assert_same_weights(again, loaded)
    with pytest.raises(ValueError, match="cannot be continued"):
        save_model(again, tmp_path / "state.skassoc", training_state=True)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["plain.skassoc"]


def test_save_writes_the_training_state_only_when_asked(tmp_path, checkpoint):
    path, _, _, state, _ = checkpoint
    loaded = load(path, device="cpu")
    again = tmp_path / "again.skassoc"
    save_model(loaded, again, training_state=True)
    with zipfile.ZipFile(again) as archive:
        assert archive.read(TRAINING_STATE_MEMBER) == state
    assert_same_state(load(again, device="cpu").training_state_, loaded.training_state_)


# ----------------------------------------------------- tampered states


def rewrite(path, metadata, weights, state, *, fix_checksum=True):
    """A model file of these members (the state's checksum redone)."""
    if state is not None and fix_checksum and metadata.get("training_state"):
        entry = {**metadata["training_state"]}
        entry["sha256"] = hashlib.sha256(state).hexdigest()
        metadata = {**metadata, "training_state": entry}
    with zipfile.ZipFile(path, "w") as archive:
        archive.writestr(METADATA_MEMBER, json.dumps(metadata))
        archive.writestr(WEIGHTS_MEMBER, weights)
        if state is not None:
            archive.writestr(TRAINING_STATE_MEMBER, state)
    return path


def changed_tensors(state, change):
    tensors = safetensors.torch.load(state)
    change(tensors)
    return safetensors.torch.save(tensors)


def with_entry(metadata, **entries):
    return {**metadata, "training_state": {**metadata["training_state"], **entries}}


def by_hand(state, name, dtype, shape):
    """``state``'s header with ``name`` declared as ``dtype`` and ``shape``,
    its data left as it is (an attacker's header, not safetensors')."""
    (size,) = struct.unpack("<Q", state[:8])
    header = json.loads(state[8 : 8 + size])
    header[name] = {**header[name], "dtype": dtype, "shape": shape}
    text = json.dumps(header).encode()
    return struct.pack("<Q", len(text)) + text + state[8 + size :]


def _reshape(tensors):
    tensors["exp_avg/logits.weight"] = tensors["exp_avg/logits.weight"][:, :-1].clone()


def _retype(tensors):
    tensors["exp_avg_sq/logits.bias"] = tensors["exp_avg_sq/logits.bias"].double()


def _drop(tensors):
    del tensors["class_mass"]


def _drop_moment(tensors):
    del tensors["exp_avg_sq/logits.bias"]


def _add(tensors):
    tensors["evil"] = torch.zeros(3)


def _short_rng(tensors):
    tensors["rng/cpu"] = tensors["rng/cpu"][:100].clone()


def _order_dtype(tensors):
    tensors["sampler/order"] = tensors["sampler/order"].int()


def _class_mass_width(tensors):
    tensors["class_mass"] = torch.cat([tensors["class_mass"], torch.zeros(1)])


# Refused from the metadata entry and the header alone: no tensor is read.
HEADER_CASES = {
    "wrong shape": (_reshape, {}, "exp_avg/logits.weight is"),
    "wrong dtype": (_retype, {}, "exp_avg_sq/logits.bias is"),
    "missing class mass": (_drop, {}, r"missing \['class_mass'\]"),
    "missing moment": (_drop_moment, {}, "missing"),
    "extra tensor": (_add, {}, r"unexpected \['evil'\]"),
    "short rng": (_short_rng, {}, "rng/cpu is"),
    "order dtype": (_order_dtype, {}, "sampler/order"),
    "class mass width": (_class_mass_width, {}, "class_mass is"),
    "cuda rng absent": (None, {"rng": ["cpu", "cuda"]}, r"missing \['rng/cuda'\]"),
    "no cpu rng": (None, {"rng": ["cuda"]}, "bad training_state rng"),
    "unknown rng": (None, {"rng": ["cpu", "tpu"]}, "bad training_state rng"),
    "no average": (None, {"has_average": False}, "unexpected"),
    "position beyond order": (None, {"sampler_position": 10**6}, "at least its"),
    "negative position": (None, {"sampler_position": -1}, "sampler_position"),
    "bool position": (None, {"sampler_position": True}, "sampler_position"),
    "no sampler": (None, {"sampler_position": None}, "unexpected"),
    "n_iter of another fit": (None, {"n_iter": N + 1}, "n_iter"),
    "zero n_iter": (None, {"n_iter": 0}, "n_iter"),
    "adam step nan": (None, {"adam_step": float("nan")}, "adam_step"),
    "adam step huge": (None, {"adam_step": 1e9}, "adam_step"),
    "unknown entry": (None, {"note": 1}, "bad training_state entry"),
}


@pytest.fixture
def nothing_read(monkeypatch):
    """Fail the test if a training state's tensors are read."""

    def read(*args, **kwargs):
        raise AssertionError("the training state was read before its checks")

    monkeypatch.setattr(skassoc._io._training_state, "read_weights", read)


@pytest.mark.parametrize("case", list(HEADER_CASES))
def test_a_state_that_does_not_fit_is_refused_before_it_is_read(
    tmp_path, checkpoint, nothing_read, case
):
    _, metadata, weights, state, _ = checkpoint
    change, entries, match = HEADER_CASES[case]
    if change is not None:
        state = changed_tensors(state, change)
    metadata = with_entry(metadata, **entries)
    path = rewrite(tmp_path / "m.skassoc", metadata, weights, state)
    with pytest.raises(ValueError, match=match):
        load(path, device="cpu")


@pytest.mark.parametrize(
    "name, dtype, shape, match",
    [
        ("sampler/order", "I64", [2**40], "at most"),
        ("sampler/order", "I64", [3, 40], "int64 vector"),
        ("exp_avg/logits.weight", "F32", [2**20, 2**20], "exp_avg/logits.weight"),
        ("rng/cpu", "U8", [2**30], "rng/cpu"),
        ("class_mass", "F64", [3], "class_mass"),
    ],
)
def test_a_header_claiming_large_tensors_is_refused_before_allocation(
    tmp_path, checkpoint, nothing_read, name, dtype, shape, match
):
    _, metadata, weights, state, _ = checkpoint
    state = by_hand(state, name, dtype, shape)
    path = rewrite(tmp_path / "m.skassoc", metadata, weights, state)
    with pytest.raises(ValueError, match=match):
        load(path, device="cpu")


def _negative_moment(tensors):
    tensors["exp_avg_sq/logits.bias"][0] = -1.0


def _nan_moment(tensors):
    tensors["exp_avg/logits.bias"][0] = float("nan")


def _negative_mass(tensors):
    tensors["class_mass"][0] = -0.5


def _bad_generator(tensors):
    tensors["sampler/generator"].fill_(255)


def _bad_rng(tensors):
    tensors["rng/cpu"].fill_(255)


def _repeated_order(tensors):
    tensors["sampler/order"][1] = tensors["sampler/order"][0]


def _negative_order(tensors):
    tensors["sampler/order"][0] = -1


@pytest.mark.parametrize(
    "change, match",
    [
        (_negative_moment, "is negative"),
        (_nan_moment, "NaN or infinity"),
        (_negative_mass, "is negative"),
        (_bad_generator, "not a CPU generator state"),
        (_bad_rng, "not a CPU generator state"),
        (_repeated_order, "distinct row indices"),
        (_negative_order, "distinct row indices"),
    ],
)
def test_a_state_of_bad_values_is_refused(tmp_path, checkpoint, change, match):
    _, metadata, weights, state, _ = checkpoint
    state = changed_tensors(state, change)
    path = rewrite(tmp_path / "m.skassoc", metadata, weights, state)
    with pytest.raises(ValueError, match=match):
        load(path, device="cpu")


def test_the_checksum_covers_the_training_state(tmp_path, checkpoint):
    _, metadata, weights, state, _ = checkpoint
    altered = changed_tensors(state, _negative_moment)
    path = rewrite(
        tmp_path / "m.skassoc", metadata, weights, altered, fix_checksum=False
    )
    with pytest.raises(ValueError, match="SHA-256 of training_state"):
        load(path, device="cpu")


def test_the_entry_and_the_member_go_together(tmp_path, checkpoint):
    _, metadata, weights, state, _ = checkpoint
    without_entry = {k: v for k, v in metadata.items() if k != "training_state"}
    path = rewrite(tmp_path / "a.skassoc", without_entry, weights, state)
    with pytest.raises(ValueError, match="no training_state entry"):
        load(path, device="cpu")
    path = rewrite(tmp_path / "b.skassoc", metadata, weights, None)
    with pytest.raises(ValueError, match="describes a training state"):
        load(path, device="cpu")


def test_a_cuda_generator_state_of_philox_size_loads(tmp_path, checkpoint):
    # A checkpoint of a GPU fit: the CUDA state is Philox's seed and offset.
    _, metadata, weights, state, _ = checkpoint
    cuda = torch.arange(16, dtype=torch.uint8)
    state = changed_tensors(state, lambda t: t.update({"rng/cuda": cuda}))
    metadata = with_entry(metadata, rng=["cpu", "cuda"])
    path = rewrite(tmp_path / "m.skassoc", metadata, weights, state)
    loaded = load(path, device="cpu")
    assert torch.equal(loaded.training_state_.rng["cuda"], cuda)
    assert len(loaded.training_state_.rng["cpu"]) == CPU_RNG_BYTES

"""Loss terms are registered objects: a new one is a class and a table row.

The toy term below is registered from this file, with its row of the
parameter table, and nothing else: fit, a stacked search, save and load
work with it. The estimator's constructor is written out (scikit-learn reads
its signature), so the test's subclass stands in for the constructor
argument that a contributor adds beside the row.
"""

import contextlib
import inspect
import tokenize
from pathlib import Path

import numpy as np
import pytest
import torch
from sklearn.datasets import make_blobs
from sklearn.utils._param_validation import InvalidParameterError

import skassoc
import skassoc._params as _params
from skassoc import SemiSupervisedAssociationClassifier
from skassoc._engine._loss_terms import (
    LOSS_TERMS,
    ClassFrequencies,
    LossTerm,
    StepLoss,
    active_terms,
    register_loss_term,
    unregister_loss_term,
)
from skassoc._params import PARAMS, add_param, loss_weight, remove_param
from skassoc._stacked import fit_candidates
from skassoc.model_selection import SemiSupervisedStratifiedKFold, StackedGridSearchCV


class ToyTerm(LossTerm):
    """The mean squared norm of the batch's embeddings (a toy regulariser)."""

    name = "toy"
    weight_param = "toy_weight"
    association = False

    def __call__(self, step):
        return step.embeddings[: step.n_batch].float().pow(2).sum(dim=1).mean()


#: The toy term's row of the parameter table; candidates may differ in it.
TOY_ROW = loss_weight("toy_weight", 0.0, stacked="vary")


class ToyClassifier(SemiSupervisedAssociationClassifier):
    """The estimator with the toy term's constructor argument added."""

    def __init__(self, network="auto", *, toy_weight=0.0, **params):
        super().__init__(network, **params)
        self.toy_weight = toy_weight


# scikit-learn reads the parameters from the signature: the written-out
# constructor's, plus toy_weight.
_BASE = inspect.signature(SemiSupervisedAssociationClassifier.__init__)
ToyClassifier.__init__.__signature__ = _BASE.replace(
    parameters=[
        *_BASE.parameters.values(),
        inspect.Parameter("toy_weight", inspect.Parameter.KEYWORD_ONLY, default=0.0),
    ]
)


@contextlib.contextmanager
def toy_registered():
    """The toy term and its row, for the duration of the context."""
    register_loss_term(ToyTerm)
    add_param(TOY_ROW)
    try:
        yield
    finally:
        remove_param(TOY_ROW.name)
        unregister_loss_term(ToyTerm.name)


@pytest.fixture
def toy_loss():
    with toy_registered():
        yield


@pytest.fixture(scope="module")
def blobs():
    X, y = make_blobs(120, centers=3, n_features=5, cluster_std=2.0, random_state=0)
    y[30:] = -1
    return X, y


def _toy(fast_params, **params):
    return ToyClassifier(**{**fast_params, **params})


def test_every_registered_term_is_weighed_by_a_loss_row_and_back():
    rows = {p.name for p in PARAMS if p.part == "losses"}
    weights = [term.weight_param for term in LOSS_TERMS.values()]
    assert sorted(weights) == sorted(rows)
    assert list(LOSS_TERMS) == ["walker", "visit", "logit", "consistency", "balance"]
    # The paper's terms are always in the history; the others when on.
    always = [t.name for t in active_terms(dict.fromkeys(weights, 0.0))]
    assert always == ["walker", "visit", "logit"]


def _files_naming(names):
    """For each name, the package files that use it as a code identifier."""
    found = {name: set() for name in names}
    package = Path(skassoc.__file__).parent
    for path in package.rglob("*.py"):
        with tokenize.open(path) as source:
            for token in tokenize.generate_tokens(source.readline):
                if token.type == tokenize.NAME and token.string in found:
                    found[token.string].add(path.relative_to(package).as_posix())
    return found


def test_loss_weights_are_code_in_the_constructor_and_one_more_file_at_most():
    # The step, the stacked candidates and the settings reach a weight
    # through the registry and the table, not by its name.
    rows = [p.name for p in PARAMS if p.part == "losses"]
    for name, files in _files_naming(rows).items():
        assert "_classifier.py" in files, name
        assert len(files) <= 2, (name, sorted(files))


def test_the_step_sums_the_weighed_terms_and_scales_the_association_ones():
    torch.manual_seed(0)
    # 4 labeled rows, 4 unlabeled ones, then their second view.
    embeddings = torch.randn(12, 4, requires_grad=True)
    logits, labels = torch.randn(4, 2), torch.tensor([0, 0, 1, 1])
    terms = active_terms(
        dict.fromkeys((t.weight_param for t in LOSS_TERMS.values()), 1)
    )
    loss = StepLoss(
        [t for t in terms if "class_frequencies" not in t.needs],
        ClassFrequencies(),
    )
    assert loss.names == ("total", "walker", "visit", "logit", "consistency")
    weights = [2.0, 3.0, 5.0, 7.0]
    scale = torch.tensor(0.5)
    out = loss(embeddings, logits, labels, 8, weights, scale)
    walker, visit, logit, consistency = out[1:]
    expected = 0.5 * (2 * walker + 3 * visit + 7 * consistency) + 5 * logit
    torch.testing.assert_close(out[0], expected)


def test_fit_trains_the_registered_term(blobs, fast_params, toy_loss):
    X, y = blobs
    off = _toy(fast_params, consistency_weight=2.0).fit(X, y)
    on = _toy(fast_params, toy_weight=0.5, consistency_weight=2.0).fit(X, y)
    assert "toy" not in off.history_
    assert len(on.history_["toy"]) == len(on.history_["step"])
    # The total holds the toy term with its weight (the steps' means of
    # sums are the sums of their means, up to rounding).
    h = on.history_
    association = [
        w + v + 2 * c
        for w, v, c in zip(h["walker"], h["visit"], h["consistency"], strict=True)
    ]
    expected = np.add(association, h["logit"]) + 0.5 * np.asarray(h["toy"])
    np.testing.assert_allclose(h["total"], expected, rtol=1e-5)
    # It pulls the embeddings toward the origin.
    norms = [np.linalg.norm(c.transform(X), axis=1).mean() for c in (on, off)]
    assert norms[0] < 0.8 * norms[1]


def test_a_term_at_weight_zero_leaves_the_fit_bit_for_bit(blobs, fast_params):
    X, y = blobs
    plain = SemiSupervisedAssociationClassifier(**fast_params).fit(X, y)
    with toy_registered():
        off = _toy(fast_params).fit(X, y)
    assert off.history_ == plain.history_
    np.testing.assert_array_equal(off.transform(X), plain.transform(X))


def test_an_estimator_without_the_registered_parameter_fits_at_its_default(
    blobs, fast_params, toy_loss
):
    """Registration is global: a plain estimator, built without toy_weight,
    trains with the row's default weight (0) instead of failing."""
    X, y = blobs
    plain = SemiSupervisedAssociationClassifier(**fast_params)
    assert not hasattr(plain, "toy_weight")
    plain.fit(X, y)
    assert "toy" not in plain.history_
    assert plain.history_ == _toy(fast_params, toy_weight=0.0).fit(X, y).history_


def test_a_stacked_fit_without_the_registered_parameter_uses_its_default(
    blobs, fast_params, toy_loss
):
    """A plain estimator's stacked candidates, built without toy_weight,
    train with the row's default weight (0), as its plain fit does."""
    X, y = blobs
    plain = SemiSupervisedAssociationClassifier(**fast_params)
    grid = [{"visit_weight": 0.5}, {"visit_weight": 1.0}]
    fitted = fit_candidates(plain, grid, X, y)
    for params, stacked in zip(grid, fitted, strict=True):
        assert not hasattr(stacked, "toy_weight")
        assert "toy" not in stacked.history_
        separate = _toy(fast_params, toy_weight=0.0, **params).fit(X, y)
        np.testing.assert_allclose(
            stacked.predict_proba(X), separate.predict_proba(X), atol=1e-4
        )


def test_the_row_validates_the_new_parameter(blobs, fast_params, toy_loss):
    X, y = blobs
    with pytest.raises(InvalidParameterError, match="toy_weight"):
        _toy(fast_params, toy_weight=-1.0).fit(X, y)


def test_stacked_candidates_vary_the_registered_weight(blobs, fast_params, toy_loss):
    X, y = blobs
    grid = [{"toy_weight": 0.1}, {"toy_weight": 1.0, "visit_weight": 0.5}]
    fitted = fit_candidates(_toy(fast_params), grid, X, y)
    for params, stacked in zip(grid, fitted, strict=True):
        separate = _toy(fast_params, **params).fit(X, y)
        assert stacked.toy_weight == params["toy_weight"]
        np.testing.assert_allclose(
            stacked.history_["toy"], separate.history_["toy"], rtol=1e-4
        )
        np.testing.assert_allclose(
            stacked.predict_proba(X), separate.predict_proba(X), atol=1e-4
        )
    search = StackedGridSearchCV(
        _toy(fast_params),
        {"toy_weight": [0.5, 2.0]},
        cv=SemiSupervisedStratifiedKFold(2),
    ).fit(X, y)
    assert [p["toy_weight"] for p in search.cv_results_["params"]] == [0.5, 2.0]
    assert type(search.best_estimator_) is ToyClassifier
    assert "toy" in search.best_estimator_.history_


def test_save_and_load_keep_the_registered_weight(
    blobs, fast_params, toy_loss, tmp_path
):
    X, y = blobs
    clf = _toy(fast_params, toy_weight=0.25).fit(X, y)
    path = tmp_path / "toy.skassoc"
    clf.save(path)
    loaded = ToyClassifier.load(path, device="cpu")
    assert loaded.get_params() == clf.get_params()
    np.testing.assert_array_equal(loaded.predict_proba(X), clf.predict_proba(X))
    assert loaded.history_["toy"] == pytest.approx(clf.history_["toy"])
    # The file's value is checked against the row's domain.
    clf.toy_weight = -1.0
    with pytest.raises(ValueError, match="toy_weight"):
        clf.save(tmp_path / "bad.skassoc")


def test_registration_is_undone_completely():
    before = (
        _params.PARAMS,
        dict(_params.PARAMETER_CONSTRAINTS),
        dict(_params.SAFE_PARAMS),
        _params.varying_params(),
        dict(LOSS_TERMS),
    )
    with toy_registered():
        assert _params.PARAMS[-1] is TOY_ROW
        assert (
            "toy_weight" in SemiSupervisedAssociationClassifier._parameter_constraints
        )
        assert "toy_weight" in _params.SAFE_PARAMS
        assert "toy_weight" in _params.varying_params()
        assert list(LOSS_TERMS)[-1] == "toy"
    after = (
        _params.PARAMS,
        dict(_params.PARAMETER_CONSTRAINTS),
        dict(_params.SAFE_PARAMS),
        _params.varying_params(),
        dict(LOSS_TERMS),
    )
    assert after == before


def test_a_term_without_its_row_is_refused_clearly(blobs, fast_params):
    X, y = blobs
    register_loss_term(ToyTerm)
    try:
        with pytest.raises(ValueError, match=r"weighed by \['toy_weight'\].*PARAMS"):
            _toy(fast_params, toy_weight=1.0).fit(X, y)
    finally:
        unregister_loss_term(ToyTerm.name)


def test_bad_terms_and_rows_are_refused(toy_loss):
    with pytest.raises(ValueError, match="registered already"):
        register_loss_term(ToyTerm)

    class SameWeight(ToyTerm):
        name = "other"

    with pytest.raises(ValueError, match="registered already"):
        register_loss_term(SameWeight)
    with pytest.raises(TypeError, match="weight_param"):

        class Nameless(LossTerm):
            name = "nameless"

    with pytest.raises(TypeError, match="needs"):

        class Needy(ToyTerm):
            needs = frozenset({"third_view"})

    with pytest.raises(ValueError, match="already"):
        add_param(TOY_ROW)
    with pytest.raises(ValueError, match="part 'losses'"):
        add_param(
            _params.Param(
                "toy_rate",
                default=0.1,
                constraints=(float,),
                file_domain=lambda v: True,
                part="schedule",
            )
        )
    with pytest.raises(ValueError, match="no row that add_param added"):
        remove_param("visit_weight")

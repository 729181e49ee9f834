"""The named parameter sets of skassoc.RECIPES."""

import numpy as np
import pytest
from sklearn.datasets import load_digits

from skassoc import RECIPES, SemiSupervisedAssociationClassifier, recipe_params


@pytest.mark.parametrize("name", sorted(RECIPES))
def test_every_recipe_is_a_valid_parameter_set(name):
    params = recipe_params(name)
    clf = SemiSupervisedAssociationClassifier(**params)
    clf._validate_params()
    assert {key: clf.get_params()[key] for key in params} == params


def test_recipe_params_returns_a_copy():
    params = recipe_params("improved")
    params["augmentation"]["affine_std"] = 1.0
    params["max_iter"] = 1
    assert "affine_std" not in RECIPES["improved"]["augmentation"]
    assert recipe_params("improved")["max_iter"] == 20_000


def test_unknown_recipe_names_the_known_ones():
    with pytest.raises(ValueError, match="Unknown recipe 'mnist'.*'paper'"):
        recipe_params("mnist")
    with pytest.raises(ValueError, match="Unknown recipe"):
        recipe_params(["paper"])


def test_improved_is_paper_plus_the_labeled_batch_warp_and_more_visits():
    paper, improved = recipe_params("paper"), recipe_params("improved")
    augmentation = improved.pop("augmentation")
    assert improved.pop("visit_weight") > paper.pop("visit_weight")
    assert improved == paper
    # The paper's warp (the defaults), on the labeled batch only.
    assert augmentation == {"unlabeled": False}


def test_consistency_is_improved_plus_the_consistency_loss():
    improved, consistency = recipe_params("improved"), recipe_params("consistency")
    assert consistency.pop("consistency_weight") > 0
    assert consistency == improved


def test_balanced_is_consistency_plus_the_balance_loss():
    consistency, balanced = recipe_params("consistency"), recipe_params("balanced")
    assert balanced.pop("balance_weight") > 0
    assert balanced == consistency


def test_fast_is_consistency_in_fewer_larger_steps_on_a_cosine():
    consistency, fast = recipe_params("consistency"), recipe_params("fast")
    assert fast.pop("max_iter") < consistency.pop("max_iter")
    assert fast.pop("unlabeled_batch_size") > consistency.pop("unlabeled_batch_size")
    assert fast.pop("lr_schedule") == "cosine"
    assert 0 < fast.pop("lr_warmup_steps")
    assert fast.pop("learning_rate") > consistency.pop("learning_rate")
    assert (fast.pop("precision"), fast.pop("compile")) == ("bf16", True)
    # The step schedule's parameters would be unused: the recipe leaves them out.
    del consistency["lr_decay"], consistency["lr_decay_steps"]
    assert fast == consistency


@pytest.mark.parametrize("name", sorted(RECIPES))
def test_every_recipe_trains_on_small_images(name, torch_single_thread):
    X, y = load_digits(return_X_y=True)
    X = (X * 15).astype(np.uint8).reshape(-1, 8, 8)
    y_semi = np.where(np.arange(len(y)) % 10 == 0, y, -1)
    # Two steps with a small unlabeled batch: the recipe's 1,000 colour
    # 32x32 images a step (domain adaptation) would take seconds on a CPU.
    params = {
        **recipe_params(name),
        "max_iter": 2,
        "lr_decay_steps": 1,
        "unlabeled_batch_size": 50,
        # Compiling takes longer than the fit on a CPU (tests of its own
        # cover it); a warm-up must end within the two steps.
        "compile": False,
        "lr_warmup_steps": min(1, recipe_params(name).get("lr_warmup_steps", 0)),
    }
    clf = SemiSupervisedAssociationClassifier(**params, device="cpu", random_state=0)
    clf.fit(X, y_semi)
    assert clf.n_iter_ == 2
    assert clf.network_ == params["network"]
    assert np.isfinite(clf.history_["total"]).all()
    # The two steps changed the weights it started from.
    untrained = SemiSupervisedAssociationClassifier(
        **{**params, "max_iter": 1, "learning_rate": 1e-12, "lr_warmup_steps": 0},
        device="cpu",
        random_state=0,
    ).fit(X, y_semi)
    assert not np.allclose(clf.transform(X[:20]), untrained.transform(X[:20]))

"""
===========================================================
Is the fit any good, and which samples should I label next?
===========================================================

With 5 labels per class there are none to spare for a test set. Every fit
of :class:`~skassoc.SemiSupervisedAssociationClassifier` checks itself on
its training data and keeps the result as ``fit_report_``: whether a class
takes a larger share of the unlabeled samples than it should, the typical
trace of a style of one class handed to another. And
:meth:`~skassoc.SemiSupervisedAssociationClassifier.suggest_labels` names
the unlabeled samples whose labels should help most: the most typical
samples of the regions of the embedding that hold no labeled one (when
the report is "suspect", the regions of the class it names).

This example runs one round of the loop on scikit-learn's digits (fit,
read the report, label the 10 suggested samples, continue the fit) and
compares the suggested labels with 10 labels of random samples, on a few
draws of the first labels. The digits' true labels stand in for the person who
would label the samples.

Two parameters are set. ``class_prior="uniform"`` says that the digits'
classes are about equally frequent: without it the first fit's report
would check no class shares (its labels are as many a class, which says
nothing about how frequent the classes are), and the refit's would
expect each class to take its share of the labels, which the 10 new
labels make unequal. ``max_iter=300`` keeps each fit to a few seconds on
one CPU core (``"auto"`` trains longer). :ref:`user_guide_trust` says what the report
can and cannot tell.
"""

# %%
# A fit and its report
# --------------------
# A fixed test set measures what the labels did; the training set keeps 5
# labels per class and marks the other samples ``-1``. ``fit`` warns a
# ``FitReportWarning`` when its report is "suspect"; this example prints
# the reports instead, so it silences the warning.
import copy
import warnings

import matplotlib.pyplot as plt
import numpy as np
from sklearn.datasets import load_digits
from sklearn.model_selection import train_test_split

from skassoc import FitReportWarning, SemiSupervisedAssociationClassifier
from skassoc.datasets import make_semi_supervised_labels

X, y = load_digits(return_X_y=True)
X_train, X_test, y_train, y_test = train_test_split(
    X, y, test_size=0.3, stratify=y, random_state=0
)


def fit(y_semi, seed):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FitReportWarning)
        clf = SemiSupervisedAssociationClassifier(
            class_prior="uniform", max_iter=300, random_state=seed
        )
        return clf.fit(X_train, y_semi)


y_semi = make_semi_supervised_labels(y_train, 5, random_state=0)
clf = fit(y_semi, seed=0)
print(clf.fit_report_)

# %%
# Ten samples to label
# --------------------
# Passing ``y`` as in ``fit`` restricts the suggestions to unlabeled
# samples and tells the regions that a labeled sample already covers.
# Above each suggested digit: its true label (what the person labelling
# it would say) and what the first fit predicts for it.
picks = clf.suggest_labels(X_train, 10, y=y_semi, random_state=0)
predicted = clf.predict(X_train[picks])

fig, axes = plt.subplots(1, 10, figsize=(10, 1.8), layout="constrained")
for ax, index, guess in zip(axes, picks, predicted):
    ax.imshow(X_train[index].reshape(8, 8), cmap="gray_r")
    ax.set_title(f"{y_train[index]} (fit: {guess})", fontsize=9)
    ax.set_axis_off()
fig.suptitle("The samples suggest_labels picks: true label (first fit's prediction)")
plt.show()

# %%
# Fit again, with the suggested or with random labels
# ---------------------------------------------------
# Each refit gets the first labels and 10 more: those of the suggested
# samples, or those of 10 unlabeled samples drawn at random. It continues
# the first fit (``warm_start=True``, on a copy, so that the first fit
# stays as it is), and trains a new network instead when the continued
# run's report is "suspect": a continued run can diverge into predicting
# one class, which the report flags (:ref:`benchmarks_trust_warm_start`
# measures both refits on MNIST). The same is repeated on three more draws
# of the first labels, since one draw says little.


def with_labels(y_semi, extra):
    y_more = y_semi.copy()
    y_more[extra] = y_train[extra]
    return y_more


def refit(clf, y_more, seed):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FitReportWarning)
        more = copy.deepcopy(clf).set_params(warm_start=True).fit(X_train, y_more)
    if more.fit_report_.verdict == "suspect":
        more = fit(y_more, seed)
    return more


def one_round(y_semi, seed, clf, picks):
    """Test accuracy of the fit, and of the refits with 10 more labels."""
    rng = np.random.default_rng(seed)
    random_picks = rng.choice(np.flatnonzero(y_semi == -1), 10, replace=False)
    scores = {"5 labels per class": clf.score(X_test, y_test)}
    for name, extra in (("+ 10 suggested", picks), ("+ 10 at random", random_picks)):
        scores[name] = refit(clf, with_labels(y_semi, extra), seed).score(
            X_test, y_test
        )
    return scores


draws = [0, 1, 2, 3]
rounds = {0: one_round(y_semi, 0, clf, picks)}
verdicts = {0: clf.fit_report_.verdict}
for seed in draws[1:]:
    y_seed = make_semi_supervised_labels(y_train, 5, random_state=seed)
    clf_seed = fit(y_seed, seed)
    picks_seed = clf_seed.suggest_labels(X_train, 10, y=y_seed, random_state=seed)
    rounds[seed] = one_round(y_seed, seed, clf_seed, picks_seed)
    verdicts[seed] = clf_seed.fit_report_.verdict

for seed in draws:
    scores = ", ".join(f"{name} {value:.3f}" for name, value in rounds[seed].items())
    print(f"draw {seed} (first fit {verdicts[seed]}): {scores}")

# %%
# Test accuracy before and after
# ------------------------------
# For each draw of the first labels: the first fit (with its report's
# verdict below the draw) and the two refits.
fig, ax = plt.subplots(figsize=(7, 4), layout="constrained")
names = list(rounds[0])
for offset, name, marker in zip((-0.2, 0, 0.2), names, ("o", "^", "s")):
    ax.plot(
        np.arange(len(draws)) + offset,
        [rounds[seed][name] for seed in draws],
        marker,
        markersize=8,
        label=name,
    )
ax.set_xticks(
    np.arange(len(draws)), [f"draw {seed}\n{verdicts[seed]}" for seed in draws]
)
ax.set_ylabel("test accuracy")
ax.set_title("Digits: 10 more labels, suggested or random")
ax.grid(axis="y", alpha=0.3)
ax.legend()
plt.show()

# %%
# The suggested samples come from regions of the embedding that the first
# labels left uncovered, and some are digits that the first fit gets wrong
# (the titles of the first figure); random samples land there only by
# chance.
# :ref:`benchmarks_trust` measures the same comparison on MNIST, with the
# uncertainty strategies (smallest margin, largest entropy) too. In a real
# loop, label the suggested samples, refit as above, read ``fit_report_``
# again and repeat while the labelling budget lasts.

"""
==================================================
The learned embedding, and models on top of it
==================================================

:meth:`~skassoc.SemiSupervisedAssociationClassifier.transform` maps samples
to the embedding that the association losses shape: samples of one class
should lie close together, because a walker that steps from a labeled sample
to similar unlabeled samples and back must end in the class where it
started. This example projects the embedding of the digits dataset to two
dimensions before and after training, uses it as features for a logistic
regression in a pipeline, and shows nearest neighbours in it.
"""

# %%
# Training with 10 labels per class
# ---------------------------------
# The trained model has the default parameters. The "before" model differs
# only in ``max_iter=1``: trained for a single step, its embedding is that
# of the randomly initialised network.
import matplotlib.pyplot as plt
import numpy as np
from sklearn.datasets import load_digits
from sklearn.decomposition import PCA
from sklearn.frozen import FrozenEstimator
from sklearn.linear_model import LogisticRegression
from sklearn.model_selection import train_test_split
from sklearn.pipeline import make_pipeline

from skassoc import SemiSupervisedAssociationClassifier
from skassoc.datasets import make_semi_supervised_labels
from skassoc.plotting import plot_nearest_neighbors

X, y = load_digits(return_X_y=True)
X_train, X_test, y_train, y_test = train_test_split(
    X, y, test_size=0.3, stratify=y, random_state=0
)
y_semi = make_semi_supervised_labels(y_train, 10, random_state=0)
labeled = y_semi != -1


before = SemiSupervisedAssociationClassifier(max_iter=1, random_state=0)
before.fit(X_train, y_semi)
after = SemiSupervisedAssociationClassifier(random_state=0).fit(X_train, y_semi)
print(f"Test accuracy after 1 step: {before.score(X_test, y_test):.3f}")
print(f"Test accuracy after {after.n_iter_} steps: {after.score(X_test, y_test):.3f}")

# %%
# The test set in the embedding, projected by PCA
# -----------------------------------------------
# The embedding has 128 dimensions; a PCA fitted on each model's embedding of
# the test set keeps the two directions of largest spread.
fig, axes = plt.subplots(1, 2, figsize=(10, 4.6), layout="constrained")
for ax, model, title in [
    (axes[0], before, "Before training (1 step)"),
    (axes[1], after, f"After training ({after.n_iter_} steps)"),
]:
    points = PCA(n_components=2).fit_transform(model.transform(X_test))
    scatter = ax.scatter(*points.T, c=y_test, cmap="tab10", s=12, vmin=-0.5, vmax=9.5)
    # The untrained network maps a few digits far away; zoom on the bulk.
    low, high = np.percentile(points, [1, 99], axis=0)
    margin = 0.1 * (high - low)
    ax.set_xlim(low[0] - margin[0], high[0] + margin[0])
    ax.set_ylim(low[1] - margin[1], high[1] + margin[1])
    ax.set_title(title)
    ax.set_xlabel("First principal component")
    ax.set_ylabel("Second principal component")
fig.colorbar(scatter, ax=axes, ticks=range(10), label="Digit")

# %%
# Before training the classes overlap; after training each class gathers in
# a cluster of its own, although only 100 of the 1257 training samples had
# a label (two of the 128 dimensions cannot keep all ten clusters apart).
#
# A logistic regression on the embedding
# --------------------------------------
# The fitted classifier is also a transformer, so it can be the first step
# of a :class:`~sklearn.pipeline.Pipeline`. One catch: ``Pipeline.fit`` passes
# the same ``y`` to every step, and a plain
# :class:`~sklearn.linear_model.LogisticRegression` would take the ``-1`` of
# the unlabeled samples for a class of its own. So the network, trained once
# with the unlabeled samples, is wrapped in
# :class:`~sklearn.frozen.FrozenEstimator` (its ``fit`` does nothing) and the
# pipeline is fitted on the labeled samples only.
pipeline = make_pipeline(FrozenEstimator(after), LogisticRegression(max_iter=1000))
pipeline.fit(X_train[labeled], y_semi[labeled])
print(f"Logistic regression on the embedding: {pipeline.score(X_test, y_test):.3f}")

# To fit one pipeline on all samples, end it in a semi-supervised model
# instead, e.g. ``SelfTrainingClassifier(LogisticRegression())``, which
# skips the ``-1`` labels.

# %%
# Nearest neighbours in the embedding
# -----------------------------------
# For a few test digits, the closest training digits by cosine similarity of
# the trained embedding, framed green when they show the same digit and red
# otherwise. The last two queries are digits that the classifier gets
# wrong, framed thick red with the predicted digit under them. Their
# neighbours can still be mostly of the right digit: a sample
# can sit in the right neighbourhood and yet on the wrong side of the linear
# layer's boundary.
wrong = np.flatnonzero(after.predict(X_test) != y_test)
queries = np.concatenate([[0, 1, 2], wrong[:2]])
fig = plot_nearest_neighbors(
    after,
    X_test[queries],
    X_train,
    n_neighbors=6,
    y_query=y_test[queries],
    y_pool=y_train,
    image_shape=(8, 8),
)
fig.suptitle("Nearest training digits of five test digits")

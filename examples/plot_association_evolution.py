"""
=======================================
How the associations evolve in training
=======================================

A reproduction of Figure 3 of the paper on scikit-learn's digits. A walker
starts at every labeled sample of a batch ``A`` (top row, green), steps to
the unlabeled samples of a batch ``B`` (middle row, red) and back to ``A``
(bottom row). The darker a line, the more likely that step: ``P_ab`` on the
way down, ``P_ba`` on the way back, both softmaxes of the dot products of the
embeddings.

Before training the walk already finds many right partners, because even an
untrained network keeps similar 8x8 digits close, but it also makes mistakes,
and it runs through a few unlabeled samples while others are never visited.
After training the walk from a digit leads to unlabeled samples of the same
digit and back to its class, and the visit loss spreads it over all of
``B``.
"""

# %%
# Training, and the batches to draw
# ---------------------------------
# The network trains with 10 labels per class. As in the paper's figure, the
# drawn batch ``A`` holds 2 labeled samples of every digit. ``B`` holds 20
# unlabeled samples, 2 of every digit so that each labeled sample has
# partners to find (the walk never sees their labels). The trained model
# has the default parameters; the "before" model differs only in
# ``max_iter=1``, a single step.
import matplotlib.pyplot as plt
import numpy as np
from sklearn.datasets import load_digits

from skassoc import SemiSupervisedAssociationClassifier
from skassoc.datasets import make_semi_supervised_labels
from skassoc.plotting import plot_association_graph

X, y = load_digits(return_X_y=True)
y_semi = make_semi_supervised_labels(y, 10, random_state=0)
rng = np.random.RandomState(0)
labeled = np.flatnonzero(y_semi != -1)
unlabeled = np.flatnonzero(y_semi == -1)
batch_a = np.concatenate([labeled[y[labeled] == digit][:2] for digit in range(10)])
batch_b = np.concatenate(
    [
        rng.choice(unlabeled[y[unlabeled] == digit], 2, replace=False)
        for digit in range(10)
    ]
)


before = SemiSupervisedAssociationClassifier(max_iter=1, random_state=0)
before.fit(X, y_semi)
after = SemiSupervisedAssociationClassifier(random_state=0).fit(X, y_semi)

# %%
# The walk A -> B -> A before and after training
# ----------------------------------------------
# The middle row is ordered by the class whose labeled samples visit each
# unlabeled sample most, which uses no labels of ``B``. The line under each
# panel gives the probability that a round trip ends in the class where it
# started, which the walker loss drives up.
fig, axes = plt.subplots(2, 1, figsize=(10, 7))
fig.subplots_adjust(left=0.11, right=0.99, top=0.95, bottom=0.06, hspace=0.35)
for ax, model, title in [
    (axes[0], before, "Before training (1 step)"),
    (axes[1], after, f"After training ({after.n_iter_} steps)"),
]:
    plot_association_graph(
        model,
        X[batch_a],
        y[batch_a],
        X[batch_b],
        ax=ax,
        image_shape=(8, 8),
    )
    ax.set_title(title)

# %%
# Before training the steps are sharp (single black lines) and cross between
# classes; after training they fan out over the unlabeled samples of the
# right digit, and the share of round trips that return to their class rises.
# The paper's figure shows the same on MNIST after 10,000 steps.

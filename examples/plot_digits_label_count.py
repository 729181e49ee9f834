"""
===========================================================
Accuracy against the number of labels on the digits dataset
===========================================================

How much do unlabeled samples help when only a few samples of every class
carry a label? This example trains
:class:`~skassoc.SemiSupervisedAssociationClassifier` on scikit-learn's 8x8
digits with 2 to 20 labels per class and compares it with

* the same network trained on the labeled samples alone (walker and visit
  weights set to zero, which also switches the consistency loss off), which
  isolates what the association and consistency losses add,
* :class:`~sklearn.semi_supervised.LabelSpreading`, which spreads the labels
  over a nearest-neighbour graph of the samples, and
* :class:`~sklearn.semi_supervised.SelfTrainingClassifier`, which labels the
  unlabeled samples with a logistic regression's own confident predictions.

The networks are small fully connected ones trained for a few hundred steps
on the CPU, so this runs in about a minute.
"""

# %%
# Data and models
# ---------------
# A fixed test set measures accuracy; in the training set all but
# ``n_labels`` samples per class get the label ``-1`` ("unlabeled"). Every
# label count is repeated with three random draws of the labeled samples,
# because with 2 labels per class the result depends a lot on which two.
import matplotlib.pyplot as plt
import numpy as np
from sklearn.datasets import load_digits
from sklearn.linear_model import LogisticRegression
from sklearn.model_selection import train_test_split
from sklearn.pipeline import make_pipeline
from sklearn.preprocessing import StandardScaler
from sklearn.semi_supervised import LabelSpreading, SelfTrainingClassifier

from skassoc import SemiSupervisedAssociationClassifier
from skassoc.datasets import make_semi_supervised_labels

X, y = load_digits(return_X_y=True)
X_train, X_test, y_train, y_test = train_test_split(
    X, y, test_size=0.3, stratify=y, random_state=0
)


def association(n_labels, **params):
    # Every labeled batch holds all labeled samples of each class.
    return SemiSupervisedAssociationClassifier(
        "mlp",
        labeled_per_class=n_labels,
        max_iter=400,
        device="cpu",
        random_state=0,
        **params,
    )


def accuracies(n_labels, seed):
    y_semi = make_semi_supervised_labels(y_train, n_labels, random_state=seed)
    labeled = y_semi != -1
    models = {
        "Association": (association(n_labels), X_train, y_semi),
        # Same network and steps, but only the classification loss, and only
        # the labeled samples (the feature noise is sized on them).
        "Same network, labeled only": (
            association(n_labels, walker_weight=0.0, visit_weight=0.0),
            X_train[labeled],
            y_semi[labeled],
        ),
        "LabelSpreading": (
            LabelSpreading(kernel="knn", n_neighbors=10),
            X_train,
            y_semi,
        ),
        "SelfTraining (logistic regression)": (
            SelfTrainingClassifier(
                make_pipeline(StandardScaler(), LogisticRegression(max_iter=1000))
            ),
            X_train,
            y_semi,
        ),
    }
    return {
        name: model.fit(X_fit, y_fit).score(X_test, y_test)
        for name, (model, X_fit, y_fit) in models.items()
    }


label_counts = [2, 5, 10, 20]
seeds = [0, 1, 2]
results = {
    n_labels: [accuracies(n_labels, seed) for seed in seeds]
    for n_labels in label_counts
}

# %%
# Accuracy against labels per class
# ---------------------------------
# The lines show the mean over the three draws, the bars their minimum and
# maximum (each method is shifted a little sideways so that the bars do not
# hide each other).
fig, ax = plt.subplots(figsize=(7, 4.5), layout="constrained")
names = list(results[label_counts[0]][0])
for k, (name, marker) in enumerate(zip(names, "osD^", strict=True)):
    scores = np.array([[run[name] for run in results[n]] for n in label_counts])
    mean = scores.mean(axis=1)
    shift = 1 + 0.03 * (k - (len(names) - 1) / 2)
    ax.errorbar(
        np.array(label_counts) * shift,
        mean,
        yerr=[mean - scores.min(axis=1), scores.max(axis=1) - mean],
        marker=marker,
        capsize=3,
        label=name,
    )
ax.set_xscale("log")
ax.set_xticks(label_counts, [str(n) for n in label_counts])
ax.minorticks_off()
ax.set_xlabel("Labeled samples per class")
ax.set_ylabel("Test accuracy")
ax.set_title("Digits: accuracy against the number of labels")
ax.grid(alpha=0.3)
ax.legend(loc="lower right")

# %%
# At every label count the network trained with the unlabeled samples beats
# the same network trained on the labeled samples alone, by the widest
# margin where labels are scarcest. On these tiny 8x8 images a
# nearest-neighbour graph on the raw pixels is already a very good
# similarity, which is why label spreading does so well here. Learning by
# association is meant for data where raw pixel distances are poor and a
# network must learn the similarity, such as MNIST or SVHN (see the MNIST
# example and ``benchmarks/bench_mnist.py``).

"""
==========================================
MNIST with 10 labels per class, on the CPU
==========================================

The paper's MNIST setting in miniature: 10 labeled images per class, the
other 59,900 training images unlabeled, and the estimator's default
parameters, which choose the paper's convolutional network for 28x28
images. The paper trains for 20,000 steps on a GPU and reaches 0.89% test
error; on a CPU the defaults choose a number of steps that fits in about a
minute. For the paper's runs, see ``benchmarks/bench_mnist.py`` and
recipe ``"paper"``.
"""

# %%
# Loading MNIST
# -------------
# :func:`~skassoc.datasets.load_mnist` reads the folder named by the
# ``SKASSOC_MNIST_DIR`` environment variable when it is set. Otherwise this
# example uses the copy of the data next to the repository if there is one.
# It never downloads (``download_if_missing=False``): to fetch the four
# files once, run ``skassoc.datasets.load_mnist()`` yourself. The docs
# build runs this example only when the files are on the machine.
# sphinx_gallery_thumbnail_path = "_static/plot_mnist_cpu_thumbnail.png"
import os
from pathlib import Path

import matplotlib.pyplot as plt
import numpy as np
from sklearn.metrics import ConfusionMatrixDisplay

from skassoc import SemiSupervisedAssociationClassifier
from skassoc.datasets import load_mnist, make_semi_supervised_labels

# Without SKASSOC_MNIST_DIR, use the copy beside the repository (run from the
# repository root or, as the docs build does, from examples/).
data_home = None
candidates = [
    Path("..", "shared", "data", "mnist"),
    Path("..", "..", "shared", "data", "mnist"),
]
if "SKASSOC_MNIST_DIR" not in os.environ:
    data_home = next((path for path in candidates if path.is_dir()), None)

X_train, y_train = load_mnist(
    "train", data_home=data_home, download_if_missing=False, return_X_y=True
)
X_test, y_test = load_mnist(
    "test", data_home=data_home, download_if_missing=False, return_X_y=True
)
# 2,000 test images keep the prediction short; the accuracy on all 10,000
# differs by a fraction of a percent.
X_test, y_test = X_test[:2000], y_test[:2000]
y_semi = make_semi_supervised_labels(y_train, 10, random_state=0)
print(f"{np.sum(y_semi != -1)} labeled and {np.sum(y_semi == -1)} unlabeled images")

# %%
# Training
# --------
# The images stay raw ``(n, 28, 28)`` uint8 arrays; the network scales them.
clf = SemiSupervisedAssociationClassifier(random_state=0)
clf.fit(X_train, y_semi)
y_pred = clf.predict(X_test)
print(f"Network {clf.network_!r}, {clf.n_iter_} steps")
print(f"Test accuracy: {np.mean(y_pred == y_test):.3f}")

# %%
# In our runs the same network trained without the walker and visit losses
# (``walker_weight=0, visit_weight=0``), on the 100 labeled images alone,
# stayed about ten points lower: the unlabeled images do most of the work.
#
# Confusion matrix
# ----------------
fig, ax = plt.subplots(figsize=(6, 5.5), layout="constrained")
ConfusionMatrixDisplay.from_predictions(y_test, y_pred, ax=ax, colorbar=False)
ax.set_title(f"MNIST, 100 labels, defaults: {np.mean(y_pred == y_test):.1%} accuracy")

# %%
# Misclassified test images
# -------------------------
# Each title reads "true -> predicted". Many mistakes are digits written in
# a way that none of the 100 labeled images shows, as the paper observes.
wrong = np.flatnonzero(y_pred != y_test)[:24]
fig, axes = plt.subplots(3, 8, figsize=(8, 3.6), layout="constrained")
for ax, index in zip(axes.ravel(), wrong, strict=False):
    ax.imshow(X_test[index], cmap="gray_r")
    ax.set_title(f"{y_test[index]} \u2192 {y_pred[index]}", fontsize=10)
for ax in axes.ravel():
    ax.set_axis_off()

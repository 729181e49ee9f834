"""
==================================================
Classifying signals with the 1-D network
==================================================

Signals (time series, spectra, sensor recordings) are images one value high
for :class:`~skassoc.SemiSupervisedAssociationClassifier`: passed as rows
with ``input_shape=(length,)``, or as ``(n, channels, 1, length)`` arrays,
they get ``network="signal"``, a 1-D convolutional network whose pooling
over time recognises a pattern wherever it lies, and an augmentation of
their own (shifts, time warps, scaling, noise). See "Time series and
signals" in the :ref:`User Guide <user_guide>`.

The signals here are generated, so that the example needs no download:
:func:`~skassoc.datasets.make_synthetic_signals` draws the classic
Cylinder-Bell-Funnel problem with three more shapes, one event per signal
at a random place and of a random duration, in noise. With 5 labeled
signals per class, the example compares the estimator's defaults with

* the same estimator on the signals as plain feature rows (its MLP, which
  sees every time step as a column of its own), and
* :class:`~sklearn.semi_supervised.LabelSpreading` on the standardised rows.
"""

# %%
# Six shapes at random places
# ---------------------------
import matplotlib.pyplot as plt
from sklearn.model_selection import train_test_split
from sklearn.pipeline import make_pipeline
from sklearn.preprocessing import StandardScaler
from sklearn.semi_supervised import LabelSpreading

from skassoc import SemiSupervisedAssociationClassifier
from skassoc.datasets import make_semi_supervised_labels, make_synthetic_signals

X, y = make_synthetic_signals(600, n_classes=6, random_state=0)
rows = X.reshape(len(X), -1)  # (600, 128): one channel, 128 values
rows_train, rows_test, y_train, y_test = train_test_split(
    rows, y, test_size=0.3, stratify=y, random_state=0
)
y_semi = make_semi_supervised_labels(y_train, 5, random_state=0)

# The shapes of the classes 0 to 5, in make_synthetic_signals' order.
shapes = ["cylinder", "bell", "funnel", "burst", "peak", "dip"]
fig, axes = plt.subplots(2, 3, figsize=(9, 4.5), sharex=True, sharey=True)
for label, (ax, name) in enumerate(zip(axes.flat, shapes, strict=True)):
    for signal in rows_train[y_train == label][:3]:
        ax.plot(signal, linewidth=0.8)
    ax.set_title(name)
fig.supxlabel("time step")
fig.tight_layout()

# %%
# Three fits on the same labels
# -----------------------------
# ``input_shape=(128,)`` says that each row is one signal: the defaults
# then choose the 1-D network, its augmentation and the number of steps.
# Without it, the rows are feature vectors and get the MLP.
models = {
    "skassoc, signals": SemiSupervisedAssociationClassifier(
        input_shape=(128,), random_state=0
    ),
    "skassoc, feature rows": SemiSupervisedAssociationClassifier(random_state=0),
    "LabelSpreading": make_pipeline(
        StandardScaler(), LabelSpreading(kernel="knn", n_neighbors=10)
    ),
}
scores = {}
for name, model in models.items():
    model.fit(rows_train, y_semi)
    scores[name] = model.score(rows_test, y_test)
    print(f"{name}: test accuracy {scores[name]:.3f}")
print("network chosen for the signals:", models["skassoc, signals"].network_)

fig, ax = plt.subplots(figsize=(6, 3), layout="constrained")
ax.barh(list(scores), list(scores.values()))
ax.set_xlim(0, 1)
ax.set_xlabel("Test accuracy, 5 labels per class")
ax.invert_yaxis()

# %%
# The event's place and duration change from signal to signal, so no
# column of the rows belongs to one shape: the MLP and the nearest
# neighbours of label spreading compare signals time step by time step,
# while the convolutions find the shape wherever it lies. The benchmarks
# page (:doc:`/benchmarks/defaults`) measures the defaults on real signal
# sets too, with where they still lose.

"""
================================================
Learning curves: the losses and a validation set
================================================

``fit`` records the losses of training in ``history_``, and with a labeled
validation set (``fit(X, y, X_val=..., y_val=...)``) the accuracy on it
every ``validation_interval`` steps. Plotted against the training step, they
show whether training was long enough and whether it went wrong somewhere,
for example a class collapsing into another late in training.

This example fits on scikit-learn's digits with 5 labels per class. The
estimator keeps its default parameters but for ``validation_interval``,
which this example is about.
"""

# %%
# A fit with a validation set
# ---------------------------
# The validation samples are labeled and never used in training: their
# accuracy is measured every 50 steps (the default, 500, would give only
# two points on this short fit) and after the last one. Here they are
# a held-out part of the digits; keep them apart from a test set you report.
import matplotlib.pyplot as plt
from sklearn.datasets import load_digits
from sklearn.model_selection import train_test_split

from skassoc import SemiSupervisedAssociationClassifier
from skassoc.datasets import make_semi_supervised_labels

X, y = load_digits(return_X_y=True)
X_train, X_val, y_train, y_val = train_test_split(
    X, y, test_size=0.3, stratify=y, random_state=0
)
y_semi = make_semi_supervised_labels(y_train, 5, random_state=0)  # -1 = unlabeled

clf = SemiSupervisedAssociationClassifier(validation_interval=50, random_state=0)
clf.fit(X_train, y_semi, X_val=X_val, y_val=y_val)

history = clf.history_
print("recorded:", ", ".join(history))
print(
    f"validation accuracy after {history['validation_step'][-1]} steps: "
    f"{history['validation_score'][-1]:.3f}"
)

# %%
# Losses and validation accuracy against the step
# -----------------------------------------------
# Each loss entry is the mean over the steps since the previous entry.
# ``"total"`` is the weighted sum of the walker, visit and classification
# (``"logit"``) losses and of the consistency loss, which feature columns get
# by default (``"consistency"``); the L2 penalty acts as weight decay and is
# not part of it.
fig, (ax_loss, ax_score) = plt.subplots(
    2, 1, sharex=True, figsize=(7, 6), layout="constrained"
)
for name in ("total", "walker", "visit", "logit", "consistency"):
    ax_loss.plot(history["step"], history[name], label=name)
ax_loss.set_yscale("log")
ax_loss.set_ylabel("loss")
ax_loss.legend(title="history_ key", ncols=2, loc="center right")
ax_loss.set_title("Digits, 5 labels per class")

ax_score.plot(history["validation_step"], history["validation_score"], marker="o")
ax_score.set_xlabel("training step")
ax_score.set_ylabel("validation accuracy")
ax_score.grid(alpha=0.3)
plt.show()

# %%
# The visit loss sits near its floor (the log of the unlabeled batch size
# when every unlabeled sample is visited equally), the walker loss falls as
# round trips end in their class more often, and the validation accuracy
# rises with it. The fitted model is always that of the last step: the
# curve shows how training went, it does not pick a checkpoint. To choose
# ``max_iter`` or other settings by such a curve, use a validation set of
# its own, apart from the test set, or the labeled folds of the user guide.

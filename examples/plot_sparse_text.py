"""
===============================================
Text classification from a sparse TF-IDF matrix
===============================================

:class:`~skassoc.SemiSupervisedAssociationClassifier` takes the sparse
matrix that :class:`~sklearn.feature_extraction.text.TfidfVectorizer`
returns as it is: with ``network="auto"`` it trains the ``"sparse_mlp"``
network, whose first layer multiplies only the nonzero values of each
document, and the matrix is never made dense (see "Text and other sparse
data" in the :ref:`User Guide <user_guide>`).

The documents here are generated, so that the example needs no download:
each of 8 classes (topics) has words of its own, pairs of classes share a
group of words, and most words of every document come from one vocabulary
shared by all, drawn with Zipf's law as in real text. With 5 labeled
documents per class, the example compares the estimator's default
parameters with scikit-learn's

* :class:`~sklearn.semi_supervised.LabelSpreading`, which spreads the labels
  over a nearest-neighbour graph of the documents, and
* a :class:`~sklearn.linear_model.LogisticRegression` trained on the labeled
  documents alone,

both on the same TF-IDF matrix (sparse too).
"""

# %%
# A corpus of topics
# ------------------
import matplotlib.pyplot as plt
import numpy as np
from sklearn.decomposition import TruncatedSVD
from sklearn.feature_extraction.text import TfidfVectorizer
from sklearn.linear_model import LogisticRegression
from sklearn.model_selection import train_test_split
from sklearn.semi_supervised import LabelSpreading

from skassoc import SemiSupervisedAssociationClassifier
from skassoc.datasets import make_semi_supervised_labels


def make_corpus(n_documents=2400, n_classes=8, n_words=8000, seed=0):
    """Documents of ``n_classes`` topics as strings of words "w0", "w1", ...

    A word of a document comes from the shared vocabulary (83 %), its
    class's group (pairs of classes share one, 10 %) or its class's own
    words (7 %); documents are 20 to 200 words long.
    """
    rng = np.random.default_rng(seed)
    zipf = 1 / np.arange(1, n_words + 1) ** 1.1
    shared = zipf / zipf.sum()

    def topic():
        words = rng.choice(np.arange(50, n_words), 300, replace=False)
        weights = 1 / np.arange(1, 301)
        return words, weights / weights.sum()

    groups = [topic() for _ in range(n_classes // 2)]
    own = [topic() for _ in range(n_classes)]
    y = rng.integers(n_classes, size=n_documents)
    documents = []
    for label in y:
        length = int(np.clip(rng.lognormal(np.log(60), 0.6), 20, 200))
        source = rng.choice(3, length, p=[0.83, 0.10, 0.07])
        words = rng.choice(n_words, length, p=shared)
        for kind, (pool, weights) in ((1, groups[label // 2]), (2, own[label])):
            words[source == kind] = rng.choice(
                pool, np.count_nonzero(source == kind), p=weights
            )
        documents.append(" ".join(f"w{w}" for w in words))
    return documents, y


documents, y = make_corpus()
X = TfidfVectorizer(min_df=2, sublinear_tf=True).fit_transform(documents)
dense_mib = 4 * X.shape[0] * X.shape[1] / 2**20
stored_mib = (X.data.nbytes + X.indices.nbytes + X.indptr.nbytes) / 2**20
print(f"{X.shape[0]} documents x {X.shape[1]} words, {X.nnz / X.shape[0]:.0f} per")
print(f"document: {stored_mib:.1f} MiB stored, {dense_mib:.0f} MiB dense")

X_train, X_test, y_train, y_test = train_test_split(
    X, y, test_size=0.3, stratify=y, random_state=0
)
y_semi = make_semi_supervised_labels(y_train, 5, random_state=0)  # -1: unlabeled
labeled = y_semi != -1

# %%
# Three models on the sparse matrix
# ---------------------------------
# The estimator's defaults: ``network="auto"`` becomes ``"sparse_mlp"`` for
# sparse ``X``, and the number of steps follows the data and a CPU budget.
clf = SemiSupervisedAssociationClassifier(random_state=0).fit(X_train, y_semi)
print("network:", clf.network_, "| steps:", clf.n_iter_)

scores = {
    "skassoc (defaults)": clf.score(X_test, y_test),
    "LabelSpreading (k-NN graph)": LabelSpreading(kernel="knn", n_neighbors=10)
    .fit(X_train, y_semi)
    .score(X_test, y_test),
    "Logistic regression,\nlabeled documents only": LogisticRegression(max_iter=1000)
    .fit(X_train[labeled], y_semi[labeled])
    .score(X_test, y_test),
}
for name, score in scores.items():
    print(f"{name.replace(chr(10), ' ')}: {100 * score:.1f} %")

# %%
# What the network learned
# ------------------------
# The test documents in two dimensions: the TF-IDF rows (a truncated SVD,
# which takes sparse input) and the network's embeddings
# (:meth:`~skassoc.SemiSupervisedAssociationClassifier.transform`, a PCA of
# them). The embeddings gather the documents of a class where the TF-IDF
# rows, dominated by the shared vocabulary, mix them.
views = {
    "TF-IDF rows (SVD)": TruncatedSVD(2, random_state=0).fit_transform(X_test),
    "skassoc embeddings (SVD)": TruncatedSVD(2, random_state=0).fit_transform(
        clf.transform(X_test) - clf.transform(X_test).mean(axis=0)
    ),
}
fig, axes = plt.subplots(1, 3, figsize=(13, 4))
axes[0].barh(list(scores), [100 * s for s in scores.values()], color="tab:blue")
axes[0].set_xlabel("test accuracy %")
axes[0].invert_yaxis()
for ax, (title, points) in zip(axes[1:], views.items()):
    ax.scatter(*points.T, c=y_test, cmap="tab10", s=6)
    ax.set_title(title)
    ax.set_xticks([])
    ax.set_yticks([])
fig.tight_layout()
plt.show()

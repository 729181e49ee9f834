"""The association losses of "Learning by Association" as plain torch functions.

A labeled batch ``A`` and an unlabeled batch ``B`` are embedded by one network
(``a`` and ``b``). A walker steps from every labeled embedding to the unlabeled
ones with probabilities given by a softmax over their dot products, then steps
back. The *walker loss* rewards round trips that end in the class where they
started; the *visit loss* rewards a walk that visits every unlabeled sample.
Beyond the paper, the *consistency loss* asks the walk from an unlabeled
sample back to the labeled classes to end alike for the sample and a random
augmentation of it, and the *balance loss* asks the walks from the unlabeled
batch to end in each class as often as the class's share of the labels.

How a training step weighs and sums them is in ``skassoc._engine._loss_terms``.
"""

import torch
import torch.nn.functional as F

__all__ = [
    "association_matrices",
    "backward_transitions",
    "walker_loss",
    "visit_loss",
    "walker_class_probabilities",
    "consistency_loss",
    "balance_loss",
    "classification_loss",
    "l2_penalty",
]

# The authors' code adds this constant inside every logarithm; keeping it
# reproduces their numbers and keeps the losses finite when a probability
# underflows to zero.
LOG_EPSILON = 1e-8
#: Decay per step of the balance loss's running estimate of the class mass
#: (an average over about the last hundred batches).
CLASS_MASS_DECAY = 0.99


def association_matrices(a, b):
    """Transition probabilities of the walk between two sets of embeddings.

    Parameters
    ----------
    a : torch.Tensor of shape (n_labeled, embedding_dim)
        Embeddings of the labeled batch.
    b : torch.Tensor of shape (n_unlabeled, embedding_dim)
        Embeddings of the unlabeled batch.

    Returns
    -------
    p_ab : torch.Tensor of shape (n_labeled, n_unlabeled)
        Probability of stepping from ``a[i]`` to ``b[j]``.
    p_ba : torch.Tensor of shape (n_unlabeled, n_labeled)
        Probability of stepping from ``b[j]`` back to ``a[i]``.
    p_aba : torch.Tensor of shape (n_labeled, n_labeled)
        Probability of the round trip ``a[i] -> B -> a[k]``.

    Examples
    --------
    >>> import torch
    >>> from skassoc._engine._losses import association_matrices
    >>> a, b = torch.randn(4, 8), torch.randn(6, 8)
    >>> p_ab, p_ba, p_aba = association_matrices(a, b)
    >>> p_ab.shape, p_ba.shape, p_aba.shape
    (torch.Size([4, 6]), torch.Size([6, 4]), torch.Size([4, 4]))
    >>> torch.allclose(p_aba.sum(dim=1), torch.ones(4))
    True

    Notes
    -----
    The similarity is the raw dot product ``M = a @ b.T`` (no temperature, no
    normalisation), as in the paper. The softmaxes subtract the row maximum,
    so their exponentials do not overflow. The outputs are at least float32
    (float64 inputs stay float64), also for bf16 embeddings from autocast:
    the round-trip probabilities of a bf16 softmax are too coarse for the
    walker loss. The two matrix products are computed in float64 and
    rounded to that type, whatever the network's precision: on a GPU that
    allows TF32 (``precision="tf32"``), a float32 product would round the
    embeddings to 10-bit mantissas first, and even a true float32 product
    accumulates rounding errors beyond the final rounding. Rounding to the
    output type keeps its range, so embeddings too large for it still
    overflow and the fit stops with an error instead of training on. The
    matrices are labeled x unlabeled batch in size, so the float64 products
    cost little at the paper's batch sizes; on Apple's MPS, which has no
    float64, they are computed in float32.
    """
    match = _similarities(a, b)
    p_ab = torch.softmax(match, dim=1)
    p_ba = torch.softmax(match.T, dim=1)
    wide = _wide_dtype(p_ab)
    p_aba = (p_ab.to(wide) @ p_ba.to(wide)).to(match.dtype)
    return p_ab, p_ba, p_aba


def backward_transitions(a, b):
    """``p_ba`` of :func:`association_matrices` alone, without the other two.

    Parameters
    ----------
    a, b : torch.Tensor
        The labeled and unlabeled embeddings, as for
        :func:`association_matrices`.

    Returns
    -------
    p_ba : torch.Tensor of shape (n_unlabeled, n_labeled)
        Probability of stepping from ``b[j]`` to ``a[i]``, computed as in
        :func:`association_matrices`.

    Examples
    --------
    >>> import torch
    >>> from skassoc._engine._losses import association_matrices, backward_transitions
    >>> a, b = torch.randn(4, 8), torch.randn(6, 8)
    >>> torch.equal(backward_transitions(a, b), association_matrices(a, b)[1])
    True
    """
    return torch.softmax(_similarities(a, b).T, dim=1)


def _similarities(a, b):
    """``a @ b.T`` computed in float64 and rounded to at least float32."""
    # Raise bf16/fp16 to float32, but keep float64 (do not downcast it).
    dtype = torch.promote_types(torch.promote_types(a.dtype, b.dtype), torch.float32)
    wide = _wide_dtype(a)
    return (a.to(wide) @ b.to(wide).T).to(dtype)


def _wide_dtype(tensor):
    """float64 for the walker's products, but float32 on MPS (it has no float64)."""
    return torch.float32 if tensor.device.type == "mps" else torch.float64


def walker_loss(p_aba, labels):
    """Cross-entropy between round-trip probabilities and same-class targets.

    Parameters
    ----------
    p_aba : torch.Tensor of shape (n_labeled, n_labeled)
        Round-trip probabilities from :func:`association_matrices`.
    labels : torch.Tensor of shape (n_labeled,)
        Integer class of every labeled sample.

    Returns
    -------
    loss : torch.Tensor
        Scalar loss, averaged over the labeled samples. The target of row
        ``i`` is uniform over the samples of the class of ``i`` (itself
        included).

    Examples
    --------
    >>> import torch
    >>> from skassoc._engine._losses import walker_loss
    >>> labels = torch.tensor([0, 0, 1, 1])
    >>> perfect = torch.tensor([[0.5, 0.5, 0.0, 0.0], [0.5, 0.5, 0.0, 0.0],
    ...                         [0.0, 0.0, 0.5, 0.5], [0.0, 0.0, 0.5, 0.5]])
    >>> mixed = torch.full((4, 4), 0.25)
    >>> bool(walker_loss(perfect, labels) < walker_loss(mixed, labels))
    True
    """
    same_class = (labels[:, None] == labels[None, :]).to(p_aba.dtype)
    target = same_class / same_class.sum(dim=1, keepdim=True)
    return _cross_entropy(target, p_aba)


def visit_loss(p_ab, start_weights=None):
    """Cross-entropy between the visit probabilities and a uniform visit.

    Parameters
    ----------
    p_ab : torch.Tensor of shape (n_labeled, n_unlabeled)
        Forward transition probabilities from :func:`association_matrices`.
    start_weights : torch.Tensor of shape (n_labeled,), default=None
        How often the walk starts at each labeled sample (summing to 1).
        None starts equally often at every one, as in the paper: with as
        many labeled samples of each class, a uniform visit then asks every
        class to take an equal share of the unlabeled batch.

    Returns
    -------
    loss : torch.Tensor
        Scalar loss; smallest when every unlabeled sample is visited equally
        often, which keeps the walker from ignoring hard unlabeled samples.

    Examples
    --------
    >>> import torch
    >>> from skassoc._engine._losses import visit_loss
    >>> uniform = torch.full((2, 4), 0.25)
    >>> one_sample = torch.tensor([[1.0, 0, 0, 0], [1.0, 0, 0, 0]])
    >>> bool(visit_loss(uniform) < visit_loss(one_sample))
    True
    """
    if start_weights is None:
        p_visit = p_ab.mean(dim=0)
    else:
        # In float64, as the walker's other products.
        wide = _wide_dtype(p_ab)
        p_visit = (start_weights.to(wide) @ p_ab.to(wide)).to(p_ab.dtype)
    return -torch.log(LOG_EPSILON + p_visit).mean()


def walker_class_probabilities(p_ba, labels, n_classes):
    """Probability that a walker leaving each unlabeled sample lands in each class.

    Parameters
    ----------
    p_ba : torch.Tensor of shape (n_unlabeled, n_labeled)
        Transition probabilities from the unlabeled to the labeled
        embeddings (:func:`association_matrices`).
    labels : torch.Tensor of shape (n_labeled,)
        Integer class of every labeled sample.
    n_classes : int
        Number of classes (labels are ``0 .. n_classes - 1``).

    Returns
    -------
    probabilities : torch.Tensor of shape (n_unlabeled, n_classes)
        Row ``j`` sums the transition probabilities of ``b[j]`` over the
        labeled samples of every class; summed in float64, returned in the
        dtype of ``p_ba``.

    Examples
    --------
    >>> import torch
    >>> from skassoc._engine._losses import walker_class_probabilities
    >>> p_ba = torch.tensor([[0.5, 0.25, 0.25], [0.0, 0.0, 1.0]])
    >>> walker_class_probabilities(p_ba, torch.tensor([0, 0, 1]), 2)
    tensor([[0.7500, 0.2500],
            [0.0000, 1.0000]])
    """
    # In float64, as the walker's other products: TF32 would round the
    # probabilities to 10-bit mantissas first.
    one_hot = F.one_hot(labels, n_classes).double()
    return (p_ba.double() @ one_hot).to(p_ba.dtype)


def consistency_loss(target, prediction):
    """Cross-entropy of class probabilities against fixed target probabilities.

    Parameters
    ----------
    target : torch.Tensor of shape (n_samples, n_classes)
        Class probabilities of one view of every sample; no gradient flows
        into them (they are detached here).
    prediction : torch.Tensor of shape (n_samples, n_classes)
        Class probabilities of another view of the same samples.

    Returns
    -------
    loss : torch.Tensor
        Scalar cross-entropy, averaged over the samples; smallest when each
        prediction puts its mass where its target does.

    Examples
    --------
    >>> import torch
    >>> from skassoc._engine._losses import consistency_loss
    >>> target = torch.tensor([[1.0, 0.0]])
    >>> agree, disagree = torch.tensor([[0.9, 0.1]]), torch.tensor([[0.1, 0.9]])
    >>> bool(consistency_loss(target, agree) < consistency_loss(target, disagree))
    True
    """
    return _cross_entropy(target.detach(), prediction)


def balance_loss(class_probabilities, class_shares, class_mass=None):
    """KL divergence of ``class_shares`` from the classes' mass in the batches.

    Parameters
    ----------
    class_probabilities : torch.Tensor of shape (n_samples, n_classes)
        Where the walker from each unlabeled sample lands
        (:func:`walker_class_probabilities`).
    class_shares : torch.Tensor of shape (n_classes,)
        The share of each class expected among the unlabeled samples (e.g.
        among the labeled ones); sums to 1.
    class_mass : torch.Tensor of shape (n_classes,), default=None
        A running estimate of the classes' mass, updated here in place by
        a moving average of this batch's (over about the last hundred batches).
        The loss is then measured on it, and its gradient is that of the
        divergence at the estimate, through this batch's mass. Without it,
        the loss is that of this batch alone.

    Returns
    -------
    loss : torch.Tensor
        Scalar, 0 when the mass spreads over the classes in these shares;
        large when a class gets far less than its share.

    Examples
    --------
    >>> import torch
    >>> from skassoc._engine._losses import balance_loss
    >>> shares = torch.tensor([0.5, 0.5])
    >>> even = torch.tensor([[0.9, 0.1], [0.1, 0.9]])
    >>> one_sided = torch.tensor([[0.9, 0.1], [0.9, 0.1]])
    >>> round(float(balance_loss(even, shares)), 4)
    0.0
    >>> round(float(balance_loss(one_sided, shares)), 4)
    0.5108
    """
    mean = class_probabilities.mean(dim=0)
    shares = class_shares.to(mean.dtype)
    if class_mass is None:
        return _divergence(shares, mean)
    # A batch of a hundred samples holds each of ten classes 10 +- 3 times:
    # pushing every batch to the shares would move samples for those chance
    # excesses. The running estimate averages them out.
    with torch.no_grad():
        class_mass.mul_(CLASS_MASS_DECAY).add_((1 - CLASS_MASS_DECAY) * mean)
    estimate = class_mass.to(mean.dtype)
    # d/d(mean) of the surrogate is -shares / estimate: the divergence's
    # gradient where the estimate stands (with the log's epsilon, so that a
    # class whose mass vanishes pulls hard but finitely).
    surrogate = -(shares * mean / (LOG_EPSILON + estimate)).sum()
    return _divergence(shares, estimate) + surrogate - surrogate.detach()


def _divergence(shares, mass):
    """KL(shares || mass), with 0 log 0 = 0 and ``LOG_EPSILON`` in the log."""
    return (
        torch.special.xlogy(shares, shares) - shares * torch.log(LOG_EPSILON + mass)
    ).sum()


def _cross_entropy(target, probabilities):
    """Row-wise cross-entropy of probabilities (not logits), averaged.

    ``log(LOG_EPSILON + p)``, as the authors' code, keeps zero
    probabilities finite.
    """
    return -(target * torch.log(LOG_EPSILON + probabilities)).sum(dim=1).mean()


def classification_loss(logits, labels, weights=None):
    """Softmax cross-entropy of the labeled samples' logits.

    Parameters
    ----------
    logits : torch.Tensor of shape (n_labeled, n_classes)
        Output of the linear layer on top of the embedding.
    labels : torch.Tensor of shape (n_labeled,)
        Integer class of every labeled sample.
    weights : torch.Tensor of shape (n_labeled,), default=None
        A factor on every sample's cross-entropy (class and sample weights);
        the loss is then the mean of the weighted terms.

    Returns
    -------
    loss : torch.Tensor
        Scalar mean cross-entropy, computed in float32.

    Examples
    --------
    >>> import torch
    >>> from skassoc._engine._losses import classification_loss
    >>> logits = torch.tensor([[4.0, 0.0], [0.0, 4.0]])
    >>> round(float(classification_loss(logits, torch.tensor([0, 1]))), 4)
    0.0181
    """
    if weights is None:
        return F.cross_entropy(logits.float(), labels)
    terms = F.cross_entropy(logits.float(), labels, reduction="none")
    return (terms * weights).mean()


def l2_penalty(weights, scales):
    """Weight decay written into the loss: ``sum_k scale_k * sum(w_k**2) / 2``.

    Parameters
    ----------
    weights : sequence of torch.Tensor
        The weight tensors to penalise (biases are left out by the caller, as
        in the paper).
    scales : sequence of float
        One L2 scale per weight tensor.

    Returns
    -------
    penalty : torch.Tensor
        Scalar penalty (zero when ``weights`` is empty).

    Examples
    --------
    >>> import torch
    >>> from skassoc._engine._losses import l2_penalty
    >>> round(float(l2_penalty([torch.ones(2, 2)], [1e-3])), 6)
    0.002
    """
    penalty = None
    for weight, scale in zip(weights, scales, strict=True):
        if scale == 0:
            continue
        term = (0.5 * scale) * weight.float().pow(2).sum()
        penalty = term if penalty is None else penalty + term
    if penalty is None:
        return torch.zeros(())
    return penalty

"""The terms of a training step's loss, each registered once.

A loss term is a :class:`LossTerm` subclass registered with
:func:`register_loss_term`: its name (the key of ``history_``), the
estimator parameter that weighs it (a row of ``skassoc._params.PARAMS`` of
part ``"losses"``), whether the association losses' delay and ramp scale it,
whether it is computed at weight 0, what it needs beyond one view of the
batch (:data:`NEEDS`), and how it is computed from a :class:`StepContext`.
A step's loss (:class:`StepLoss`) is the registered terms that are on,
weighed and summed in the order of registration::

    total = scale * sum(weight * term for the association terms)
            + sum(weight * term for the other terms)

A new loss term is therefore

1. a class here, decorated with :func:`register_loss_term`;
2. its weight's row in ``PARAMS`` (``loss_weight(name, default)``, with
   ``stacked="vary"`` if stacked candidates may differ in it);
3. the constructor argument of that name and its entry in the class
   docstring (scikit-learn reads the signature; ``tests/test_params.py``
   checks both against the table), and its line in ``docs/parameters.rst``.

The training settings (``TrainingConfig.loss_weights``), the parameter
validation, the model file's parameters, the history and stacked candidates
follow from the class and the row; ``tests/test_loss_registry.py`` shows it
with a term and a row defined in the test.
"""

from dataclasses import dataclass
from functools import cached_property

import torch

from ._losses import (
    association_matrices,
    backward_transitions,
    balance_loss,
    classification_loss,
    consistency_loss,
    visit_loss,
    walker_class_probabilities,
    walker_loss,
)

__all__ = [
    "NEEDS",
    "LossTerm",
    "LOSS_TERMS",
    "register_loss_term",
    "unregister_loss_term",
    "active_terms",
    "needs_of",
    "ClassFrequencies",
    "StepContext",
    "StepLoss",
]

#: What a term may need beyond the step's single view of its batch.
NEEDS = {
    "second_view": "a second augmented copy of the unlabeled batch, embedded "
    "in the same pass (StepContext.second_view)",
    "class_frequencies": "the classes' expected shares and a running estimate "
    "of their mass, which the steps update (StepContext.frequencies)",
}


class LossTerm:
    """One term of the training loss; subclass it and register the subclass.

    Attributes
    ----------
    name : str
        The term's key in ``history_``.
    weight_param : str
        The estimator parameter that weighs it: a row of
        ``skassoc._params.PARAMS`` whose part is ``"losses"``.
    association : bool, default=True
        Whether the association losses' delay and ramp
        (``association_delay``, ``association_ramp_steps``) scale it.
    optional : bool, default=True
        Whether the step leaves it out at weight 0; the paper's terms are
        always computed, so that ``history_`` keeps them.
    needs : frozenset of str, default=frozenset()
        Keys of :data:`NEEDS`.
    """

    name = None
    weight_param = None
    association = True
    optional = True
    needs = frozenset()

    def __init_subclass__(cls, **kwargs):
        super().__init_subclass__(**kwargs)
        unknown = set(cls.needs) - set(NEEDS)
        if not isinstance(cls.name, str) or not isinstance(cls.weight_param, str):
            raise TypeError(
                f"{cls.__name__} must set the class attributes name (its "
                "history key) and weight_param (the parameter that weighs it)."
            )
        if unknown:
            raise TypeError(
                f"{cls.__name__}.needs holds {sorted(unknown)}; a loss term may "
                f"need {sorted(NEEDS)}."
            )

    def __call__(self, step):
        """The term's value (a scalar tensor) at ``step``, a :class:`StepContext`."""
        raise NotImplementedError


#: The registered terms by name, in the order the step sums them.
LOSS_TERMS = {}


def register_loss_term(term_class):
    """Register a :class:`LossTerm` subclass (an instance of it); a decorator.

    Raises
    ------
    ValueError
        If a term of that name, or weighed by that parameter, is registered.
    """
    term = term_class()
    taken = {t.weight_param for t in LOSS_TERMS.values()}
    if term.name in LOSS_TERMS or term.weight_param in taken:
        raise ValueError(
            f"A loss term named {term.name!r} or weighed by {term.weight_param!r} "
            "is registered already; give the new term a name and a parameter of "
            "its own."
        )
    LOSS_TERMS[term.name] = term
    return term_class


def unregister_loss_term(name):
    """Remove the term ``name`` from the registry (a term added at run time)."""
    del LOSS_TERMS[name]


def active_terms(*loss_weights):
    """The registered terms a step computes, in order.

    Parameters
    ----------
    *loss_weights : dict
        The weights of one fit (or of each stacked candidate), by parameter
        name; a term is on where it is not optional or one weight is
        positive.

    Raises
    ------
    ValueError
        If a registered term has no weight.

    Examples
    --------
    >>> from skassoc._engine._loss_terms import active_terms
    >>> weights = {"walker_weight": 1.0, "visit_weight": 0.0, "logit_weight": 1.0,
    ...            "consistency_weight": 0.0, "balance_weight": 2.0}
    >>> [term.name for term in active_terms(weights)]
    ['walker', 'visit', 'logit', 'balance']
    """
    terms = tuple(LOSS_TERMS.values())
    for weights in loss_weights:
        missing = [t.weight_param for t in terms if t.weight_param not in weights]
        if missing:
            raise ValueError(
                f"No weight for the loss terms weighed by {missing}: each "
                "registered loss term needs its row in skassoc._params.PARAMS "
                "(part 'losses') and the estimator parameter of that name."
            )
    return tuple(
        term
        for term in terms
        if not term.optional or any(w[term.weight_param] > 0 for w in loss_weights)
    )


def needs_of(terms):
    """The union of ``terms``' :attr:`LossTerm.needs`."""
    return frozenset().union(*(term.needs for term in terms))


@dataclass(frozen=True)
class ClassFrequencies:
    """The class frequencies that loss terms read, on the training device.

    Parameters
    ----------
    class_shares : torch.Tensor of shape (n_classes,), default=None
        The share of each class expected among the unlabeled samples (the
        balance loss's target); None where no term needs it.
    class_mass : torch.Tensor of shape (n_classes,), default=None
        The balance loss's running estimate of the class mass (see
        :func:`~skassoc._engine._losses.balance_loss`); the steps update it.
    visit_start_weights : torch.Tensor of shape (n_labeled,), default=None
        ``start_weights`` of :func:`~skassoc._engine._losses.visit_loss`.
    """

    class_shares: torch.Tensor | None = None
    class_mass: torch.Tensor | None = None
    visit_start_weights: torch.Tensor | None = None


class StepContext:
    """What the loss terms of one step read.

    The views of the batch and the walker's matrices are computed on first
    use and then shared by every term that reads them.

    Parameters
    ----------
    embeddings : torch.Tensor of shape (n_rows, d)
        The labeled samples' embeddings, then the unlabeled ones' up to row
        ``n_batch``, then (with a second view) those of the unlabeled
        samples' second copy.
    logits : torch.Tensor of shape (n_labeled, n_classes)
        The labeled samples' logits.
    labels : torch.Tensor of shape (n_labeled,)
        Their classes.
    n_batch : int
        Rows of the labeled and unlabeled batch (before the second view).
    frequencies : ClassFrequencies
    labeled_weights : torch.Tensor of shape (n_labeled,), default=None
        Factors of the labeled samples' classification losses.
    """

    def __init__(
        self, embeddings, logits, labels, n_batch, frequencies, labeled_weights=None
    ):
        self.embeddings = embeddings
        self.logits = logits
        self.labels = labels
        self.n_batch = n_batch
        self.frequencies = frequencies
        self.labeled_weights = labeled_weights

    @property
    def n_classes(self):
        return self.logits.shape[1]

    @cached_property
    def labeled(self):
        """The labeled samples' embeddings."""
        return self.embeddings[: self.labels.shape[0]]

    @cached_property
    def unlabeled(self):
        """The unlabeled samples' embeddings (the first view)."""
        return self.embeddings[self.labels.shape[0] : self.n_batch]

    @cached_property
    def second_view(self):
        """The embeddings of the unlabeled samples' second copy."""
        return self.embeddings[self.n_batch :]

    @cached_property
    def _matrices(self):
        return association_matrices(self.labeled, self.unlabeled)

    @property
    def p_ab(self):
        """Forward transitions, labeled to unlabeled (``association_matrices``)."""
        return self._matrices[0]

    @property
    def p_ba(self):
        """Backward transitions, unlabeled to labeled."""
        return self._matrices[1]

    @property
    def p_aba(self):
        """Round trips, labeled to unlabeled to labeled."""
        return self._matrices[2]

    @cached_property
    def landed(self):
        """Where the walk from each unlabeled sample lands, by class."""
        return walker_class_probabilities(self.p_ba, self.labels, self.n_classes)


class StepLoss:
    """The loss of a training step: ``terms``, weighed and summed.

    Parameters
    ----------
    terms : tuple of LossTerm
        The terms that are on (:func:`active_terms`), in registration order.
    frequencies : ClassFrequencies
        What the terms that need class frequencies read.
    """

    def __init__(self, terms, frequencies):
        self.terms = tuple(terms)
        self.frequencies = frequencies
        #: The names of the tensor a call returns.
        self.names = ("total", *(term.name for term in self.terms))
        self.needs = needs_of(self.terms)
        # Fixed with the terms: a step sums the association terms, scales
        # them, then adds the others, each group in registration order.
        self._association = [i for i, t in enumerate(self.terms) if t.association]
        self._others = [i for i, t in enumerate(self.terms) if not t.association]

    def weights(self, loss_weights):
        """The weights of :attr:`terms`, in order, from a fit's ``loss_weights``."""
        return [loss_weights[term.weight_param] for term in self.terms]

    def __call__(
        self, embeddings, logits, labels, n_batch, weights, scale, labeled_weights=None
    ):
        """The total loss, then each term, as one tensor of shape ``(len(names),)``.

        ``weights`` holds the weight of each of :attr:`terms` (floats, or a
        tensor of shape ``(len(terms),)``); ``scale`` multiplies the
        association terms (their delay and ramp). The other arguments are
        those of :class:`StepContext`.
        """
        step = StepContext(
            embeddings, logits, labels, n_batch, self.frequencies, labeled_weights
        )
        values = [term(step) for term in self.terms]
        association = None
        for index in self._association:
            weighted = weights[index] * values[index]
            association = weighted if association is None else association + weighted
        total = None if association is None else scale * association
        for index in self._others:
            weighted = weights[index] * values[index]
            total = weighted if total is None else total + weighted
        return torch.stack([total, *values])


@register_loss_term
class WalkerTerm(LossTerm):
    """The walker loss: round trips end in the class where they started."""

    name = "walker"
    weight_param = "walker_weight"
    optional = False

    def __call__(self, step):
        return walker_loss(step.p_aba, step.labels)


@register_loss_term
class VisitTerm(LossTerm):
    """The visit loss: the walks visit every unlabeled sample."""

    name = "visit"
    weight_param = "visit_weight"
    optional = False

    def __call__(self, step):
        return visit_loss(step.p_ab, step.frequencies.visit_start_weights)


@register_loss_term
class LogitTerm(LossTerm):
    """The labeled samples' classification loss, never delayed."""

    name = "logit"
    weight_param = "logit_weight"
    association = False
    optional = False

    def __call__(self, step):
        return classification_loss(step.logits, step.labels, step.labeled_weights)


@register_loss_term
class ConsistencyTerm(LossTerm):
    """Where the walk from the second copy ends should match where the walk
    from the first one ends (the target, held fixed)."""

    name = "consistency"
    weight_param = "consistency_weight"
    needs = frozenset({"second_view"})

    def __call__(self, step):
        landed = step.landed
        p_copy = backward_transitions(step.labeled, step.second_view)
        copy_landed = walker_class_probabilities(p_copy, step.labels, step.n_classes)
        return consistency_loss(landed, copy_landed)


@register_loss_term
class BalanceTerm(LossTerm):
    """The walks from the unlabeled batch end in each class as often as its share."""

    name = "balance"
    weight_param = "balance_weight"
    needs = frozenset({"class_frequencies"})

    def __call__(self, step):
        frequencies = step.frequencies
        return balance_loss(
            step.landed, frequencies.class_shares, frequencies.class_mass
        )

"""The loss every training and evaluation path computes: each client's weighted
cross-entropy over its batch, and the per-client (loss, accuracy) of evaluation.

:func:`per_sample_loss` is every sample's cross-entropy, what the weighted forms
and the algorithms that weigh samples themselves (FedeRiCo, FedFomo, FedC2I,
FedEM, FedProto) start from. :func:`cross_entropy` is the one definition of a
client's loss. Its forms differ only in the order
of float operations, and each path keeps its order, so that results stay bit for
bit the same from one version to the next; sums over a batch's samples are
:func:`padded_sum`, so that a client's loss does not depend on how much padding
its batch carries (that is, on the clients sharing its rank):

- weighted (``w`` given): ``sum_b w_b CE_b / n`` with ``n = max(sum_b w_b, 1)``,
  summed first and divided after; ``n`` may be given instead (a per-sample-weighted
  step divides by its sample count). The grouped conv, vmap and per-row autograd
  paths and evaluation.
- plain mean (``w`` None): torch's own mean reduction over the batch, equal to
  the weighted form with all weights one. The per-client loop's plain step.
- closed form (``grad=True``): each sample's share ``w_b / n`` applied before the
  sum, from ``log_softmax``, returning with the loss its gradient with respect to
  the logits, ``(softmax - onehot(y)) w_b / n``: for hand-written backwards (the
  stacked MLP kernel, :mod:`mpifl.train.mlp`).
"""

from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F


def cross_entropy(logits: torch.Tensor, y: torch.Tensor, w: torch.Tensor | None = None, *,
                  n: float | torch.Tensor | None = None, bias: torch.Tensor | None = None,
                  grad: bool = False) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """Weighted mean cross-entropy of logits ``[..., b, C]`` against labels
    ``y [..., b]`` with sample weights ``w [..., b]`` (zero on padding): a loss per
    leading index ``[...]``. ``bias [..., C]`` is added to every sample's logits
    first (a logit adjustment such as FedRoD's balanced softmax); its gradient
    with respect to the logits keeps its form. Forms: see the module docstring."""
    if bias is not None:
        logits = logits + bias.unsqueeze(-2)
    if grad:
        share = (w / w.sum(-1, keepdim=True).clamp_min(1.0)).unsqueeze(-1)  # [..., b, 1]
        logp = torch.log_softmax(logits, -1)
        yi = y.unsqueeze(-1)
        loss = -padded_sum((logp.gather(-1, yi) * share).squeeze(-1), -1)
        # d(sum of the losses)/d logits = (softmax - onehot(y)) * w / n, in place
        dz = logp.exp_()
        dz.scatter_add_(-1, yi, torch.full_like(yi, -1.0, dtype=dz.dtype))
        dz.mul_(share)
        return loss, dz
    if w is None:
        return F.cross_entropy(logits, y)
    ce = per_sample_loss(logits, y)
    return padded_sum(ce * w, -1) / (w.sum(-1).clamp_min(1.0) if n is None else n)


def per_sample_loss(logits: torch.Tensor, y: torch.Tensor, dim: int = -1) -> torch.Tensor:
    """Cross-entropy of every sample, shaped as the labels ``y [...]``: logits
    ``[..., C]`` (``dim=-1``), or ``[m, C, n]`` against ``y [m, n]`` (``dim=1``).
    The forms are torch's row form over the flattened samples and its N-d form;
    their log-softmax adds in different orders, so each caller keeps the form its
    results were made with (FedEM's E-step the N-d one)."""
    if dim == 1:
        return F.cross_entropy(logits, y, reduction="none")
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), y.reshape(-1), reduction="none").view(y.shape)


def padded_sum(t: torch.Tensor, dim: int) -> torch.Tensor:
    """Sum over the sample dimension ``dim``, whose padding (weight 0) is trailing
    zeros, to the same bits however wide the padding is. torch's sum vectorises
    along a contiguous dimension and its order of additions changes with the
    length, so a client's loss would depend on the clients sharing its batch, hence
    on how many clients its rank hosts. cumsum adds left to right (in double on the
    CPU), and trailing zeros add nothing. Integer-valued sums (counts) are exact
    with ``sum`` and need no such care."""
    if t.shape[dim] == 0:  # no sample at all: the empty sum
        return t.sum(dim)
    return t.cumsum(dim).select(dim, -1)


def _accuracy(scores: torch.Tensor, y: torch.Tensor, w: torch.Tensor) -> np.ndarray:
    correct = (scores.argmax(-1) == y).float()
    return ((correct * w).sum(1) / w.sum(1).clamp_min(1.0)).cpu().numpy()


def loss_acc(logits: torch.Tensor, y: torch.Tensor, w: torch.Tensor) -> tuple[np.ndarray, np.ndarray]:
    """Per-row mean loss (:func:`cross_entropy`) and accuracy of ``[m, b, C]``
    logits over weighted samples."""
    return cross_entropy(logits, y, w).cpu().numpy(), _accuracy(logits, y, w)


def loss_acc_from_probs(probs: torch.Tensor, y: torch.Tensor, w: torch.Tensor) -> tuple[np.ndarray, np.ndarray]:
    """As :func:`loss_acc` for mixtures given as probabilities ``[m, b, C]``."""
    nll = -torch.log(probs.clamp_min(1e-12)).gather(-1, y[..., None]).squeeze(-1)
    return (padded_sum(nll * w, 1) / w.sum(1).clamp_min(1.0)).cpu().numpy(), _accuracy(probs, y, w)

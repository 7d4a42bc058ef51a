"""Local training and evaluation of the clients a rank hosts, on one
``[n_local, P]`` parameter matrix.

A model is only a template: weights live in the rows, so exchanging a client's
model is sending a contiguous row, and many clients train at once. Batched, a
plain MLP trains through stacked ``bmm`` (:mod:`.mlp`), a plain conv net through
grouped convolutions (:mod:`.grouped`), any other model through
``torch.func.vmap`` (:mod:`.rowmodel`; a BatchNorm model with each client's
running statistics), a block of clients taking each step together
(:mod:`.batched`). The per-client path (:mod:`.loop`) is a plain torch loop on
the template bound to one client's rows at a time. Both draw the same batches
(:mod:`.plan`), compute the same loss (:mod:`.loss`) and apply the same optimizer
arithmetic (:mod:`.optimizer`), so they agree to float tolerance; under
``train.batched=auto`` a non-MLP model takes whichever path a timing at the
start of the run finds faster (:meth:`Clients.measure_paths`, bench/README.md).

==================  ==============================================================
``layout``          where each parameter and buffer sits in a row (:class:`Layout`)
``rows``            selecting a block of rows, storing an update of them back
``loss``            per-sample and weighted cross-entropy of every path; (loss, accuracy)
``optimizer``       SGD / Adam on stacked rows (:class:`RowOptimizer`)
``plan``            each client's batches from its own random stream
``objective``       an algorithm's extra loss terms or its own step
``mlp``             stacked MLP forward and hand-written backward
``grouped``         conv nets of many clients by grouped convolutions
``rowmodel``        logits and gradients of rows: vmap, BatchNorm, row by row
``batched``         the batched training path (a block of clients per step)
``loop``            the per-client training path
``evaluation``      loss and accuracy of each client on its own split
``clients``         :class:`Clients`: the rows, optimizer state, data, entry points
==================  ==============================================================
"""

from .clients import Clients, NonFiniteError
from .layout import Layout, Part
from .loss import cross_entropy, loss_acc, loss_acc_from_probs, per_sample_loss
from .mlp import stacked_forward, stacked_mlp
from .objective import Objective, Step, StepView
from .optimizer import RowOptimizer
from .plan import BatchPlan
from .rowmodel import RowModel
from .rows import Rows, read_rows, rows_selector, write_back

__all__ = ["BatchPlan", "Clients", "Layout", "NonFiniteError", "Objective", "Part", "RowModel", "RowOptimizer", "Rows",
           "Step", "StepView", "cross_entropy", "loss_acc", "loss_acc_from_probs", "per_sample_loss", "read_rows",
           "rows_selector", "stacked_forward", "stacked_mlp", "write_back"]

"""Local training and evaluation of the clients a rank hosts, on one
``[n_local, P]`` parameter matrix.

A model is only a template: weights live in the rows, so exchanging a client's
model is sending a contiguous row, and many clients train at once. What training
changes is a value, :class:`Rows` (parameters, buffers, optimizer state). An
:class:`Engine` computes the rows' logits and gradients: batched, a plain MLP
through stacked ``bmm`` (:class:`StackedMLP`), a plain conv net through grouped
convolutions (:class:`GroupedConv`), any other model through ``torch.func.vmap``
(:class:`Vmap`; a BatchNorm model with each client's running statistics), a block
of clients taking each step together (:mod:`.batched`); else row by row
(:class:`RowByRow`). The per-client path (:mod:`.loop`) is a plain torch loop on
the template bound to one client's rows at a time. Both draw the same batches
(:mod:`.plan`), compute the same loss (:mod:`.loss`) and apply the same optimizer
arithmetic (:mod:`.optimizer`), so they agree to float tolerance; under
``train.batched=auto`` a non-MLP model takes whichever path a timing at the
start of the run finds faster (:meth:`Clients.measure_paths`, bench/README.md).

==================  ==============================================================
``layout``          where each parameter and buffer sits in a row (:class:`Layout`)
``rows``            :class:`Rows`; selecting rows, storing them back, putting them back
``loss``            per-sample and weighted cross-entropy of every path; (loss, accuracy)
``optimizer``       SGD / Adam on stacked rows (:class:`RowOptimizer`)
``plan``            each client's batches from its own random stream
``objective``       an algorithm's extra loss terms or its own step (on a view of the rows)
``engine``          the interface of the four engines below (:class:`Engine`)
``mlp``             stacked MLP forward and hand-written backward
``grouped``         conv nets of many clients by grouped convolutions
``rowmodel``        the model as a function of a row; vmap (BatchNorm too), row by row
``batched``         the batched training path (a block of clients per step)
``loop``            the per-client training path
``evaluation``      loss and accuracy of each client on its own split
``clients``         :class:`Clients`: the rows, optimizer state, data, entry points
``head``            a model's body/head split inside a row (:func:`find_head`), for the
                    methods that share or train one part (it reads the layout: engine side)
==================  ==============================================================
"""

from mpifl.train.clients import Clients, NonFiniteError
from mpifl.train.engine import Engine
from mpifl.train.grouped import GroupedConv
from mpifl.train.layout import Layout, Part
from mpifl.train.loss import cross_entropy, loss_acc, loss_acc_from_probs, per_sample_loss
from mpifl.train.mlp import StackedMLP, stacked_forward, stacked_mlp
from mpifl.train.objective import Objective, Step, StepView
from mpifl.train.optimizer import RowOptimizer
from mpifl.train.plan import BatchPlan
from mpifl.train.rowmodel import RowByRow, RowModel, Vmap
from mpifl.train.rows import Rows, read_rows, rows_selector, write_back

__all__ = ["BatchPlan", "Clients", "Engine", "GroupedConv", "Layout", "NonFiniteError", "Objective", "Part",
           "RowByRow", "RowModel", "RowOptimizer", "Rows", "StackedMLP", "Step", "StepView", "Vmap", "cross_entropy",
           "loss_acc", "loss_acc_from_probs", "per_sample_loss", "read_rows", "rows_selector", "stacked_forward",
           "stacked_mlp", "write_back"]

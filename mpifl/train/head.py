"""The split of every model into a body (feature extractor) and a head (the
classifier: the model's last ``nn.Linear``), inside a flat parameter row.

Methods that share one part and keep the other (FedRep, FedRoD), aggregate the
parts differently (FedC2I) or work on the body's embeddings (FedProto, kNN-Per)
take the split from here: :func:`find_head` finds the classifier's slices in the
row and checks on a probe input that the model's output really is that layer
applied to the body's flat features.
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import torch
from torch import nn
from torch.func import functional_call, vmap

from mpifl.errors import ConfigError
from mpifl.train.clients import Clients
from mpifl.train.mlp import stacked_forward


@dataclass
class Head:
    """The classifier (the model's last ``nn.Linear``) inside a parameter row."""

    weight: slice  # W [C, d] in the row
    bias: slice | None  # b [C] in the row, None when the layer has no bias
    n_classes: int
    dim: int  # feature width d
    names: tuple[str, ...]  # its parameter names
    features: Callable[..., torch.Tensor]  # (row, x, bufs=None) -> phi(x), the model without its head
    # an MLP ending in the head: the layers before it in Clients.stacked's form,
    # so the features of m rows are m-batched matmuls instead of vmap; else None
    body: list[tuple[str, ...]] | None = None
    # the model with its head replaced by nn.Identity: differentiable features of
    # per-parameter tensors through functional_call (FedProto's prototype loss)
    module: nn.Module | None = None

    @property
    def width(self) -> int:
        """Length of one class row v_c: [W_c, b_c]."""
        return self.dim + (self.bias is not None)

    def rows(self, params: torch.Tensor) -> torch.Tensor:
        """``[m, P]`` parameter rows -> ``[m, C, D]`` classifier rows."""
        m = params.shape[0]
        v = params[:, self.weight].reshape(m, self.n_classes, self.dim)
        if self.bias is not None:
            v = torch.cat([v, params[:, self.bias].reshape(m, self.n_classes, 1)], dim=2)
        return v

    def put(self, params: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        """Write classifier rows ``v [m, C, D]`` into ``params`` (in place); returns it."""
        out = params
        out[:, self.weight] = v[..., :self.dim].reshape(len(out), -1)
        if self.bias is not None:
            out[:, self.bias] = v[..., self.dim]
        return out

    def features_of(self, c: Clients, rows: torch.Tensor, x: torch.Tensor,
                    local: np.ndarray | None = None) -> torch.Tensor:
        """``[m, b, d]`` features of batch ``x[i]`` under row i's body. ``local``: the
        clients whose BatchNorm statistics row i uses (default: rows are the rank's
        clients in order)."""
        with torch.no_grad():
            if self.body is not None:
                return stacked_forward(self.body, c.parts(rows), x)
            if c.rows_at_once:  # BatchNorm: each client its own statistics
                return vmap(self.features)(rows, x)
            local = np.arange(len(rows)) if local is None else local
            bufs = [c.buffers[k] if c.layout.B else None for k in local]
            return torch.stack([self.features(rows[i], x[i], bufs[i]) for i in range(len(rows))])

    def forward_parts(self, params: dict[str, torch.Tensor], x: torch.Tensor,
                      bufs: dict[str, torch.Tensor] | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """(features, logits) of one client's per-parameter tensors ``params`` (and
        BatchNorm buffers ``bufs``) on ``x``, differentiable (through :attr:`module`):
        FedProto's and MOON's losses on the features."""
        body = {k: v for k, v in params.items() if k not in self.names}
        if bufs is not None:
            body.update(bufs)
        h = functional_call(self.module, body, (x,))
        z = h @ params[self.names[0]].T
        return h, (z + params[self.names[1]] if len(self.names) > 1 else z)

    def logits(self, h: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        """Logits ``[m, b, C]`` of features ``h [m, b, d]`` under classifier rows
        ``v [m, C, width]`` (:meth:`rows`)."""
        z = torch.bmm(h, v[..., :self.dim].transpose(1, 2))
        return z + v[:, None, :, self.dim] if self.bias is not None else z


def find_head(clients: Clients, model_name: str, algorithm: str) -> Head:
    """Split the model into feature extractor and classifier at its last nn.Linear,
    and check on a probe input that the output really is that layer's."""
    model = clients.model
    layout = clients.layout
    linears = [(n, m) for n, m in model.named_modules() if isinstance(m, nn.Linear)]
    if not linears:
        raise ConfigError(f"model.name={model_name!r} is not allowed with {algorithm}: it has no nn.Linear classifier")
    name, lin = linears[-1]
    wname = f"{name}.weight"
    bname = f"{name}.bias" if lin.bias is not None else None
    fmodel = copy.deepcopy(model).eval()
    parent, _, leaf = name.rpartition(".")
    setattr(fmodel.get_submodule(parent) if parent else fmodel, leaf, nn.Identity())
    names = (wname,) + ((bname,) if bname else ())

    def features(flat: torch.Tensor, x: torch.Tensor, bufs: torch.Tensor | None = None) -> torch.Tensor:
        state = {k: v for k, v in layout.unflatten(flat).items() if k not in names}
        if bufs is not None and layout.B:
            state.update(layout.unflatten_buffers(bufs))
        return functional_call(fmodel, state, (x,))

    head = Head(weight=layout.slices([wname])[0], bias=layout.slices([bname])[0] if bname else None,
                n_classes=lin.out_features, dim=lin.in_features, names=names, features=features,
                body=_mlp_body(clients.stacked, wname), module=fmodel)
    gen = torch.Generator().manual_seed(0)
    probe = torch.randn(3, *clients.data.in_shape, generator=gen).to(clients.device)
    with torch.no_grad():
        model.eval()
        row = clients.init[None]
        h = features(clients.init, probe)
        v = head.rows(row)[0]
        ok = h.dim() == 2 and h.shape[1] == head.dim and lin.out_features == clients.n_classes
        if ok:
            z = h @ v[:, :head.dim].T + (v[:, head.dim] if head.bias is not None else 0)
            ok = torch.allclose(z, model(probe), atol=1e-4, rtol=1e-4)
        if ok and head.body is not None and not torch.allclose(
                stacked_forward(head.body, clients.parts(row), probe[None])[0], h, atol=1e-5, rtol=1e-5):
            head.body = None  # not the plain MLP it looked like: keep the functional path
    if not ok:
        raise ConfigError(f"model.name={model_name!r} is not allowed with {algorithm}: its output must be its last "
                          f"nn.Linear ({name!r}) applied to flat features")
    return head


def _mlp_body(ops: list[tuple[str, ...]] | None, head_weight: str) -> list[tuple[str, ...]] | None:
    """The layers before the head of an MLP whose last layer is the head, or None."""
    if ops and ops[-1][0] == "linear" and ops[-1][1] == head_weight:
        return ops[:-1]
    return None


def body_slices(c: Clients, head: Head) -> list[slice]:
    """Row slices of every parameter outside the head."""
    return c.slices([n for n in c.param_names if n not in head.names])

"""How an algorithm's ``State`` dataclass marks its fields for checkpoints.

A field made with :func:`per_client` holds one row (or list item) per local
client: each rank saves its own rows, keyed by client id, so a run resumes on
any number of ranks. A :func:`transient` field lives within one round (or is
derived by ``init``) and is not saved. Every other field must be identical on
all ranks and is saved once, by rank 0 (``mpifl.run.checkpoint``).
"""

from __future__ import annotations

import dataclasses
from typing import Any

PER_CLIENT = "per_client"
TRANSIENT = "transient"


def per_client(**kwargs: Any) -> Any:
    """A State field whose first axis (or list index) is this rank's clients."""
    return dataclasses.field(metadata={PER_CLIENT: True}, **kwargs)


def transient(**kwargs: Any) -> Any:
    """A State field that lives within one round (not checkpointed)."""
    return dataclasses.field(metadata={TRANSIENT: True}, **kwargs)


def saved_fields(state: Any) -> tuple[list[str], list[str]]:
    """(per-client field names, replicated field names) a checkpoint saves."""
    if state is None or not dataclasses.is_dataclass(state):
        return [], []
    rows, glob = [], []
    for f in dataclasses.fields(state):
        if not f.metadata.get(TRANSIENT):
            (rows if f.metadata.get(PER_CLIENT) else glob).append(f.name)
    return rows, glob

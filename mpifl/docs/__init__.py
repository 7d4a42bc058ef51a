"""The documentation's generated parts, so that docs cannot drift from the code.

``python -m mpifl.docs [--check | --write]``: :mod:`.blocks` (the generated
blocks of README and the pages), :mod:`.sync` (numbers and figures the docs quote
from mpifl's own output, made again: ``python -m mpifl.docs.sync``) and
:mod:`.counts` (the docs' counts and quoted results checked against their sources).
"""

"""Sweeps: a grid of runs from one file, run here or submitted to SLURM.

``python -m mpifl.sweep SWEEP.yaml [--dry-run | --submit | --local | --status]``.
The parts: :mod:`.spec` (what a sweep is, read from its file), :mod:`.select`
(which points a command acts on), :mod:`.slurm` (job scripts and submission),
:mod:`.local` (running points on this machine), :mod:`.driver` and
:mod:`.worker` (what concurrent local drivers share, and the warm worker),
:mod:`.status` (where a sweep stands) and :mod:`.cli` (the command line).
"""

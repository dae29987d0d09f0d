"""What-if sweeps: a grid of ``simulate`` runs on local processes or a Ray cluster.

``pagedkv sweep GRID`` (:mod:`pagedkv.sweep.cli`) runs every point of a grid of
``simulate`` options (:mod:`~pagedkv.sweep.grid`), each an independent simulation
(:mod:`~pagedkv.sweep.point`), on a backend (:mod:`~pagedkv.sweep.backends`: local
processes; :mod:`~pagedkv.sweep.ray_backend`: Ray), keeps each result under a hash of its
inputs (:mod:`~pagedkv.sweep.cache`), and writes rows with cost and SLO columns
(:mod:`~pagedkv.sweep.rows`) and the cost / TTFT p99 Pareto front
(:mod:`~pagedkv.sweep.pareto`). :func:`run_sweep` does it all from Python.
"""

from pagedkv.sweep.backends import LocalBackend, Outcome
from pagedkv.sweep.grid import Grid, grid_from_mapping, load_grid_file
from pagedkv.sweep.rows import Slo, load_prices
from pagedkv.sweep.runner import SweepResult, SweepSpec, run_sweep

__all__ = ["Grid", "LocalBackend", "Outcome", "Slo", "SweepResult", "SweepSpec",
           "grid_from_mapping", "load_grid_file", "load_prices", "run_sweep"]

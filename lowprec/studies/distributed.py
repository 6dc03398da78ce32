"""Independent units of a study, run in one process or spread over processes (issue 18).

A study is a list of :class:`Unit`: independent pieces of work (one scheme on one synthetic
workload, one tau of a restart sweep, one scheme's perplexity run on one window length, one
claims study...), each named by a key (a tuple of strings and ints) and computed by a function
without arguments.  :func:`run_units` runs them and returns ``{key: result}``; a study builds its
report from that dict alone, so the report does not depend on which process computed a unit.

Spreading over processes (``torch.distributed``, one process per GPU)::

    torchrun --nproc-per-node 4 -m lowprec.studies.distributed --quick --out run1
    # = lowprec study --distributed --quick --out run1, in each of 4 processes

* **The split** (:func:`share`): every rank builds the same list of units from the same
  arguments, in the same order; rank ``r`` of ``N`` computes units ``r, r + N, r + 2N, ...``
  (round-robin over the plan).  Deterministic, and consecutive units of one kind (the schemes
  of one workload, the taus of a sweep) go to different ranks, which spreads kinds of very
  different cost.
* **The gathering**: ``torch.distributed.gather_object`` brings each rank's ``{key: result}`` to
  rank 0, which merges them in plan order, builds the report, prints it and writes the files;
  the other ranks return None.  The results are Python objects on the host, so the process
  group uses the ``gloo`` backend (on GPU machines too: NCCL would stage every object through
  a GPU for nothing).
* **Threads**: each rank limits Numba and torch to ``cpu_count // local ranks`` threads
  (:func:`init`), so N processes share the cores instead of oversubscribing them.  lowprec's
  kernels give the same bits for any thread count; torch's own CPU kernels (the float32 parts
  of the real models) are not documented to, so for a bit-for-bit comparison of model studies
  give the one-process run the same ``torch.set_num_threads``.
* **Where the work runs**: where the one-process study runs it (the synthetic workloads are
  NumPy arrays, the real models load on the CPU); each rank's current CUDA device is its own
  GPU (``LOCAL_RANK``), so GPU work in a study lands on one GPU per process.

``torchrun`` starts the processes and sets ``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``,
``LOCAL_WORLD_SIZE``, ``MASTER_ADDR`` and ``MASTER_PORT``, which :func:`init` reads.
"""

from __future__ import annotations

import datetime
import os
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

#: torchrun's variables that :func:`init` needs
ENV = ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")
#: how long a collective waits for the slowest rank: a full study runs for hours, and a rank
#: that finished its share waits in the gather for the others (torchrun stops every process
#: when one fails, so nothing hangs for that long)
TIMEOUT = datetime.timedelta(days=7)


@dataclass(frozen=True)
class Unit:
    """One independent piece of a study.

    Attributes:
        key: a tuple of strings and ints naming the unit, unique in its study (the result's
            key in :func:`run_units`' dict).
        run: computes the result (a picklable object: dicts, lists, floats, NumPy arrays).
    """

    key: tuple
    run: Callable[[], Any]


@dataclass(frozen=True)
class Plan:
    """A study (or a part of one) as units and the function that builds its result from them.

    Attributes:
        units: the :class:`Unit` s, in plan order.
        assemble: ``{key: result}`` of the units -> the study's result.
    """

    units: list
    assemble: Callable[[dict], Any]

    def run(self, group: Group | None = None, *, progress: bool = False,
            desc: str = "units"):
        """The result, computed over ``group`` (:func:`run_units`): on rank 0, None on the
        others."""
        res = run_units(self.units, group, progress=progress, desc=desc)
        return None if res is None else self.assemble(res)


@dataclass(frozen=True)
class Group:
    """The processes a study is spread over (:func:`init`); ``Group()`` is one process.

    Attributes:
        rank, size: this process's rank and the number of processes.
        local_rank, local_size: the same on this machine (torchrun's ``LOCAL_RANK``,
            ``LOCAL_WORLD_SIZE``).
        backend: the ``torch.distributed`` backend (None for one process).
        threads: Numba and torch threads of each process (None: left as they were).
    """

    rank: int = 0
    size: int = 1
    local_rank: int = 0
    local_size: int = 1
    backend: str | None = None
    threads: int | None = None

    @property
    def main(self) -> bool:
        """Whether this is rank 0 (the one that builds and writes the report)."""
        return self.rank == 0

    def gather(self, obj) -> list | None:
        """Every rank's ``obj`` on rank 0 (in rank order); None on the other ranks."""
        if self.size == 1:
            return [obj]
        import torch.distributed as dist

        out = [None] * self.size if self.main else None
        dist.gather_object(obj, out, dst=0)
        return out

    def barrier(self) -> None:
        """Wait until every rank gets here."""
        if self.size > 1:
            import torch.distributed as dist

            dist.barrier()


#: one process, nothing to gather
SINGLE = Group()


def share(n: int, rank: int, size: int) -> range:
    """The indices of the units rank ``rank`` of ``size`` computes out of ``n``: round-robin.

    Example:
        >>> list(share(7, 1, 3))
        [1, 4]
    """
    if size < 1 or not 0 <= rank < size:
        raise ValueError(f"rank {rank} of {size} processes: need 0 <= rank < size")
    return range(rank, n, size)


def run_units(units: Sequence[Unit], group: Group | None = None, *, progress: bool = False,
              desc: str = "units", seconds: dict | None = None) -> dict | None:
    """Run this process's share of ``units`` (all of them in one process) and gather.

    Args:
        units: the study's units, in plan order (the same list on every rank).
        group: the processes (:func:`init`); None or :data:`SINGLE` for this one alone.
        progress: a tqdm bar over this rank's units.
        desc: the bar's label.
        seconds: a dict to receive ``{key: seconds}`` of every unit (rank 0: all of them).

    Returns:
        ``{key: result}`` of every unit in plan order on rank 0; None on the other ranks.

    Raises:
        ValueError: two units with the same key.
    """
    from .main import _bar

    group = SINGLE if group is None else group
    keys = [u.key for u in units]
    if len(set(keys)) != len(keys):
        dup = sorted({str(k) for k in keys if keys.count(k) > 1})
        raise ValueError(f"units with the same key: {', '.join(dup)}")
    mine = [units[i] for i in share(len(units), group.rank, group.size)]
    label = desc if group.size == 1 else f"{desc} (rank {group.rank} of {group.size})"
    bar = _bar(len(mine), label, progress)
    results, times = {}, {}
    for u in mine:
        bar.set_postfix_str(" ".join(str(p) for p in u.key))
        t0 = time.perf_counter()
        results[u.key] = u.run()
        times[u.key] = time.perf_counter() - t0
        bar.update()
    bar.close()
    parts = group.gather((results, times))
    if parts is None:
        return None
    merged, merged_t = {}, {}
    for res, t in parts:
        merged.update(res)
        merged_t.update(t)
    if seconds is not None:
        seconds.update({k: merged_t[k] for k in keys})
    return {k: merged[k] for k in keys}


def init(backend: str = "gloo", *, threads: int | None = None,
         timeout: datetime.timedelta = TIMEOUT) -> Group:
    """Join the process group that ``torchrun`` started (``torch.distributed``).

    Sets this process's current CUDA device to GPU ``LOCAL_RANK`` (modulo the GPUs present)
    when there are GPUs, and limits Numba and torch to ``threads`` threads (default:
    ``cpu_count // LOCAL_WORLD_SIZE``, at least 1).

    Args:
        backend: the ``torch.distributed`` backend (``"gloo"``: the study exchanges Python
            objects on the host).
        threads: threads per process (None: the share of the cores above).
        timeout: how long a collective waits (:data:`TIMEOUT`).

    Returns:
        The :class:`Group`.

    Raises:
        ValueError: torchrun's variables (:data:`ENV`) are missing.
    """
    missing = [v for v in ENV if v not in os.environ]
    if missing:
        raise ValueError(f"--distributed runs under torchrun, which sets {', '.join(ENV)} "
                         f"({', '.join(missing)} not set): torchrun --nproc-per-node N -m "
                         "lowprec.studies.distributed [lowprec study options]")
    import torch
    import torch.distributed as dist

    if not dist.is_initialized():
        dist.init_process_group(backend, timeout=timeout)
    rank, size = dist.get_rank(), dist.get_world_size()
    local_rank = int(os.environ.get("LOCAL_RANK", rank))
    local_size = int(os.environ.get("LOCAL_WORLD_SIZE", size))
    if torch.cuda.is_available():
        torch.cuda.set_device(local_rank % torch.cuda.device_count())
    if threads is None:
        threads = max(1, (os.cpu_count() or 1) // max(1, local_size))
    set_threads(threads)
    return Group(rank, size, local_rank, local_size, dist.get_backend(), threads)


def set_threads(n: int) -> None:
    """Limit Numba's and torch's thread pools of this process to ``n`` threads (Numba's to
    at most its ``NUMBA_NUM_THREADS``)."""
    import numba
    import torch

    numba.set_num_threads(max(1, min(int(n), numba.config.NUMBA_NUM_THREADS)))
    torch.set_num_threads(max(1, int(n)))


def finish(group: Group) -> None:
    """Leave the process group (after the last collective)."""
    if group.size > 1 or group.backend is not None:
        import torch.distributed as dist

        if dist.is_initialized():
            dist.destroy_process_group()


def main(argv: list[str] | None = None) -> int:
    """``torchrun --nproc-per-node N -m lowprec.studies.distributed [options]``: ``lowprec
    study --distributed [options]`` in each process (the options of ``lowprec study``)."""
    from ..cli import main as cli_main

    args = sys.argv[1:] if argv is None else list(argv)
    return cli_main(["study", "--distributed", *args])


__all__ = ["Unit", "Plan", "Group", "SINGLE", "share", "run_units", "init", "set_threads", "finish",
           "main", "TIMEOUT", "ENV"]


if __name__ == "__main__":  # pragma: no cover - run by torchrun
    sys.exit(main())

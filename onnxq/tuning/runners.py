"""Where trials run: in this process, on a local process pool, or on a Ray cluster.

Every runner takes a list of `Job`s and calls ``done(index, result)`` as each finishes (in any
order); the results are the same whichever runner computes them (one onnxruntime thread per
trial, the same code). The process pool uses the ``spawn`` start method (a fork of a process
that has run onnxruntime may deadlock), so a callable budget must be picklable (a module-level
function) when ``workers > 1``. The Ray runner puts the `Context` - the model's bytes, the
inputs and the float outputs - once in Ray's object store and submits one task per trial.
"""

from __future__ import annotations

import concurrent.futures
import multiprocessing
import pickle
import socket
from collections.abc import Callable, Sequence
from typing import Any, Protocol

from onnxq.tuning.trials import Context, Job, init_worker, run_job

__all__ = ["LocalRunner", "RayRunner", "Runner", "make_runner"]

Done = Callable[[int, dict[str, float]], None]


class Runner(Protocol):
    """Runs trials."""

    workers: int

    def map(self, jobs: Sequence[Job], done: Done) -> None:
        """Run ``jobs``, calling ``done(index, result)`` for each as it finishes."""

    def close(self) -> None:
        """Release the workers."""


class LocalRunner:
    """Trials in this process (``workers == 1``) or on a pool of ``workers`` processes."""

    def __init__(self, ctx: Context, workers: int) -> None:
        """Start the pool (workers build their evaluator once, from ``ctx``)."""
        self.ctx = ctx
        self.workers = workers
        self.pool: concurrent.futures.ProcessPoolExecutor | None = None
        if workers > 1:
            try:
                pickle.dumps(ctx.budget)
            except Exception as err:
                raise ValueError(
                    f"the budget's metric cannot be sent to worker processes ({err}); use a "
                    "module-level function, or workers=1"
                ) from None
            self.pool = concurrent.futures.ProcessPoolExecutor(
                max_workers=workers,
                mp_context=multiprocessing.get_context("spawn"),
                initializer=init_worker,
                initargs=(ctx,),
            )

    def map(self, jobs: Sequence[Job], done: Done) -> None:
        """Run ``jobs`` here or on the pool."""
        if self.pool is None:
            for i, job in enumerate(jobs):
                done(i, run_job(job, self.ctx))
            return
        futures = {self.pool.submit(run_job, job): i for i, job in enumerate(jobs)}
        try:
            for future in concurrent.futures.as_completed(futures):
                done(futures[future], future.result())
        except BaseException:
            for future in futures:
                future.cancel()
            raise

    def close(self) -> None:
        """Stop the pool."""
        if self.pool is not None:
            self.pool.shutdown(wait=True, cancel_futures=True)
            self.pool = None


def _ray_trial(ctx: Context, job: Job) -> dict[str, float]:
    """The Ray task: one trial (each Ray worker keeps its evaluator between tasks)."""
    return run_job(job, ctx)


def check_address(address: str, timeout: float) -> None:
    """Refuse quickly a Ray address ``host:port`` (or ``ray://host:port``) that does not answer.

    Raises:
        ValueError: nothing accepts a connection there within ``timeout`` seconds.
    """
    where = address.removeprefix("ray://")
    host, sep, port = where.rpartition(":")
    if not sep or not port.isdigit():
        return  # "auto" and other forms: ray.init decides
    try:
        with socket.create_connection((host.strip("[]"), int(port)), timeout=timeout):
            pass
    except OSError as err:
        raise ValueError(
            f"Ray address {address!r} does not answer ({err.strerror or err}); start the "
            "cluster (`ray start --head`) or check the address"
        ) from None


class RayRunner:
    """Trials as Ray tasks, one per trial, on the cluster at ``address``."""

    def __init__(self, ctx: Context, address: str | None, timeout: float = 10.0) -> None:
        """Connect (or use the Ray already initialised here) and put ``ctx`` in the store.

        ``address``: ``host:port`` or ``ray://host:port`` of a running cluster, ``auto`` (the
        cluster this machine belongs to), ``local`` or None (start Ray on this machine).

        Raises:
            ValueError: ray is not installed, or the address does not answer.
        """
        try:
            import ray
        except ImportError:
            raise ValueError("--ray needs the ray package: pip install 'onnxq[ray]'") from None
        self.ray = ray
        self.started = False
        if not ray.is_initialized():
            if address not in (None, "local", "auto"):
                check_address(address, timeout)
            try:
                ray.init(
                    address=None if address in (None, "local") else address,
                    log_to_driver=False,
                    include_dashboard=False,
                )
            except Exception as err:
                raise ValueError(
                    f"Ray address {address!r} does not answer ({str(err).splitlines()[0][:200]})"
                ) from None
            self.started = True
        self.workers = max(int(ray.cluster_resources().get("CPU", 1)), 1)
        self.ctx_ref = ray.put(ctx)  # the model bytes and inputs, once
        self.task = ray.remote(num_cpus=1)(_ray_trial)

    def map(self, jobs: Sequence[Job], done: Done) -> None:
        """Submit one task per job and collect them as they finish."""
        ray = self.ray
        refs = [self.task.remote(self.ctx_ref, job) for job in jobs]
        index = {ref: i for i, ref in enumerate(refs)}
        pending = list(refs)
        try:
            while pending:
                ready, pending = ray.wait(pending, num_returns=1)
                done(index[ready[0]], ray.get(ready[0]))
        except BaseException:
            for ref in pending:
                ray.cancel(ref)
            raise

    def close(self) -> None:
        """Shut Ray down if this runner started it."""
        if self.started:
            self.ray.shutdown()
            self.started = False


def make_runner(ctx: Context, workers: int, ray: Any = None) -> Runner:
    """A `RayRunner` when ``ray`` is an address (or True: local), else a `LocalRunner`."""
    if ray is None or ray is False:
        return LocalRunner(ctx, workers)
    return RayRunner(ctx, None if ray is True else str(ray))

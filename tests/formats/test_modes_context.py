"""`onnxq.defaults` blocks are private to their thread and their asyncio task."""

from __future__ import annotations

import asyncio
import threading

import onnxq
from onnxq.formats.modes import RoundMode


def test_a_thread_does_not_see_another_threads_defaults() -> None:
    inside, seen = threading.Event(), []

    def other() -> None:
        inside.wait(timeout=10)
        seen.append(onnxq.current_defaults().round_mode)

    worker = threading.Thread(target=other)
    worker.start()
    with onnxq.defaults(round_mode="stochastic"):
        inside.set()
        worker.join(timeout=10)
        assert onnxq.current_defaults().round_mode is RoundMode.STOCHASTIC
    assert seen == [RoundMode.EVEN]


def test_asyncio_tasks_keep_their_own_defaults() -> None:
    async def task(mode: str, seed: int) -> tuple[RoundMode, int]:
        with onnxq.defaults(round_mode=mode, seed=seed):
            await asyncio.sleep(0.01)  # the other task enters its block meanwhile
            d = onnxq.current_defaults()
            return d.round_mode, d.seed

    async def both() -> list[tuple[RoundMode, int]]:
        return list(await asyncio.gather(task("away", 1), task("zero", 2)))

    assert asyncio.run(both()) == [(RoundMode.AWAY, 1), (RoundMode.ZERO, 2)]
    assert onnxq.current_defaults().round_mode is RoundMode.EVEN

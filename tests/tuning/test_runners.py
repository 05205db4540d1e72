"""Trials on a local process pool and on Ray give the same search as in one process."""

from __future__ import annotations

import pytest

from onnxq.tuning import tune
from tests.tuning import synthetic

BUDGET = "sqnr>=28.8"


@pytest.fixture(scope="module")
def local() -> dict:
    return tune(synthetic.model(), synthetic.samples(), BUDGET).report


def _same(a: dict, b: dict) -> None:
    assert a["layers"] == b["layers"]
    assert a["bits_per_weight"] == b["bits_per_weight"]
    assert a["search"] == b["search"] and a["held_out"] == b["held_out"]
    assert [p["search"] for p in a["frontier"]] == [p["search"] for p in b["frontier"]]


def test_process_pool_matches_one_process(local: dict) -> None:
    pooled = tune(synthetic.model(), synthetic.samples(), BUDGET, workers=2).report
    assert pooled["runner"] == "2 worker(s)"
    _same(local, pooled)


def test_ray_matches_the_local_run(local: dict) -> None:
    ray = pytest.importorskip("ray")
    started = not ray.is_initialized()
    if started:
        ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    try:
        remote = tune(synthetic.model(), synthetic.samples(), BUDGET, ray=True).report
    finally:
        if started:
            ray.shutdown()
    assert remote["runner"].startswith("ray")
    _same(local, remote)


def test_a_ray_address_that_does_not_answer_is_refused_quickly() -> None:
    from onnxq.tuning.runners import check_address

    with pytest.raises(ValueError, match="does not answer"):
        check_address("127.0.0.1:1", timeout=2.0)  # port 1: nothing listens

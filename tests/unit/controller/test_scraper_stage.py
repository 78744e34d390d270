"""The scraper and spec.cache's download pod: while a job is Pending, its running download pod's GET /progress (the
trainer image's own server, grpo_trainer/stage.py, on a loopback port here) becomes JobView.stage_progress and kicks
the job once per change; the pod index gives the download pod an endpoint of its own role, never scraped as a
trainer."""

from __future__ import annotations

from typing import Any

import pytest

from grpo_operator.controller.pod_entry import pod_entry
from grpo_operator.controller.scraper import ProgressScraper
from grpo_operator.lifecycle import progress as progress_mod
from grpo_operator.render import initializer
from grpo_operator.rules import validation
from grpo_trainer import contract, stage
from tests.support.cluster.util import free_port
from tests.support.jobs import job_body

KEY = ("ns", "job")
RECORD = {"event": "progress", "item": "model org/tiny@main", "bytes": 120_000, "totalBytes": 380_000, "files": 2,
          "totalFiles": 6}


def stage_pod_doc(port: int, phase: str = "Running") -> dict[str, Any]:
    body = job_body("job")  # a Hub model and dataset
    body["spec"]["cache"] = {"volumeClaimName": "hf"}
    res = validation.validate(body)
    assert res.valid and res.job is not None, res.summary()
    pod = initializer.initializer_pod(res.job, "ns", uid="u", metrics_port=port)
    pod["status"] = {"phase": phase, "podIP": "127.0.0.1"}
    return pod


@pytest.fixture
def served():
    stage._Latest.line = ""  # the record a test before this one emitted in this process (the server is process-wide)
    port = free_port()
    server = stage.serve_progress(port)
    assert server is not None
    yield port
    server.shutdown()
    server.server_close()


def test_the_download_pod_has_an_endpoint_of_its_own_role(served: int) -> None:
    entry = pod_entry(stage_pod_doc(served))
    assert entry is not None
    key, (info, ep) = entry
    assert key == ("ns", "job") and info.role == contract.ROLE_INITIALIZER
    assert ep is not None and ep.role == contract.ROLE_INITIALIZER and ep.running
    assert ep.url == f"http://127.0.0.1:{served}{contract.STAGE_PROGRESS_PATH}"
    assert progress_mod.stage_endpoint([ep]) == ep
    assert progress_mod.endpoints_to_scrape([ep], 0, None) == []  # never read as a trainer's /metrics
    _, (_, done) = pod_entry(stage_pod_doc(served, "Succeeded"))  # type: ignore[misc]
    assert progress_mod.stage_endpoint([done]) is None


@pytest.mark.asyncio
async def test_a_pending_jobs_download_progress_is_scraped_and_kicks_once_per_change(served: int) -> None:
    jobs: dict[Any, dict[str, Any]] = {KEY: {"metadata": {"name": "job"}, "status": {"phase": "Pending"}}}
    _, (_, ep) = pod_entry(stage_pod_doc(served))  # type: ignore[misc]
    endpoints = [ep]
    kicks: list[Any] = []
    scraper = ProgressScraper(2.0, jobs, lambda key: list(endpoints), kicks.append, lambda key, delay: None)
    try:
        await scraper.scrape_running_jobs()  # the pod serves nothing yet (before its first record)
        assert scraper.stage_progress(KEY) is None and kicks == []

        stage.emit(RECORD, out=lambda line: None)
        await scraper.scrape_running_jobs()
        assert scraper.stage_progress(KEY) == RECORD and kicks == [KEY]
        await scraper.scrape_running_jobs()  # no news: no kick
        assert kicks == [KEY]
        stage.emit({**RECORD, "bytes": 380_000, "files": 6}, out=lambda line: None)
        await scraper.scrape_running_jobs()
        assert scraper.stage_progress(KEY)["files"] == 6 and kicks == [KEY, KEY]  # type: ignore[index]

        endpoints.clear()  # the pod finished: its record is forgotten
        await scraper.scrape_running_jobs()
        assert scraper.stage_progress(KEY) is None and kicks == [KEY, KEY]
        endpoints.append(ep)
        await scraper.scrape_running_jobs()
        jobs[KEY]["status"]["phase"] = "Running"  # the trainers run: staging is over
        await scraper.scrape_running_jobs()
        assert scraper.stage_progress(KEY) is None
    finally:
        await scraper.close()

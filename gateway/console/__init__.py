"""The web console (docs/console.md): GET /console, its JSON under /console/api, its static
files under /console/static; and the offline /docs and /redoc."""

from __future__ import annotations

from dataclasses import dataclass, field

from fastapi import FastAPI
from fastapi.staticfiles import StaticFiles

from tide_fleet.gateway.console import batches, fleet, jobs, pages
from tide_fleet.gateway.console.offline_docs import install_docs
from tide_fleet.gateway.console.rates import ArrivalRates
from tide_fleet.gateway.console.worker_stats import WorkerScraper


@dataclass
class ConsoleState:
    """Per gateway process: the workers' scraped figures and the arrival-rate window."""

    scraper: WorkerScraper = field(default_factory=WorkerScraper)
    rates: ArrivalRates = field(default_factory=ArrivalRates)


def install_console(app: FastAPI) -> None:
    app.state.console = ConsoleState()
    for module in (pages, fleet, jobs, batches):
        app.include_router(module.router)
    app.mount("/console/static", StaticFiles(directory=pages.STATIC), name="console-static")
    install_docs(app)

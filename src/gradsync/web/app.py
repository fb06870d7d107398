"""The web server of ``gradsync serve``: the page and the JSON API it uses.

API (all JSON; errors are 4xx with {"detail": message}, never a 500):

- ``GET /api/presets``: topologies and algorithms (every registered one) the page offers.
- ``POST /api/simulate``: body {algorithm, topology, workers (2-64), size, bandwidth?, latency?,
  components?, eps?, fail?: {device, at (0-1 of the collective's time)}} -> topology with
  layout, every transfer (src, dst, round, op, offset, count, inputs carried, start, done, path),
  time, busbw, CERAR's predicted error, and the failure's outcome.
- ``GET /api/schedule?algorithm=&workers=&elements=``: the schedule itself (gradsync.schedule/1).
- ``GET /api/compare?size=``: time against workers per algorithm, simulated and closed form.
"""

from __future__ import annotations

import json
from importlib import resources
from typing import Literal

from fastapi import FastAPI, HTTPException, Query, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import HTMLResponse, JSONResponse, Response
from pydantic import BaseModel, ConfigDict, Field

from .. import algorithms
from ..errors import GradsyncError
from ..topology import PRESETS
from ..units import parse_size
from . import view

MAX_BODY_BYTES = 16 * 1024
MAX_SIZE_BYTES = 4 * 10**9
TOPOLOGIES = ("ring", "pcie-switch-4", "p3.16xlarge", "dgx-2", "ethernet", "lowbw-cluster")
STATIC = {"app.js": "text/javascript", "style.css": "text/css"}


class Failure(BaseModel):
    model_config = ConfigDict(extra="forbid")
    device: int = Field(ge=0, le=63)
    at: float = Field(ge=0.0, le=1.0, allow_inf_nan=False)


class SimulateRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")
    algorithm: str = Field(default="ring", max_length=40)      # checked against the registry per request
    topology: Literal[TOPOLOGIES] = "ring"
    workers: int = Field(default=8, ge=2, le=64)
    size: str | int = "160MB"
    bandwidth: str | float | None = None
    latency: str | float | None = None
    components: int | None = Field(default=None, ge=1, le=256)
    eps: float | None = Field(default=None, gt=0, lt=1, allow_inf_nan=False)
    fail: Failure | None = None


def _size(text) -> int:
    size = parse_size(text)
    if not 4 <= size <= MAX_SIZE_BYTES:
        raise GradsyncError(f"size must be between 4 B and {MAX_SIZE_BYTES / 1e9:g} GB, got {text!r}")
    return size


def create_app() -> FastAPI:
    """The ASGI app: ``uvicorn.run(create_app(), host="127.0.0.1")``."""
    app = FastAPI(title="gradsync", docs_url=None, redoc_url=None, openapi_url="/api/openapi.json")

    @app.middleware("http")
    async def limit_body(request: Request, call_next):
        length = request.headers.get("content-length")
        if length is not None and (not length.isdigit() or int(length) > MAX_BODY_BYTES):
            return JSONResponse({"detail": f"request body over {MAX_BODY_BYTES} bytes"}, status_code=413)
        return await call_next(request)

    @app.exception_handler(GradsyncError)
    async def bad_input(request: Request, exc: GradsyncError):
        return JSONResponse({"detail": str(exc)}, status_code=400)

    @app.exception_handler(RequestValidationError)
    async def invalid(request: Request, exc: RequestValidationError):
        # One readable line per problem; the raw input is not echoed (it may not even be JSON,
        # like Infinity).
        parts = [f"{'.'.join(str(p) for p in e['loc'][1:]) or 'body'}: {e['msg']}" for e in exc.errors()[:5]]
        return JSONResponse({"detail": "; ".join(parts)}, status_code=422)

    @app.get("/", response_class=HTMLResponse)
    def page():
        return resources.files("gradsync.web").joinpath("static/index.html").read_text()

    @app.get("/static/{name}")
    def static(name: str):
        if name not in STATIC:
            raise HTTPException(404, f"no static file {name!r}")
        return Response(resources.files("gradsync.web").joinpath(f"static/{name}").read_text(), media_type=STATIC[name])

    @app.get("/api/presets")
    def presets():
        return {"topologies": list(TOPOLOGIES), "algorithms": list(algorithms.names()),
                "fixed_workers": {name: len(PRESETS[name]().workers) for name in TOPOLOGIES
                                  if name not in ("ring", "ethernet")}}

    @app.post("/api/simulate")
    def simulate_view(req: SimulateRequest):
        fail = (req.fail.device, req.fail.at) if req.fail else None
        data = view.simulation(req.algorithm, req.topology, req.workers, _size(req.size), req.bandwidth,
                               req.latency, req.components, req.eps, fail)
        # encoded once: FastAPI's default walks every number of the timeline in Python first
        return Response(json.dumps(data), media_type="application/json")

    @app.get("/api/schedule")
    def schedule(algorithm: str = Query("ring", max_length=40), workers: int = Query(8, ge=1, le=64),
                 elements: int = Query(64, ge=0, le=10**7)):
        s = algorithms.build(algorithm, workers, elements)
        if len(s.transfers) > view.MAX_TRANSFERS:
            raise GradsyncError(f"{len(s.transfers)} transfers: at most {view.MAX_TRANSFERS}")
        return s.to_dict()

    @app.get("/api/compare")
    def compare(size: str = Query("160MB", max_length=40)):
        return view.comparison(_size(size))

    return app

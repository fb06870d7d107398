"""The web server of ``gradsync serve``: the page and the JSON API it uses.

API (all JSON; errors are 4xx with {"detail": message}, never a 500):

- ``GET /api/presets``: topologies and algorithms (every registered one) the page offers.
- ``POST /api/simulate``: body {algorithm, topology, workers (2-64), size, bandwidth?, latency?,
  components?, eps?, fail?: {device, at (0-1 of the collective's time), detection? ("crash" |
  "stall"), check_every_s?, timeout_s? (the runtime's by default)}} -> topology with its
  drawing, every transfer (src, dst, round, op, offset, count, inputs carried, start, done,
  route: an index into ``routes``, each route's node indices once), the chunks, one sentence per round, the algorithm's explanation, time, busbw,
  CERAR's error and whether it would be refused, and the failure's outcome and recovery.
- ``GET /api/schedule?algorithm=&workers=&elements=``: the schedule itself (gradsync.schedule/1).
- ``GET /api/compare?size=&topology=&bandwidth=&latency=&components=&eps=&algorithm=&compression=``:
  time against workers, simulated and closed form, for one algorithm or all, with the codec.

Every request's work is bounded: workers, transfers, CERAR's components, and 1 s of computing
(past it the answer is 202 {"pending": true, "detail"} with Retry-After, while the work
finishes in the background and is cached for the next ask). Bodies are limited to 16 KB
however they are sent; responses are valid JSON (never Infinity or NaN).
"""

from __future__ import annotations

import json
from importlib import resources
from typing import Annotated, Literal

from fastapi import FastAPI, HTTPException, Query, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import HTMLResponse, JSONResponse, Response
from pydantic import BaseModel, ConfigDict, Field, StrictFloat, StrictInt, StrictStr

from .. import algorithms
from ..errors import GradsyncError
from ..units import parse_size
from . import view
from .failures import MODES, detection_defaults, failure

MAX_BODY_BYTES = 16 * 1024
MAX_SIZE_BYTES = 4 * 10**9
TOPOLOGIES = view.TOPOLOGIES
STATIC = {f.name: "text/css" if f.name.endswith(".css") else "text/javascript"         # the page's own files only
          for f in resources.files("gradsync.web").joinpath("static").iterdir()
          if f.name.endswith((".js", ".css")) and f.name not in ("model.js", "site.js")}


class Failure(BaseModel):
    model_config = ConfigDict(extra="forbid")
    device: StrictInt = Field(ge=0, le=63)
    at: float = Field(ge=0.0, le=1.0, allow_inf_nan=False)
    detection: Literal[MODES] = "crash"                                       # how it fails, how it is found
    check_every_s: float | None = Field(default=None, ge=0.0, le=10.0, allow_inf_nan=False)
    timeout_s: float | None = Field(default=None, gt=0.0, le=1e6, allow_inf_nan=False)


class SimulateRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")
    algorithm: StrictStr = Field(default="ring", max_length=40)      # checked against the registry per request
    topology: Literal[TOPOLOGIES] = "ring"
    workers: StrictInt = Field(default=8, ge=2, le=64)
    size: Annotated[StrictStr, Field(max_length=40)] | StrictInt = "160MB"
    bandwidth: Annotated[StrictStr, Field(max_length=40)] | StrictFloat | StrictInt | None = None
    latency: Annotated[StrictStr, Field(max_length=40)] | StrictFloat | StrictInt | None = None
    components: StrictInt | None = Field(default=None, ge=1, le=192)
    eps: float | None = Field(default=None, gt=0, lt=1, allow_inf_nan=False)
    fail: Failure | None = None
    compression: StrictStr | None = Field(default=None, max_length=60)   # a codec's text, checked per request


def _json(data) -> Response:
    # encoded once: FastAPI's default walks every number of the timeline in Python first
    try:
        return Response(json.dumps(data, allow_nan=False), media_type="application/json")
    except ValueError:   # an infinite or undefined time: the inputs were out of any useful range
        raise GradsyncError("the result is not a finite number: bandwidth or latency out of range") from None


class BodyLimit:
    """Refuse request bodies over ``limit`` bytes with 413, whether sent with a length or in
    chunks (a chunked body has no content-length to check up front): the body is read here,
    at most ``limit`` bytes of it, before the app sees any."""

    def __init__(self, app, limit: int):
        self.app, self.limit = app, limit

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        length = dict(scope.get("headers") or []).get(b"content-length")
        if length is not None and (not length.isdigit() or int(length) > self.limit):
            return await self._refuse(send)
        messages, seen = [], 0
        while True:
            message = await receive()
            messages.append(message)
            if message["type"] != "http.request":
                break
            seen += len(message.get("body", b""))
            if seen > self.limit:
                return await self._refuse(send)
            if not message.get("more_body", False):
                break
        queued = iter(messages)

        async def replay():
            return next(queued, None) or await receive()

        await self.app(scope, replay, send)

    async def _refuse(self, send):
        body = json.dumps({"detail": f"request body over {self.limit} bytes"}).encode()
        await send({"type": "http.response.start", "status": 413,
                    "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]})
        await send({"type": "http.response.body", "body": body})


def _size(text) -> int:
    size = parse_size(text)
    if not 4 <= size <= MAX_SIZE_BYTES:
        raise GradsyncError(f"size must be between 4 B and {MAX_SIZE_BYTES / 1e9:g} GB, got {text!r}")
    return size


def create_app() -> FastAPI:
    """The ASGI app: ``uvicorn.run(create_app(), host="127.0.0.1")``."""
    app = FastAPI(title="gradsync", docs_url=None, redoc_url=None, openapi_url="/api/openapi.json")

    app.add_middleware(BodyLimit, limit=MAX_BODY_BYTES)
    _answer_errors(app)
    _serve_page(app)
    _serve_api(app)
    return app


def _answer_errors(app: FastAPI) -> None:
    """Bad input is a 400, work still running a 202, a malformed request a 422: never a 500."""

    @app.exception_handler(GradsyncError)
    async def bad_input(request: Request, exc: GradsyncError):
        return JSONResponse({"detail": str(exc)}, status_code=400)

    @app.exception_handler(view.Busy)
    async def busy(request: Request, exc: view.Busy):
        return JSONResponse({"pending": True, "detail": str(exc)}, status_code=202, headers={"Retry-After": "1"})

    @app.exception_handler(RequestValidationError)
    async def invalid(request: Request, exc: RequestValidationError):
        # One readable line per problem; the raw input is not echoed (it may not even be JSON,
        # like Infinity).
        parts = [f"{'.'.join(str(p) for p in e['loc'][1:]) or 'body'}: {e['msg']}" for e in exc.errors()[:5]]
        return JSONResponse({"detail": "; ".join(parts)}, status_code=422)


def _serve_page(app: FastAPI) -> None:
    """The page and its static files."""

    @app.get("/", response_class=HTMLResponse)
    def page():
        return resources.files("gradsync.web").joinpath("static/index.html").read_text()

    @app.get("/static/{name}")
    def static(name: str):
        if name not in STATIC:
            raise HTTPException(404, f"no static file {name!r}")
        return Response(resources.files("gradsync.web").joinpath(f"static/{name}").read_text(), media_type=STATIC[name])


def _serve_api(app: FastAPI) -> None:
    """The JSON API of the module docstring."""

    @app.get("/api/presets")
    def presets():
        return {"topologies": list(TOPOLOGIES), "algorithms": list(algorithms.names()),
                "fixed_workers": {name: view.fixed_workers(name) for name in TOPOLOGIES if view.fixed_workers(name)},
                "explanations": {name: algorithms.get(name).explanation for name in algorithms.names()},
                "max_components_per_worker": view.MAX_COMPONENTS_PER_WORKER,
                "compressions": list(view.COMPRESSIONS), "detection": detection_defaults()}

    @app.post("/api/simulate")
    def simulate_view(req: SimulateRequest):
        fail = (req.fail.device, req.fail.at) if req.fail else None
        out = view.simulation(req.algorithm, req.topology, req.workers, _size(req.size), req.bandwidth,
                              req.latency, req.components, req.eps, fail, req.compression or None)
        f = req.fail
        if f and out.get("failure") and (f.detection != "crash" or f.check_every_s is not None or f.timeout_s is not None):
            # the view works out a crash with the runtime's parameters; another detection is
            # worked out here from the same timeline (the cached answer is not changed)
            again = failure(out["transfers"], f.device, f.at * out["time_s"], f.detection, f.check_every_s, f.timeout_s)
            out = {**out, "failure": {**again, "recovery": out["failure"]["recovery"]}}
        return _json(out)

    @app.get("/api/schedule")
    def schedule(algorithm: str = Query("ring", max_length=40), workers: int = Query(8, ge=1, le=64),
                 elements: int = Query(64, ge=0, le=10**7)):
        s = algorithms.build(algorithm, workers, elements)
        if len(s.transfers) > view.MAX_TRANSFERS:
            raise GradsyncError(f"{len(s.transfers)} transfers: at most {view.MAX_TRANSFERS}")
        return s.to_dict()

    @app.get("/api/compare")
    def compare(size: str = Query("160MB", max_length=40), topology: Literal[TOPOLOGIES] = "pcie-switch-4",
                bandwidth: str | None = Query(None, max_length=40), latency: str | None = Query(None, max_length=40),
                components: int | None = Query(None, ge=1, le=192), eps: float | None = Query(None, gt=0, lt=1),
                algorithm: str | None = Query(None, max_length=40), compression: str | None = Query(None, max_length=60)):
        chosen = None if algorithm is None else (algorithms.get(algorithm).name,)
        return _json(view.comparison(_size(size), topology, bandwidth or None, latency or None, components, eps, chosen,
                                     compression or None))

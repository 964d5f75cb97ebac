"""The web page's routes: ``/ui`` and ``/ui/`` (the page), ``/ui/static/NAME`` (its script, style and icon files, from
``static/`` in the package) and ``/ui/api/plan?model=NAME`` (how the model would load here, and whether it can
chat: ``plan.py``).

Every page response carries a strict Content-Security-Policy (``CSP``): scripts, styles and requests only
from the server's own origin, no inline script, no plugins, no framing; the page renders model text as text
(``static/md.js`` builds DOM nodes, never HTML strings).
"""

from __future__ import annotations

from pathlib import Path

from fastapi import FastAPI
from starlette.responses import FileResponse, JSONResponse, Response

from localrun.errors import ModelNotFoundError
from localrun.server.models import ModelRegistry
from localrun.server.web.plan import plan_summary

STATIC = Path(__file__).with_name("static")
CSP = ("default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' data: blob:; connect-src 'self'; "
       "font-src 'self'; object-src 'none'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'")
HEADERS = {"Content-Security-Policy": CSP, "X-Content-Type-Options": "nosniff", "Referrer-Policy": "no-referrer",
           "X-Frame-Options": "DENY", "Cache-Control": "no-cache"}
TYPES = {".html": "text/html; charset=utf-8", ".js": "text/javascript; charset=utf-8",
         ".css": "text/css; charset=utf-8", ".svg": "image/svg+xml"}


def static_files() -> dict[str, Path]:
    """The files ``/ui/static/`` serves: name → path (only these: no path from the URL reaches the disk)."""
    return {p.name: p for p in STATIC.iterdir() if p.is_file() and p.suffix in TYPES and p.name != "index.html"}


def register(app: FastAPI, reg: ModelRegistry) -> None:
    files = static_files()

    @app.api_route("/ui", methods=["GET", "HEAD"])
    @app.api_route("/ui/", methods=["GET", "HEAD"])
    async def page() -> Response:
        """The web page (``static/index.html``), at ``/ui`` and ``/ui/`` alike (its files' URLs are absolute)."""
        return FileResponse(STATIC / "index.html", media_type=TYPES[".html"], headers=HEADERS)

    @app.api_route("/ui/static/{name}", methods=["GET", "HEAD"])
    async def static(name: str) -> Response:
        path = files.get(name)
        if path is None:
            return Response("not found", status_code=404, media_type="text/plain", headers=HEADERS)
        return FileResponse(path, media_type=TYPES[path.suffix], headers=HEADERS)

    @app.get("/ui/api/plan")
    async def plan(model: str | None = None) -> JSONResponse:
        """How ``model`` (a name from ``/v1/models``; none: the default model) loads on this server: its
        resident's plan, else the loader's plan now (nothing is loaded) → ``plan.plan_summary``'s JSON.
        Raises ModelNotFoundError (404)."""
        from starlette.concurrency import run_in_threadpool

        key = await (reg.names.resolve_strict(model) if model else reg.names.resolve(None))
        r = reg.residents.get(key)
        if r is not None:
            planned = r.planned
            p = r.state.options.plan
            body = plan_summary(r.model_id, key, p, fits=True, reasons=planned.reasons if planned else [],
                                hardware=r.state.options.hardware, resident=True,
                                chat_template=bool(r.state.engine.has_chat_template))
        elif reg.loader is None:
            raise ModelNotFoundError(model or key, hint="this server serves only the models it was started with")
        else:
            planned = await run_in_threadpool(reg.loader.plan, key, None, reg.residency.used().vram_by_gpu)
            fits = planned.fits and reg.residency.budget.fits(planned.need, 1)
            body = plan_summary(model or key, key, planned.plan, fits=fits, reasons=planned.reasons,
                                hardware=planned.hardware, resident=False,
                                chat_template=getattr(planned.prepared, "has_chat_template", None))
        return JSONResponse(body)

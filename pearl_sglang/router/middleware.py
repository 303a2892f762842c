"""Cross-cutting HTTP concerns: typed errors to JSON, authentication, body limits.

No handler ever answers a bare 500: a ``RouterError`` or a worker's failure becomes its
answer (``answers.py``: its own 4xx/5xx JSON, a worker's 4xx as it came), an aiohttp HTTP
exception (unknown path, wrong method) keeps its status with a JSON body,
and anything unexpected is logged and answered 500 with a JSON message.
"""
from __future__ import annotations

import asyncio
import hmac
import json
import logging
from typing import Awaitable, Callable

from aiohttp import web

from pearl_sglang import fastjson
from pearl_sglang.router.answers import answer_for
from pearl_sglang.router.errors import RouterError, Unauthorized
from pearl_sglang.router.limits import decoded_too_deep
from pearl_sglang.workers.errors import WorkerError

log = logging.getLogger("pearl.router")
Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]

ADMIN = "admin"
INFERENCE = "inference"
PUBLIC = "public"


def error_response(status: int, message: str, kind: str) -> web.Response:
    return web.json_response({"error": {"message": message, "type": kind, "code": status}}, status=status)


@web.middleware
async def errors_middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
    try:
        return await handler(request)
    except (RouterError, WorkerError) as e:
        return answer_for(e).response()
    except web.HTTPRequestEntityTooLarge as e:
        return error_response(413, f"body exceeds the limit ({e.text})", "limit_max_body_bytes")
    except web.HTTPException as e:
        if e.status < 400:
            raise
        return error_response(e.status, e.reason or "error", e.reason.lower().replace(" ", "_"))
    except json.JSONDecodeError as e:
        return error_response(400, f"malformed JSON: {e}", "invalid_json")
    except Exception:  # noqa: BLE001 - last line of defence, logged with traceback
        log.exception("unhandled error on %s %s", request.method, request.path)
        return error_response(500, "internal router error (see router log)", "internal_error")


def _token(request: web.Request) -> str | None:
    auth = request.headers.get("Authorization", "")
    if auth.startswith("Bearer "):
        return auth[len("Bearer "):].strip()
    return request.headers.get("X-Api-Key")


def _matches(given: str | None, expected: str) -> bool:
    # Header bytes that are not UTF-8 arrive as surrogates: compare their raw bytes.
    return given is not None and hmac.compare_digest(given.encode(errors="surrogateescape"), expected.encode())


def auth_middleware(*, admin_token: str | None, api_key: str | None,
                    access: Callable[[web.Request], str]) -> Callable:
    """``access(request)`` names the route's class; admin routes always need the admin
    token (when none is configured, they are refused: the cluster cannot be reshaped by
    anonymous callers), inference routes need the API key when one is set."""

    @web.middleware
    async def middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
        kind = access(request)
        given = _token(request)
        if kind == ADMIN:
            if admin_token is None:
                raise Unauthorized("admin endpoints are disabled: start the router with an admin token",
                                   kind="admin_disabled")
            if not _matches(given, admin_token):
                raise Unauthorized("missing or wrong admin token (Authorization: Bearer ...)")
        elif kind == INFERENCE and api_key is not None:
            if not (_matches(given, api_key) or (admin_token and _matches(given, admin_token))):
                raise Unauthorized("missing or wrong API key (Authorization: Bearer ...)")
        return await handler(request)

    return middleware


async def read_json(request: web.Request) -> object:
    """The body as JSON, refused with a 400 when it is not JSON or nests deeper than
    ``max_json_depth``: a deep body must never reach code that recurses over it."""
    return _decode(request, await _read_raw(request))


async def read_generate_json(request: web.Request) -> tuple[object, bool]:
    """Like ``read_json``, and whether the body's ``input_ids`` is one flat array already
    validated (``EncodedIds``, see ``ids_body``): a rollout turn's."""
    from pearl_sglang.router.ids_body import parse_ids_body
    from pearl_sglang.router.state import ROUTER

    raw = await _read_raw(request)
    limit = request.app[ROUTER].config.limits.max_json_depth
    fast = parse_ids_body(raw, too_deep=lambda text, body: decoded_too_deep(text, body, limit))
    if fast is not None:
        return fast, True
    return _decode(request, raw), False


async def _read_raw(request: web.Request) -> bytes:
    from pearl_sglang.router.errors import BadRequest, RequestTimeout
    from pearl_sglang.router.state import ROUTER

    ctype = request.headers.get("Content-Type", "application/json")
    if "json" not in ctype:
        raise BadRequest(f"Content-Type must be application/json, got {ctype!r}")
    try:
        if request.content.is_eof():  # all of it arrived with the head: nothing to wait for
            raw = await request.read()
        else:
            timeout_s = request.app[ROUTER].config.connections.body_timeout_s
            try:
                raw = await asyncio.wait_for(request.read(), timeout_s)
            except asyncio.TimeoutError:
                raise RequestTimeout(f"the body did not arrive within {timeout_s:.0f}s") from None
    except web.RequestPayloadError as e:  # e.g. a Content-Encoding the body does not decode by
        raise BadRequest(f"the body could not be read: {e.__cause__ or e}") from e
    if not raw.strip():
        raise BadRequest("the body is empty; a JSON object is required")
    return raw


def _decode(request: web.Request, raw: bytes) -> object:
    from pearl_sglang.router.errors import BadRequest
    from pearl_sglang.router.state import ROUTER

    try:
        body = fastjson.loads(raw)
    except (ValueError, UnicodeDecodeError) as e:
        kind = "limit_max_json_depth" if "depth" in str(e) else "invalid_json"
        raise BadRequest(f"malformed JSON: {e}", kind=kind) from e
    limit = request.app[ROUTER].config.limits.max_json_depth
    if decoded_too_deep(raw, body, limit):
        raise BadRequest(f"the JSON body nests deeper than max_json_depth={limit}", kind="limit_max_json_depth")
    return body

"""Cross-cutting HTTP concerns: typed errors to JSON, authentication, body limits.

No handler ever answers a bare 500: a ``RouterError`` or a worker's failure becomes its
answer (``answers.py``: its own 4xx/5xx JSON, a worker's 4xx as it came), an aiohttp HTTP
exception (unknown path, wrong method) keeps its status with a JSON body,
and anything unexpected is logged and answered 500 with a JSON message (``error_answer``,
which the ``/generate`` lane answers by too; it shares the body decoding and the API-key
check as well).
"""
from __future__ import annotations

import asyncio
import hmac
import json
import logging
from typing import Awaitable, Callable, Mapping

from aiohttp import web

from pearl_sglang import fastjson
from pearl_sglang.router.answers import Answer, answer_for
from pearl_sglang.router.errors import Unauthorized
from pearl_sglang.router.limits import decoded_too_deep

log = logging.getLogger("pearl.router")
Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]

ADMIN = "admin"
INFERENCE = "inference"
PUBLIC = "public"


def error_document(status: int, message: str, kind: str) -> dict:
    return {"error": {"message": message, "type": kind, "code": status}}


def error_response(status: int, message: str, kind: str) -> web.Response:
    return web.json_response(error_document(status, message, kind), status=status)


def error_answer(error: Exception, what: str) -> Answer:
    """What a client gets for ``error``, raised while serving ``what`` (``METHOD /path``):
    its entry in the answers table, a 400 for malformed JSON, else a logged 500."""
    answer = answer_for(error)
    if answer is not None:
        return answer
    if isinstance(error, json.JSONDecodeError):
        return Answer(400, error_document(400, f"malformed JSON: {error}", "invalid_json"))
    log.error("unhandled error on %s", what, exc_info=error)
    return Answer(500, error_document(500, "internal router error (see router log)", "internal_error"))


@web.middleware
async def errors_middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
    try:
        return await handler(request)
    except web.HTTPRequestEntityTooLarge as e:
        return error_response(413, f"body exceeds the limit ({e.text})", "limit_max_body_bytes")
    except web.HTTPException as e:
        if e.status < 400:
            raise
        return error_response(e.status, e.reason or "error", e.reason.lower().replace(" ", "_"))
    except Exception as e:  # noqa: BLE001 - the last line of defence (a 500 is logged with its traceback)
        return error_answer(e, f"{request.method} {request.path}").response()


def _token(headers: Mapping[str, str]) -> str | None:
    auth = headers.get("Authorization", "")
    if auth.startswith("Bearer "):
        return auth[len("Bearer "):].strip()
    return headers.get("X-Api-Key")


def _matches(given: str | None, expected: str) -> bool:
    # Header bytes that are not UTF-8 arrive as surrogates: compare their raw bytes.
    return given is not None and hmac.compare_digest(given.encode(errors="surrogateescape"), expected.encode())


def inference_allowed(headers: Mapping[str, str], admin_token: str | None, api_key: str) -> bool:
    """The request carries the API key (or the admin token)."""
    given = _token(headers)
    return _matches(given, api_key) or bool(admin_token and _matches(given, admin_token))


def auth_middleware(*, admin_token: str | None, api_key: str | None,
                    access: Callable[[web.Request], str]) -> Callable:
    """``access(request)`` names the route's class; admin routes always need the admin
    token (when none is configured, they are refused: the cluster cannot be reshaped by
    anonymous callers), inference routes need the API key when one is set."""

    @web.middleware
    async def middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
        kind = access(request)
        if kind == ADMIN:
            if admin_token is None:
                raise Unauthorized("admin endpoints are disabled: start the router with an admin token",
                                   kind="admin_disabled")
            if not _matches(_token(request.headers), admin_token):
                raise Unauthorized("missing or wrong admin token (Authorization: Bearer ...)")
        elif kind == INFERENCE and api_key is not None and not inference_allowed(request.headers, admin_token, api_key):
            raise Unauthorized("missing or wrong API key (Authorization: Bearer ...)")
        return await handler(request)

    return middleware


async def read_json(request: web.Request) -> object:
    """The body as JSON, refused with a 400 when it is not JSON or nests deeper than
    ``max_json_depth``: a deep body must never reach code that recurses over it."""
    return decode_json(await _read_raw(request), _depth_limit(request))


async def read_generate_json(request: web.Request) -> tuple[object, bool]:
    return generate_json(await _read_raw(request), _depth_limit(request))


def generate_json(raw: bytes, depth_limit: int) -> tuple[object, bool]:
    """Like ``decode_json``, and whether the body's ``input_ids`` is one flat array already
    validated (``EncodedIds``, see ``ids_body``): a rollout turn's."""
    from pearl_sglang.router.ids_body import parse_ids_body

    fast = parse_ids_body(raw, too_deep=lambda text, body: decoded_too_deep(text, body, depth_limit))
    if fast is not None:
        return fast, True
    return decode_json(raw, depth_limit), False


def _depth_limit(request: web.Request) -> int:
    from pearl_sglang.router.state import ROUTER

    return request.app[ROUTER].config.limits.max_json_depth


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
    return raw


def decode_json(raw: bytes, limit: int) -> object:
    from pearl_sglang.router.errors import BadRequest

    if not raw.strip():
        raise BadRequest("the body is empty; a JSON object is required")
    try:
        body = fastjson.loads(raw)
    except (ValueError, UnicodeDecodeError) as e:
        kind = "limit_max_json_depth" if "depth" in str(e) else "invalid_json"
        raise BadRequest(f"malformed JSON: {e}", kind=kind) from e
    if decoded_too_deep(raw, body, limit):
        raise BadRequest(f"the JSON body nests deeper than max_json_depth={limit}", kind="limit_max_json_depth")
    return body

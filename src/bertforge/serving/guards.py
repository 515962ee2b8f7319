"""The checks every HTTP request passes before any route runs, as one pure ASGI middleware (`Guards`), and what
it adds to every answer. No route has code of its own for these.

In order, a request is refused with:

- **421** when `allowed_hosts` is set and its Host header is not one of them (DNS rebinding: a web page whose
  name an attacker points at 127.0.0.1 reaches the server with that name in Host). `bertforge serve` on a
  loopback address allows only the loopback names unless told otherwise (`--allowed-host`).
- **401** with ``WWW-Authenticate: Bearer`` when `api_keys` is set and ``Authorization: Bearer <key>`` does not
  hold one of them (each compared in constant time; a key is never logged). `OPEN_PATHS` (liveness,
  readiness, the API documentation and its assets) and the browser page (`GET /` and `/page/`) stay open, so
  probes and browsers need no key; `/metrics` is not open (Prometheus sends a bearer token). An open path
  learns whether the request held a key (`key_held`): `/health` shows model directories only to a key holder.
- **415** for a POST (PUT, PATCH) whose Content-Type is not JSON (`application/json` or `*/*+json`), or names
  a charset other than UTF-8 (the body would be read wrongly: JSON is UTF-8, RFC 8259). A web
  page can post `text/plain` to any address without asking (a "simple" cross-origin request); it cannot post
  JSON without a CORS preflight, which this server does not grant unless `cors_origins` says so.
- **413** for a body over `max_body_bytes`: from Content-Length before a byte is kept, or as soon as a chunked
  body passes the limit; the rest of a body up to `DRAIN_FACTOR` times the limit is read and dropped first, so
  a client that sends its whole body before reading (urllib, requests) gets the 413, not a reset connection.
  The route gets the body already read (so it never holds more than the limit).
- **408** when the body has not all arrived within `body_timeout_s` of the headers (a body shorter than its
  Content-Length would otherwise hold the connection for ever), and **503** at once, with Retry-After, while
  `max_incomplete_bodies` other requests are still sending theirs (a cap on such connections).
- **429** with ``Retry-After`` for a large body (`LARGE_BODY_BYTES` or more, from Content-Length) from a client
  address whose last large body got a 413 less than `refusal_cooldown_s` ago, before a byte of it is read.
  A refused request of megabytes still costs the server its bytes (read, decoded, its words counted: tens of
  milliseconds of CPU); a client resending it in a loop would take a core from everyone else. Small requests
  from that address, and large ones once the cooldown has passed, are answered as usual.

Every answer carries ``X-Request-Id`` (the client's, when it is 1 to 128 characters of letters, digits and
``._:-``; else a new one), also written in the log line of the request, and TEI's timing headers in whole
milliseconds: ``x-total-time`` always, and ``x-tokenization-time``, ``x-queue-time``, ``x-inference-time``
when the route ran model work (`note_timing`); ``X-Model``, the name of the served model that made the answer
(`note_model`), and ``X-Ignored-Fields``, the request fields a lenient route (TEI's) did not use
(`note_ignored`); ``X-Truncated-Inputs`` (how many of its texts were cut to the model's window,
`note_truncated`) on a successful answer of a route that cuts over-long inputs. CORS is off unless
`cors_origins` lists origins.

Once an answer is sent, every request, refused here or answered by a route, is counted by the `record`
callback the app gives (`/metrics`: its route template, `route_of`, and status).

Refusals are written with `envelopes.error_payload`, so each API style gets its own error envelope.
"""

from __future__ import annotations

import asyncio
import hmac
import json
import logging
import math
import re
import time
import uuid
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Iterable, MutableMapping, Sequence
from typing import Any
from urllib.parse import quote

from bertforge.errors import ConfigError
from bertforge.serving.envelopes import OVERLOADED, error_payload

log = logging.getLogger("bertforge.http")

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]

# Paths answered without a key: probes (liveness, readiness) and the API documentation a browser loads.
OPEN_PATHS = ("/health", "/ready", "/docs", "/redoc", "/openapi.json", "/docs/oauth2-redirect")
# The browser page (`serving.page`): GET / and its files hold no data (the requests the page makes need the key
# like any other); POST / is a model's route and is not open.
PAGE_ASSETS_URL = "/page"
OPEN_PAGE_PATHS = ("/",)
OPEN_PREFIXES = ("/docs-assets/", PAGE_ASSETS_URL + "/")
# Host names of the loopback interface: what `serve` allows by default when it listens on one.
LOOPBACK_HOSTS = ("127.0.0.1", "localhost", "::1")
BODY_METHODS = ("POST", "PUT", "PATCH")
REQUEST_ID = re.compile(r"[A-Za-z0-9._:-]{1,128}")
# Scope keys (ASGI lets an application keep its own values in the scope).
REQUEST_ID_KEY = "bertforge.request_id"
TIMING_KEY = "bertforge.timing"
RETRY_AFTER_KEY = "bertforge.retry_after"
TRUNCATED_KEY = "bertforge.truncated_inputs"
# The header of every answer whose route cut over-long inputs to the model's window (how many: `wire_inputs`).
TRUNCATED_HEADER = "x-truncated-inputs"
KEY_HELD_KEY = "bertforge.key_held"
MODEL_KEY = "bertforge.model"
IGNORED_KEY = "bertforge.ignored_fields"
MODEL_HEADER = "x-model"
IGNORED_HEADER = "x-ignored-fields"
# Characters a field name keeps as they are in X-Ignored-Fields (printable ASCII but the list's separator).
HEADER_SAFE = "!#$&'()*+-./:;<=>?@[]^_`{|}~"
IGNORED_SHOWN = 16
# The `route` label of a request whose path no route has (one value for them all: raw paths are unbounded).
UNMATCHED = "unmatched"
TIMING_HEADERS = {"tokenization_s": "x-tokenization-time", "queue_s": "x-queue-time",
                  "inference_s": "x-inference-time"}
# A body this large costs milliseconds to read and decode: decoded off the event loop (`model_service`), and
# not taken again from an address whose last one was refused as too large (the cooldown above).
LARGE_BODY_BYTES = 256 * 1024
# A body refused as too large is still read (and dropped) up to this many times the limit: see `Guards.drain`.
DRAIN_FACTOR = 4
# Addresses remembered for the cooldown; the oldest are forgotten past this many.
COOLDOWN_MEMORY = 4096


def check_guard_settings(settings: Any) -> None:
    """ConfigError naming a guard setting that cannot work: `api_keys`, `allowed_hosts`, `cors_origins` (each a
    tuple of non-empty strings; a key without spaces, of at least 8 characters)."""
    for name in ("api_keys", "allowed_hosts", "cors_origins"):
        values = getattr(settings, name)
        if isinstance(values, str) or not isinstance(values, Sequence):
            raise ConfigError(f"server {name} must be a list of strings, got {type(values).__name__}")
        for value in values:
            if not isinstance(value, str) or not value.strip():
                raise ConfigError(f"server {name} holds an empty or non-string value")
    for key in settings.api_keys:
        # Said without the key itself: it must not reach a log.
        if len(key) < 8 or any(char.isspace() for char in key):
            raise ConfigError("an API key must be at least 8 characters with no spaces (--api-key / "
                              "BERTFORGE_API_KEYS); generate one with: python -c 'import secrets; "
                              "print(secrets.token_urlsafe(32))'")


def split_keys(values: Iterable[str]) -> tuple[str, ...]:
    """API keys from repeated options and comma-separated lists (`--api-key a,b --api-key c`), in order."""
    keys: list[str] = []
    for value in values:
        keys += [key.strip() for key in value.split(",") if key.strip() and key.strip() not in keys]
    return tuple(keys)


def note_timing(scope: Scope, queue_s: float, tokenization_s: float, inference_s: float) -> None:
    """A route's model work, for the timing headers of its answer (seconds)."""
    scope[TIMING_KEY] = {"queue_s": queue_s, "tokenization_s": tokenization_s, "inference_s": inference_s}


def note_truncated(scope: Scope, count: int) -> None:
    """How many texts a route's model work cut to the window, for the `TRUNCATED_HEADER` of its answer."""
    scope[TRUNCATED_KEY] = scope.get(TRUNCATED_KEY, 0) + count


def note_retry_after(scope: Scope, headers: MutableMapping[str, str] | dict[str, str]) -> None:
    """A refusal's Retry-After (from its headers), for the answer of a route that returns no headers itself."""
    value = headers.get("Retry-After")
    if value is not None:
        scope[RETRY_AFTER_KEY] = value


def note_model(scope: Scope, name: str) -> None:
    """The served model that makes this request's answer (``X-Model``, and the model its metrics count under)."""
    scope[MODEL_KEY] = name


def note_ignored(scope: Scope, fields: Sequence[str]) -> None:
    """Request fields the route did not use (``X-Ignored-Fields``, comma-separated; a name is percent-encoded
    where it holds what a header cannot, and at most `IGNORED_SHOWN` are named)."""
    if fields:
        shown = [quote(name, safe=HEADER_SAFE) for name in fields[:IGNORED_SHOWN]]
        more = len(fields) - len(shown)
        scope[IGNORED_KEY] = ", ".join(shown) + (f", and {more} more" if more else "")


def model_of(scope: Scope) -> str | None:
    return scope.get(MODEL_KEY)


def key_held(scope: Scope) -> bool:
    """Whether the request holds one of the server's API keys (False when the server has none)."""
    return bool(scope.get(KEY_HELD_KEY))


def request_id_of(scope: Scope) -> str | None:
    return scope.get(REQUEST_ID_KEY)


class Guards:
    """The ASGI middleware (see the module docstring). `settings` has `api_keys`, `allowed_hosts` and
    `max_body_bytes` (`ServerSettings`)."""

    def __init__(self, app: Callable[..., Awaitable[None]], settings: Any, routes: Sequence[Any] = (),
                 record: Callable[[Scope, str, int, float], None] | None = None):
        self.app = app
        self.record = record  # (scope, route template, status, seconds) of every request, once answered
        self.routes = routes  # the app's routes (Starlette's, live): a body is checked only for a route taking it
        self.keys = [key.encode("utf-8") for key in settings.api_keys]
        self.hosts = {host.lower().strip("[]") for host in settings.allowed_hosts}
        self.max_body_bytes = int(settings.max_body_bytes)
        self.body_timeout_s = float(settings.body_timeout_s)
        self.max_incomplete = int(settings.max_incomplete_bodies)
        self.incomplete = 0  # requests whose body is being read now
        self.cooldown_s = float(settings.refusal_cooldown_s)
        self.cooling: OrderedDict[str, float] = OrderedDict()  # address -> when its cooldown ends (monotonic)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        began = time.perf_counter()
        headers = {name.decode("latin-1").lower(): value.decode("latin-1") for name, value in scope["headers"]}
        given = headers.get("x-request-id", "")
        request_id = given if REQUEST_ID.fullmatch(given) else uuid.uuid4().hex
        scope[REQUEST_ID_KEY] = request_id
        status = 0

        async def answer(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
                if status == 413:
                    self.start_cooldown(scope, headers)
                extra = [(b"x-request-id", request_id.encode("ascii")),
                         (b"x-total-time", milliseconds(time.perf_counter() - began))]
                extra += [(header.encode("ascii"), milliseconds(seconds))
                          for key, header in TIMING_HEADERS.items()
                          if (seconds := scope.get(TIMING_KEY, {}).get(key)) is not None]
                extra += [(header.encode("ascii"), scope[key].encode("latin-1"))
                          for key, header in ((MODEL_KEY, MODEL_HEADER), (IGNORED_KEY, IGNORED_HEADER)) if key in scope]
                if TRUNCATED_KEY in scope and status < 300:  # the model ran and the answer is its work
                    extra.append((TRUNCATED_HEADER.encode("ascii"), str(scope[TRUNCATED_KEY]).encode("ascii")))
                given = {name.lower() for name, _ in message.get("headers", [])}
                if status == 429 and b"retry-after" not in given:  # every 429 says when to come back
                    extra.append((b"retry-after", str(scope.get(RETRY_AFTER_KEY, "1")).encode("ascii")))
                message = {**message, "headers": [*message.get("headers", []), *extra]}
            await send(message)

        try:
            refusal = self.refusal(scope, headers)
            if refusal is None:
                body, refusal = await self.read_body(headers, receive)
            elif scope["method"] in BODY_METHODS:  # refused before reading: the body is dropped, not kept
                await self.drain(receive, time.monotonic() + self.body_timeout_s, declared_length(headers), headers)
            if refusal is not None:
                await respond(scope, answer, *refusal)
            else:
                await self.app(scope, replay(body, receive), answer)
        finally:
            seconds = time.perf_counter() - began
            log.info("%s %s %s %d %.1f ms", request_id, scope["method"], scope["path"], status, 1000 * seconds)
            if self.record is not None:
                # No answer started: the app raised, and the server answers 500.
                self.record(scope, self.route_of(scope), status or 500, seconds)

    def route_of(self, scope: Scope) -> str:
        """The template of the route a request's path matches (`/models/{model}/embed`; a wrong method's too),
        `UNMATCHED` for none; its path parameters are left in `scope["path_params"]` when none were yet."""
        from starlette.routing import Match

        partial = None
        for route in self.routes:
            match, child = route.matches(scope)
            if match == Match.FULL or (match == Match.PARTIAL and partial is None):
                scope.setdefault("path_params", child.get("path_params", {}))
                if match == Match.FULL:
                    return getattr(route, "path", UNMATCHED)
                partial = getattr(route, "path", UNMATCHED)
        return partial or UNMATCHED

    def refusal(self, scope: Scope, headers: dict[str, str]) -> tuple[int, str, list[tuple[str, str]]] | None:
        """(status, message, headers) of the first check the request fails, or None."""
        if self.hosts:
            host = host_name(headers.get("host", ""))
            if host not in self.hosts and "*" not in self.hosts:
                return 421, (f"this server does not answer for the host name {host!r}; start it with "
                             f"--allowed-host {host} to allow it"), []
        path = scope["path"]
        page = path in OPEN_PAGE_PATHS and scope["method"] in ("GET", "HEAD")
        if self.keys:
            scheme, _, token = headers.get("authorization", "").partition(" ")
            given = bool(token.strip()) and scheme.lower() == "bearer"
            # Every key is compared, in constant time each: the answer's timing tells nothing of which matched.
            valid = given and any([hmac.compare_digest(token.strip().encode("utf-8"), key) for key in self.keys])
            scope[KEY_HELD_KEY] = valid  # an open path (/health) shows more to a client holding a key
            if not (page or path in OPEN_PATHS or path.startswith(OPEN_PREFIXES)):
                if not given:
                    return (401, "this server needs an API key: send the header 'Authorization: Bearer <key>'",
                            [("www-authenticate", 'Bearer realm="bertforge"')])
                if not valid:
                    return (401, "the API key is not valid for this server",
                            [("www-authenticate", 'Bearer realm="bertforge", error="invalid_token"')])
        if scope["method"] in BODY_METHODS and self.takes_body(scope):
            media, _, parameters = headers.get("content-type", "").partition(";")
            media = media.strip().lower()
            if media != "application/json" and not media.endswith("+json"):
                return 415, (f"send the body as JSON with the header 'Content-Type: application/json' "
                             f"(got {media or 'no Content-Type'!r})"), []
            charset = charset_of(parameters)
            if charset is not None and charset not in ("utf-8", "utf8"):
                return 415, (f"the body is read as UTF-8 (JSON's encoding), not as charset={charset}: send it "
                             "encoded as UTF-8 with 'Content-Type: application/json' or '; charset=utf-8'"), []
            return self.cooling_refusal(scope, headers)
        return None

    def takes_body(self, scope: Scope) -> bool:
        """Whether a route answers this method on this path: else the app's 404 or 405 comes first, whatever
        the body (a PUT on a GET route is a wrong method before it is a wrong Content-Type)."""
        if not self.routes:
            return True
        from starlette.routing import Match

        return any(route.matches(scope)[0] == Match.FULL for route in self.routes)

    def start_cooldown(self, scope: Scope, headers: dict[str, str]) -> None:
        """After a 413 to a large body: the address's large bodies are refused for `cooldown_s`."""
        if self.cooldown_s <= 0 or declared_length(headers) < LARGE_BODY_BYTES or not scope.get("client"):
            return
        address = scope["client"][0]
        self.cooling.pop(address, None)
        self.cooling[address] = time.monotonic() + self.cooldown_s
        while len(self.cooling) > COOLDOWN_MEMORY:
            self.cooling.popitem(last=False)

    def cooling_refusal(self, scope: Scope, headers: dict[str, str]) -> tuple[int, str, list[tuple[str, str]]] | None:
        if not self.cooling or declared_length(headers) < LARGE_BODY_BYTES or not scope.get("client"):
            return None
        address = scope["client"][0]
        left = self.cooling.get(address, 0.0) - time.monotonic()
        if left <= 0:
            self.cooling.pop(address, None)
            return None
        wait = max(1, math.ceil(left))
        return 429, (f"the last large request from this address was refused as too large (413); its large "
                     f"requests are refused for {self.cooldown_s:g} s after that (refusal_cooldown_s): split or "
                     f"shorten the request, and retry after {wait} s"), [("retry-after", str(wait))]

    async def read_body(self, headers: dict[str, str], receive: Receive
                        ) -> tuple[bytes, tuple[int, str, list[tuple[str, str]]] | None]:
        """The whole request body, or a refusal: 413 as soon as it is known to be over the limit (the rest
        of a body of moderate size is read and dropped first, see `drain`); 408 when it has not all arrived
        within `body_timeout_s`; 503 when `max_incomplete_bodies` other requests are still sending theirs."""
        limit = self.max_body_bytes
        declared = declared_length(headers)
        deadline = time.monotonic() + self.body_timeout_s
        if declared > limit:
            await self.drain(receive, deadline, declared, headers)
            return b"", (413, f"request body of {declared} bytes is larger than the limit of {limit} bytes "
                              "(max_body_bytes; split the request)", [])
        if self.incomplete >= self.max_incomplete:
            return b"", (503, f"{self.incomplete} requests are still sending their bodies (max_incomplete_bodies); "
                              "retry shortly", [("retry-after", "1")])
        chunks, size = [], 0
        self.incomplete += 1
        try:
            while True:
                message = await within(receive, deadline)
                if message is None:
                    return b"", (408, f"the request body did not arrive within {self.body_timeout_s:g} s "
                                      f"(body_timeout_s): {size} of {declared or 'an unknown number of'} bytes came; "
                                      "send the whole body at once, with a Content-Length that matches it", [])
                if message["type"] == "http.disconnect":
                    break
                chunk = message.get("body", b"")
                size += len(chunk)
                if size > limit:
                    await self.drain(receive, deadline, size, headers)
                    return b"", (413, f"request body is larger than the limit of {limit} bytes (max_body_bytes; "
                                      "split the request)", [])
                chunks.append(chunk)
                if not message.get("more_body", False):
                    break
        finally:
            self.incomplete -= 1
        return b"".join(chunks), None

    async def drain(self, receive: Receive, deadline: float, size: int, headers: dict[str, str]) -> None:
        """Read and drop the rest of a refused body of at most `DRAIN_FACTOR` times the limit, so the client
        reads the refusal (413, and those made before reading: 401, 415, 429 ...): one that sends its whole body
        before reading the answer (urllib, most scripts) would otherwise get a connection reset instead. Bytes
        are only received, never decoded. A larger body is not read (the client may see the reset), nor one
        whose client waits for `100 Continue` before sending it (it reads the refusal instead)."""
        if size > DRAIN_FACTOR * self.max_body_bytes or "100-continue" in headers.get("expect", "").lower():
            return
        while True:
            message = await within(receive, deadline)
            if message is None or message["type"] == "http.disconnect" or not message.get("more_body", False):
                return


async def within(receive: Receive, deadline: float) -> Message | None:
    """The next ASGI message, or None when `deadline` (monotonic) passes first."""
    try:
        return await asyncio.wait_for(receive(), max(0.0, deadline - time.monotonic()))
    except TimeoutError:
        return None


def replay(body: bytes, receive: Receive) -> Receive:
    """A `receive` that gives the body already read, then whatever the client sends next (its disconnect)."""
    given = False

    async def receive_again() -> Message:
        nonlocal given
        if not given:
            given = True
            return {"type": "http.request", "body": body, "more_body": False}
        return await receive()

    return receive_again


async def respond(scope: Scope, send: Send, status: int, message: str, headers: list[tuple[str, str]]) -> None:
    """Answer a refusal in the error envelope of the request path's API style."""
    # The guards' only 503 is the cap on bodies still arriving: the server is too busy to take this one now.
    code = OVERLOADED if status == 503 else None
    body = json.dumps(error_payload(scope["path"], status, message, code=code)).encode("utf-8")
    raw = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode("ascii"))]
    raw += [(name.encode("latin-1"), value.encode("latin-1")) for name, value in headers]
    if status in (408, 413, 429, 503):  # the body was not read whole: the connection cannot carry another request
        raw.append((b"connection", b"close"))
    await send({"type": "http.response.start", "status": status, "headers": raw})
    await send({"type": "http.response.body", "body": body})


def charset_of(parameters: str) -> str | None:
    """The `charset` of a Content-Type's parameters (`; charset="UTF-8"` -> `utf-8`), None when not given."""
    for parameter in parameters.split(";"):
        name, _, value = parameter.partition("=")
        if name.strip().lower() == "charset":
            return value.strip().strip('"').lower()
    return None


def declared_length(headers: dict[str, str]) -> int:
    """The Content-Length a request declares (0 when absent or not a number)."""
    declared = headers.get("content-length", "")
    return int(declared) if declared.isdigit() else 0


def host_name(host: str) -> str:
    """The name of a Host header, lower case, without its port (`[::1]:8000` -> `::1`)."""
    host = host.strip().lower()
    if host.startswith("["):
        return host[1:].split("]", 1)[0]
    return host.rsplit(":", 1)[0] if host.count(":") == 1 else host


def milliseconds(seconds: float) -> bytes:
    """Whole milliseconds, as TEI writes its timing headers."""
    return str(int(seconds * 1000)).encode("ascii")


def install_guards(app: Any, settings: Any, record: Callable[[Scope, str, int, float], None] | None = None) -> None:
    """Put `Guards` (and, when `settings.cors_origins` lists origins, CORS outside it, so a preflight needs no
    key) in front of every route of a Starlette/FastAPI `app`; `record` counts every request once answered."""
    app.add_middleware(Guards, settings=settings, routes=app.router.routes, record=record)
    if settings.cors_origins:
        from starlette.middleware.cors import CORSMiddleware

        app.add_middleware(CORSMiddleware, allow_origins=list(settings.cors_origins), allow_methods=["GET", "POST"],
                           allow_headers=["Authorization", "Content-Type", "X-Request-Id"],
                           expose_headers=["X-Request-Id", "x-total-time", *TIMING_HEADERS.values(), MODEL_HEADER,
                                           IGNORED_HEADER, TRUNCATED_HEADER], max_age=600)

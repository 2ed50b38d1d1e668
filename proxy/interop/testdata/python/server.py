"""A stateful MCP server of the Python stack for the interop tests, on
127.0.0.1:$PORT (0: any free port), Streamable HTTP at /mcp:

    .venv/sdk/bin/python server.py fastmcp     FastMCP 4.1.6 (fastmcp.FastMCP)
    .venv/sdk/bin/python server.py mcpserver   the mcp 2.3 SDK's own MCPServer

Options (environment):
    JSON_RESPONSE=1          answers POSTs as one JSON body, not an SSE stream
    EVENT_STORE=1            keeps each stream's events: answer streams carry event
                             ids and a GET with Last-Event-ID resumes one
    SESSION_IDLE_TIMEOUT=s   the SDK's session_idle_timeout (default: the SDK's)
    MAX_SESSIONS=n           the SDK's max_sessions (default: the SDK's)
    COUNT_FILE=path          where write and slow_write record their executions
    INSTRUCTIONS_BYTES=n     size of the initialize answer's instructions (600)
    SLOW_INITIALIZE_MS=n     holds every initialize n ms before serving it, as a
                             server busy at start does
    STATE_TOOLS=1            adds remember and recall (per-session state)

Tools, the same on both servers:
    echo {text}              returns text (readOnlyHint)
    write {tag}              appends "<tag> <pid>" to COUNT_FILE, one line per
                             execution, returns "wrote <tag>" (not replay-safe)
    slow_write {tag, before_ms, after_ms}
                             sleeps before_ms, records like write, sleeps
                             after_ms, returns "wrote <tag>": a write in flight
    fail {text}              a tool error (isError) whose text is text
    ask {question}           asks the client (elicitation/create) with a schema of
                             one optional boolean "ok"; returns
                             "<action> ok=<value>"
    change_tools {}          adds a tool added_<n> (an echo) and sends
                             notifications/tools/list_changed; returns its name
    long {steps, ms, tag, notify}
                             steps progress notifications (when the call asked
                             for progress), ms apart; returns "done <steps>";
                             with notify, first a log message "long <tag>
                             started" (sent where the era and the client's
                             log level allow it)
With STATE_TOOLS=1 also:
    remember {value}         keeps value for the calling session (its
                             Mcp-Session-Id; a 2026-07-28 request has none)
    recall {}                returns "recalled <value>" for the calling session
                             ("recalled " when it holds none)

Stdout lines, each a signal a test can wait for or count:
    LISTENING <port>         serving
    INITIALIZE <name>        an initialize arrived (clientInfo.name)
    DISCOVER                 a server/discover arrived (2026-07-28)
    CALL <tool>              a tools/call arrived, before it runs
    STARTED <tool> <tag>     write, slow_write or long began
    WROTE <tag>              write or slow_write recorded its execution
    ELICITED <action>        the client answered ask

The process exits when its stdin closes and after INTEROP_LIFETIME_MS; a
SIGKILL and a start on the same port is a restart (every session gone).
"""

import asyncio
import json
import os
import sys
from contextlib import asynccontextmanager

import uvicorn
from pydantic import BaseModel

import guard

PORT = int(os.environ.get("PORT") or 0)
JSON_RESPONSE = os.environ.get("JSON_RESPONSE") == "1"
EVENT_STORE = os.environ.get("EVENT_STORE") == "1"
IDLE_TIMEOUT = float(os.environ["SESSION_IDLE_TIMEOUT"]) if os.environ.get("SESSION_IDLE_TIMEOUT") else None
MAX_SESSIONS = int(os.environ["MAX_SESSIONS"]) if os.environ.get("MAX_SESSIONS") else None
COUNT_FILE = os.environ.get("COUNT_FILE") or ""
INSTRUCTIONS_BYTES = int(os.environ.get("INSTRUCTIONS_BYTES") or 600)
SLOW_INITIALIZE_MS = int(os.environ.get("SLOW_INITIALIZE_MS") or 0)
STATE_TOOLS = os.environ.get("STATE_TOOLS") == "1"


def instructions(n: int) -> str:
    """Exactly n bytes of UTF-8 mixing 1-, 2- and 3-byte characters."""
    s = ""
    i = 0
    while len(s.encode()) < n:
        s += f"{i:05d} mcpheal interop (python): café naïve ✓ résumé — keep every byte\n"
        i += 1
    b = s.encode()[:n]
    text = b.decode("utf-8", errors="ignore")
    return text + "." * (n - len(text.encode()))


def record(tag: str) -> None:
    if COUNT_FILE:
        with open(COUNT_FILE, "a", encoding="utf-8") as f:
            f.write(f"{tag} {os.getpid()}\n")
    guard.say(f"WROTE {tag}")


class Answer(BaseModel):
    ok: bool = False


async def started_log(ctx, tag: str) -> None:
    """Sends the log message "long <tag> started", where it may be sent."""
    try:
        await ctx.info(f"long {tag} started")
    except Exception as err:  # the era or the session refuses it: nothing sent
        print(f"long {tag}: no log message: {err!r}", file=sys.stderr)


def session_key(headers) -> str:
    """The MCP session a request belongs to: its Mcp-Session-Id header
    ("" on a 2026-07-28 request, which has no session)."""
    return {k.lower(): v for k, v in (headers or {}).items()}.get("mcp-session-id", "")


def memory_event_store():
    """The in-memory event store the SDK's examples describe: every event of
    every stream, in order, replayed after a given event id."""
    from mcp.server.streamable_http import EventMessage, EventStore

    class MemoryEventStore(EventStore):
        def __init__(self):
            self._events = []  # (event_id, stream_id, message)
            self._next = 0

        async def store_event(self, stream_id, message):
            self._next += 1
            event_id = str(self._next)
            self._events.append((event_id, stream_id, message))
            return event_id

        async def replay_events_after(self, last_event_id, send_callback):
            for i, (event_id, stream_id, _) in enumerate(self._events):
                if event_id == last_event_id:
                    for later, s, message in self._events[i + 1 :]:
                        if s == stream_id and message is not None:
                            await send_callback(EventMessage(message, later))
                    return stream_id
            return None

    return MemoryEventStore()


def fastmcp_app():
    from fastmcp import Context, FastMCP
    from fastmcp.exceptions import ToolError
    from fastmcp.server.event_store import EventStore
    from mcp_types import ToolListChangedNotification

    mcp = FastMCP("mcpheal-interop-fastmcp-py", instructions=instructions(INSTRUCTIONS_BYTES))
    added = []

    @mcp.tool(annotations={"readOnlyHint": True})
    def echo(text: str) -> str:
        """Echoes text."""
        return text

    @mcp.tool
    def write(tag: str) -> str:
        """Records one execution in the count file. Not replay-safe."""
        guard.say(f"STARTED write {tag}")
        record(tag)
        return f"wrote {tag}"

    @mcp.tool
    async def slow_write(tag: str, before_ms: int = 0, after_ms: int = 0) -> str:
        """Sleeps, records one execution, sleeps. Not replay-safe."""
        guard.say(f"STARTED slow_write {tag}")
        await asyncio.sleep(before_ms / 1000)
        record(tag)
        await asyncio.sleep(after_ms / 1000)
        return f"wrote {tag}"

    @mcp.tool
    def fail(text: str) -> str:
        """Fails with text."""
        raise ToolError(text)

    @mcp.tool
    async def ask(question: str, ctx: Context) -> str:
        """Asks the client's user a question."""
        r = await ctx.elicit(question, response_type=Answer)
        guard.say(f"ELICITED {r.action}")
        ok = r.data.ok if r.action == "accept" else None
        return f"{r.action} ok={ok}"

    @mcp.tool
    async def change_tools(ctx: Context) -> str:
        """Adds a tool and tells the client its tool list changed."""
        name = f"added_{len(added) + 1}"

        def added_tool(text: str) -> str:
            return text

        mcp.tool(added_tool, name=name, description="An echo added at run time.")
        added.append(name)
        await ctx.send_notification(ToolListChangedNotification())
        return name

    @mcp.tool
    async def long(steps: int, ms: int, ctx: Context, tag: str = "", notify: bool = False) -> str:
        """Reports progress steps times, ms apart."""
        guard.say(f"STARTED long {tag}")
        if notify:
            await started_log(ctx, tag)
        for i in range(steps):
            await asyncio.sleep(ms / 1000)
            await ctx.report_progress(i + 1, steps)
        return f"done {steps}"

    if STATE_TOOLS:
        kept = {}  # Mcp-Session-Id -> value

        from fastmcp.server.dependencies import get_http_headers

        @mcp.tool
        def remember(value: str) -> str:
            """Keeps value for the calling session."""
            key = session_key(get_http_headers(include_all=True))
            if key:
                kept[key] = value
            return f"remembered {value}"

        @mcp.tool
        def recall() -> str:
            """Returns the value the calling session kept."""
            return f"recalled {kept.get(session_key(get_http_headers(include_all=True)), '')}"

    app = mcp.http_app(
        path="/mcp",
        json_response=JSON_RESPONSE,
        stateless_http=False,
        event_store=EventStore() if EVENT_STORE else None,
        session_idle_timeout=IDLE_TIMEOUT if IDLE_TIMEOUT is not None else "auto",
    )
    if MAX_SESSIONS is not None:
        # FastMCP 4.1.6 takes no max_sessions; the SDK session manager it
        # runs has one, read on every new session.
        endpoint = next(r.endpoint for r in app.routes if getattr(r, "path", "") == "/mcp")
        started = app.router.lifespan_context

        @asynccontextmanager
        async def lifespan(a):
            async with started(a) as state:
                endpoint.session_manager.max_sessions = MAX_SESSIONS
                yield state

        app.router.lifespan_context = lifespan
    return app


def mcpserver_app():
    from mcp.server.mcpserver import Context, MCPServer
    from mcp.server.mcpserver.exceptions import ToolError
    from mcp_types import ToolAnnotations

    mcp = MCPServer("mcpheal-interop-mcpserver-py", instructions=instructions(INSTRUCTIONS_BYTES))
    added = []

    @mcp.tool(annotations=ToolAnnotations(read_only_hint=True))
    def echo(text: str) -> str:
        """Echoes text."""
        return text

    @mcp.tool()
    def write(tag: str) -> str:
        """Records one execution in the count file. Not replay-safe."""
        guard.say(f"STARTED write {tag}")
        record(tag)
        return f"wrote {tag}"

    @mcp.tool()
    async def slow_write(tag: str, before_ms: int = 0, after_ms: int = 0) -> str:
        """Sleeps, records one execution, sleeps. Not replay-safe."""
        guard.say(f"STARTED slow_write {tag}")
        await asyncio.sleep(before_ms / 1000)
        record(tag)
        await asyncio.sleep(after_ms / 1000)
        return f"wrote {tag}"

    @mcp.tool()
    def fail(text: str) -> str:
        """Fails with text."""
        raise ToolError(text)

    @mcp.tool()
    async def ask(question: str, ctx: Context) -> str:
        """Asks the client's user a question."""
        r = await ctx.elicit(question, schema=Answer)
        guard.say(f"ELICITED {r.action}")
        ok = r.data.ok if r.action == "accept" else None
        return f"{r.action} ok={ok}"

    @mcp.tool()
    async def change_tools(ctx: Context) -> str:
        """Adds a tool and tells the client its tool list changed."""
        name = f"added_{len(added) + 1}"

        def added_tool(text: str) -> str:
            return text

        mcp.add_tool(added_tool, name=name, description="An echo added at run time.")
        added.append(name)
        await ctx.session.send_tool_list_changed()
        return name

    @mcp.tool()
    async def long(steps: int, ms: int, ctx: Context, tag: str = "", notify: bool = False) -> str:
        """Reports progress steps times, ms apart."""
        guard.say(f"STARTED long {tag}")
        if notify:
            await started_log(ctx, tag)
        for i in range(steps):
            await asyncio.sleep(ms / 1000)
            await ctx.report_progress(i + 1, steps)
        return f"done {steps}"

    if STATE_TOOLS:
        kept = {}  # Mcp-Session-Id -> value

        @mcp.tool()
        def remember(value: str, ctx: Context) -> str:
            """Keeps value for the calling session."""
            key = session_key(ctx.headers)
            if key:
                kept[key] = value
            return f"remembered {value}"

        @mcp.tool()
        def recall(ctx: Context) -> str:
            """Returns the value the calling session kept."""
            return f"recalled {kept.get(session_key(ctx.headers), '')}"

    options = {}
    if IDLE_TIMEOUT is not None:
        options["session_idle_timeout"] = IDLE_TIMEOUT
    if MAX_SESSIONS is not None:
        options["max_sessions"] = MAX_SESSIONS
    return mcp.streamable_http_app(
        json_response=JSON_RESPONSE,
        stateless_http=False,
        event_store=memory_event_store() if EVENT_STORE else None,
        host="127.0.0.1",
        **options,
    )


def announce(body: bytes) -> bool:
    """Prints what arrived; says whether it holds an initialize."""
    try:
        msg = json.loads(body)
    except ValueError:
        return False
    initialize = False
    for m in msg if isinstance(msg, list) else [msg]:
        if not isinstance(m, dict):
            continue
        method = m.get("method")
        params = m.get("params") if isinstance(m.get("params"), dict) else {}
        if method == "initialize":
            initialize = True
            guard.say(f"INITIALIZE {(params.get('clientInfo') or {}).get('name')}")
        elif method == "server/discover":
            guard.say("DISCOVER")
        elif method == "tools/call":
            guard.say(f"CALL {params.get('name')}")
    return initialize


class Announcer:
    """ASGI middleware: reads each POST body once, prints what arrived, and
    hands the same body on to the server (an initialize after
    SLOW_INITIALIZE_MS)."""

    def __init__(self, app):
        self.app = app

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http" or scope["method"] != "POST":
            await self.app(scope, receive, send)
            return
        messages, body = [], b""
        while True:
            m = await receive()
            messages.append(m)
            if m["type"] != "http.request":
                break
            body += m.get("body", b"")
            if not m.get("more_body"):
                break
        if announce(body) and SLOW_INITIALIZE_MS:
            await asyncio.sleep(SLOW_INITIALIZE_MS / 1000)

        async def replay():
            if messages:
                return messages.pop(0)
            return await receive()

        await self.app(scope, replay, send)


class Server(uvicorn.Server):
    async def startup(self, sockets=None):
        await super().startup(sockets=sockets)
        if self.started:
            guard.say(f"LISTENING {self.servers[0].sockets[0].getsockname()[1]}")


def main():
    kind = sys.argv[1] if len(sys.argv) > 1 else ""
    apps = {"fastmcp": fastmcp_app, "mcpserver": mcpserver_app}
    if kind not in apps:
        print("usage: server.py fastmcp|mcpserver", file=sys.stderr)
        sys.exit(2)
    guard.start_lifetime()
    guard.watch_stdin()
    config = uvicorn.Config(
        Announcer(apps[kind]()),
        host="127.0.0.1",
        port=PORT,
        log_level="warning",
        lifespan="on",
        timeout_graceful_shutdown=1,
    )
    Server(config).run()


if __name__ == "__main__":
    main()

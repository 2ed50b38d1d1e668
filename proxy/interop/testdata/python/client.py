"""A line-driven MCP client of the Python stack for the interop tests, the
counterpart of client.mjs (the same commands, the same answers):

    .venv/sdk/bin/python client.py FLAVOUR URL

FLAVOUR is one of
    sdk             the mcp 2.3 SDK, low level: one ClientSession over
                    streamable_http_client, no reconnect of its own
    client-auto     the mcp 2.3 high-level mcp.Client, mode="auto" (speaks
                    2026-07-28 where the server does, else initialize)
    client-legacy   mcp.Client, mode="legacy" (initialize)
    fastmcp         FastMCP 4.1.6's fastmcp.Client (its default mode)

Each stdin line is one JSON command; each answers one stdout line
"RESULT <json>" with op, ok and ms (the time it took):
    {"op":"connect"}                      → serverName, instructions length/sha256
    {"op":"list"}                         → count and names of all tools (every page)
    {"op":"call","name":N,"arguments":{}} → isError, text length/sha256, text head;
        "progress":true                    also asks for progress: progressCount
    {"op":"events"}                       → toolsChanged, logs: the
                                            notifications/tools/list_changed and
                                            notifications/message received so far
    {"op":"waitEvent","event":E,"count":n,"timeoutMs":ms}
                                          → ok once events()[E] >= n, else a
                                            failure after ms
    {"op":"close"}                        → closes the client and exits
A failure answers {"ok":false,"code":…,"message":…,"kind":…}: code is the
JSON-RPC error code of an MCP error (an HTTP status for an HTTP failure);
kind is the exception's class, or "timeout". Text lengths are UTF-8 bytes.

The client answers the server's elicitation/create by accepting with
{"ok": true}. Every request has the SDK's own timeout, CALL_TIMEOUT_S (30)
seconds; a command that outlives it by 10 s more fails as "timeout". The
process exits when stdin closes and after INTEROP_LIFETIME_MS.
"""

import asyncio
import hashlib
import json
import os
import sys
import time
import traceback

import guard

TIMEOUT = float(os.environ.get("CALL_TIMEOUT_S") or 30)
NAME = os.environ.get("CLIENT_NAME") or "mcpheal-interop-python"


def digest(s: str):
    b = s.encode("utf-8")
    return len(b), hashlib.sha256(b).hexdigest()


def text_of(content) -> str:
    return "".join(c.text for c in (content or []) if getattr(c, "type", None) == "text")


def leaf(err: BaseException) -> BaseException:
    """The first exception inside exception groups."""
    while isinstance(err, BaseExceptionGroup) and err.exceptions:
        err = err.exceptions[0]
    return err


def failure(err: BaseException) -> dict:
    err = leaf(err)
    code = getattr(err, "code", None)
    if not isinstance(code, int):
        response = getattr(err, "response", None)
        code = getattr(response, "status_code", None)
    message = str(err) or repr(err)
    if isinstance(err, TimeoutError):
        kind = "timeout"
    else:
        kind = type(err).__name__
    return {"ok": False, "code": code if isinstance(code, int) else None, "message": message[:2000], "kind": kind}


class Events:
    def __init__(self):
        self.counts = {"toolsChanged": 0, "logs": 0}
        self.changed = asyncio.Event()

    def bump(self, name):
        self.counts[name] += 1
        self.changed.set()

    async def on_message(self, message):
        import mcp_types

        if isinstance(message, mcp_types.ToolListChangedNotification):
            self.bump("toolsChanged")

    async def on_log(self, params):
        self.bump("logs")

    async def wait(self, name, count, timeout_ms):
        async def until():
            while self.counts.get(name, 0) < count:
                self.changed.clear()
                await self.changed.wait()

        await asyncio.wait_for(until(), timeout_ms / 1000)


async def elicit_mcp(context, params):
    import mcp_types

    return mcp_types.ElicitResult(action="accept", content={"ok": True})


class SDKClient:
    """mcp 2.3: ClientSession over streamable_http_client (flavour sdk), or
    mcp.Client (client-auto, client-legacy)."""

    def __init__(self, flavour, url, events):
        self.flavour, self.url, self.events = flavour, url, events

    def context(self):
        import mcp_types

        info = mcp_types.Implementation(name=NAME, version="1.0.0")
        if self.flavour == "sdk":
            return self._low_level(info)
        from mcp import Client

        return Client(
            self.url,
            mode="auto" if self.flavour == "client-auto" else "legacy",
            read_timeout_seconds=TIMEOUT,
            client_info=info,
            elicitation_callback=elicit_mcp,
            message_handler=self.events.on_message,
            logging_callback=self.events.on_log,
        )

    def _low_level(self, info):
        from contextlib import asynccontextmanager

        from mcp import ClientSession
        from mcp.client.streamable_http import streamable_http_client

        @asynccontextmanager
        async def open_session():
            async with streamable_http_client(self.url) as (read, write):
                async with ClientSession(
                    read,
                    write,
                    read_timeout_seconds=TIMEOUT,
                    client_info=info,
                    elicitation_callback=elicit_mcp,
                    message_handler=self.events.on_message,
                    logging_callback=self.events.on_log,
                ) as session:
                    yield session

        return open_session()

    async def connect(self, c):
        if self.flavour == "sdk":
            r = await c.initialize()
            return r.server_info.name, r.instructions
        info = c.server_info
        return (info.name if info else None), c.instructions

    async def list_page(self, c, cursor):
        if self.flavour == "sdk":
            import mcp_types

            r = await c.list_tools(params=mcp_types.PaginatedRequestParams(cursor=cursor) if cursor else None)
        else:
            r = await c.list_tools(cursor=cursor)
        return [t.name for t in r.tools], r.next_cursor

    async def call(self, c, name, arguments, progress):
        r = await c.call_tool(name, arguments, read_timeout_seconds=TIMEOUT, progress_callback=progress)
        return bool(r.is_error), text_of(r.content)


class FastMCPClient:
    """FastMCP 4.1.6's fastmcp.Client."""

    def __init__(self, flavour, url, events):
        self.url, self.events = url, events

    def context(self):
        import mcp_types
        from fastmcp import Client

        async def elicit(message, response_type, params, context):
            return {"ok": True}

        return Client(
            self.url,
            timeout=TIMEOUT,
            init_timeout=TIMEOUT,
            client_info=mcp_types.Implementation(name=NAME, version="1.0.0"),
            elicitation_handler=elicit,
            message_handler=self.events.on_message,
            log_handler=self.events.on_log,
        )

    async def connect(self, c):
        info = c.server_info
        return (info.name if info else None), c.instructions

    async def list_page(self, c, cursor):
        return [t.name for t in await c.list_tools()], None

    async def call(self, c, name, arguments, progress):
        r = await c.call_tool(name, arguments, timeout=TIMEOUT, progress_handler=progress, raise_on_error=False)
        return bool(r.is_error), text_of(r.content)


class Agent:
    """Runs one client session in its own task, one command at a time."""

    def __init__(self, flavour, url):
        self.events = Events()
        cls = FastMCPClient if flavour == "fastmcp" else SDKClient
        self.impl = cls(flavour, url, self.events)
        self.queue = asyncio.Queue()
        self.task = None
        self.ended = None  # why the session ended, once it has

    async def run_session(self, ready):
        try:
            async with self.impl.context() as c:
                name, instructions = await asyncio.wait_for(self.impl.connect(c), TIMEOUT)
                ready.set_result((name, instructions))
                while True:
                    fn, fut = await self.queue.get()
                    if fn is None:
                        fut.set_result({})
                        break
                    try:
                        fut.set_result(await asyncio.wait_for(fn(c), TIMEOUT + 10))
                    except Exception as err:
                        if not fut.done():
                            fut.set_result(failure(err))
        except BaseException as err:
            self.ended = err
            if not ready.done():
                ready.set_exception(err)
            while not self.queue.empty():
                _, fut = self.queue.get_nowait()
                if not fut.done():
                    fut.set_result(self.gone())
            if not isinstance(err, (Exception, asyncio.CancelledError)):
                raise

    def gone(self):
        why = failure(self.ended) if self.ended else {"message": "not connected"}
        return {**why, "ok": False, "message": "session ended: " + why.get("message", "")}

    async def submit(self, fn):
        if self.task is None or self.task.done():
            return self.gone()
        fut = asyncio.get_running_loop().create_future()
        await self.queue.put((fn, fut))
        done, _ = await asyncio.wait({fut, self.task}, return_when=asyncio.FIRST_COMPLETED)
        if fut.done():
            return fut.result()
        return self.gone()

    async def connect(self, cmd):
        ready = asyncio.get_running_loop().create_future()
        self.task = asyncio.create_task(self.run_session(ready))
        name, instructions = await ready
        n, sha = digest(instructions or "")
        return {"serverName": name, "instructionsLen": n, "instructionsSha256": sha}

    async def list(self, cmd):
        async def fn(c):
            names, cursor = [], None
            while True:
                page, cursor = await self.impl.list_page(c, cursor)
                names += page
                if not cursor:
                    return {"count": len(names), "names": names}

        return await self.submit(fn)

    async def call(self, cmd):
        progress_count = 0

        async def on_progress(progress, total, message):
            nonlocal progress_count
            progress_count += 1

        async def fn(c):
            on = on_progress if cmd.get("progress") else None
            is_error, text = await self.impl.call(c, cmd["name"], cmd.get("arguments") or {}, on)
            n, sha = digest(text)
            out = {"isError": is_error, "textLen": n, "textSha256": sha, "textHead": text[:200]}
            if cmd.get("progress"):
                out["progressCount"] = progress_count
            return out

        return await self.submit(fn)

    async def events_op(self, cmd):
        return dict(self.events.counts)

    async def wait_event(self, cmd):
        await self.events.wait(cmd["event"], int(cmd.get("count", 1)), int(cmd.get("timeoutMs", 10000)))
        return dict(self.events.counts)

    async def close(self, cmd):
        if self.task is None or self.task.done():
            return {}
        fut = asyncio.get_running_loop().create_future()
        await self.queue.put((None, fut))
        await asyncio.wait_for(self.task, TIMEOUT)
        return {}


async def main():
    if len(sys.argv) != 3 or sys.argv[1] not in ("sdk", "client-auto", "client-legacy", "fastmcp"):
        print("usage: client.py sdk|client-auto|client-legacy|fastmcp URL", file=sys.stderr)
        sys.exit(2)
    guard.take_stdout()
    guard.start_lifetime()
    agent = Agent(sys.argv[1], sys.argv[2])
    ops = {
        "connect": agent.connect,
        "list": agent.list,
        "call": agent.call,
        "events": agent.events_op,
        "waitEvent": agent.wait_event,
        "close": agent.close,
    }
    loop = asyncio.get_running_loop()
    while True:
        line = await loop.run_in_executor(None, sys.stdin.readline)
        if not line:
            os._exit(0)
        if not line.strip():
            continue
        start = time.monotonic()
        op = None
        try:
            cmd = json.loads(line)
            op = cmd.get("op")
            fn = ops.get(op)
            if fn is None:
                raise ValueError(f"unknown op {op}")
            out = await fn(cmd)
            out = {"ok": True, **out} if "ok" not in out else out
        except Exception as err:
            traceback.print_exc()
            out = failure(err)
        ms = int((time.monotonic() - start) * 1000)
        guard.say("RESULT " + json.dumps({"op": op, "ms": ms, **out}))
        if op == "close":
            os._exit(0)


if __name__ == "__main__":
    asyncio.run(main())

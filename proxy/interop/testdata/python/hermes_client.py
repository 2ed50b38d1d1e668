"""Hermes Agent 0.19.0's own MCP client, driven headless by the interop tests
with the line protocol of client.mjs and client.py:

    .venv/hermes/bin/python hermes_client.py URL

No model and no ~/.hermes: HERMES_HOME (a fresh directory; the test's, or a
temporary one) gets a config.yaml whose mcp_servers entry is what a Hermes
user writes,

    mcp_servers:
      SERVER_NAME: {url: URL, timeout: 30, connect_timeout: 15, keepalive_interval: 3600}

and the commands run what the agent loop runs:
    {"op":"connect"}   tools.mcp_tool.discover_mcp_tools(): connects and registers
                       the server's tools; answers serverName and the
                       instructions' length/sha256 from its initialize result,
                       or its connect error
    {"op":"list"}      the tools Hermes holds for the server (its tools/list at
                       connect, or the refresh after tools/list_changed): count
                       and names, in the server's order; no request is sent
    {"op":"call","name":N,"arguments":{}}
                       tools.registry.registry.dispatch("mcp__SERVER__N", args):
                       the agent loop's own handler (its circuit breaker, its
                       reconnect-and-retry on a dead session, its timeout). The
                       model reads the JSON string it returns: {"result": …} is
                       ok with that text (isError false); {"error": …} fails with
                       kind "hermes-error" and that text as message. Either way
                       text length/sha256/head describe the text, and raw holds
                       the returned string's head.
    {"op":"events"}    what Hermes logged so far: toolsChanged (it received
                       notifications/tools/list_changed), toolsRefreshed (it
                       re-listed the tools after one), reconnects (a call asked
                       for a transport reconnect), logs (server log messages)
    {"op":"waitEvent","event":E,"count":n,"timeoutMs":ms}
                       ok once events()[E] >= n, else a failure after ms
    {"op":"close"}     tools.mcp_tool.shutdown_mcp_servers(), then exits
Each answers one stdout line "RESULT <json>" with op, ok and ms.

Hermes sends the mcp SDK's default clientInfo (name "mcp"), whatever the
test calls the agent. When a server elicits, Hermes asks its user on the
terminal (tools.approval); this user answers ELICIT_ANSWER ("o": allow once,
the default; "d": deny). The process exits when stdin closes and after
INTEROP_LIFETIME_MS.
"""

import hashlib
import io
import json
import logging
import os
import sys
import tempfile
import threading
import time
import traceback

import guard

SERVER = os.environ.get("SERVER_NAME") or "interop"
TIMEOUT = int(os.environ.get("CALL_TIMEOUT_S") or 30)
CONNECT_TIMEOUT = int(os.environ.get("CONNECT_TIMEOUT_S") or 15)


def digest(s: str):
    b = s.encode("utf-8")
    return len(b), hashlib.sha256(b).hexdigest()


class Events(logging.Handler):
    """Counts what Hermes' MCP client logs it did."""

    patterns = {
        "toolsChanged": "received tools/list_changed notification",
        "toolsRefreshed": ("tools changed dynamically", "dynamically refreshed"),
        "reconnects": "requesting transport reconnect",
        "logs": "MCP server log [",
    }

    def __init__(self):
        super().__init__(level=logging.DEBUG)
        self.counts = {k: 0 for k in self.patterns}
        self.cond = threading.Condition()

    def emit(self, record):
        try:
            msg = record.getMessage()
        except Exception:
            return
        with self.cond:
            for name, pattern in self.patterns.items():
                for p in pattern if isinstance(pattern, tuple) else (pattern,):
                    if p in msg:
                        self.counts[name] += 1
            self.cond.notify_all()

    def snapshot(self):
        with self.cond:
            return dict(self.counts)

    def wait(self, name, count, timeout_ms):
        with self.cond:
            ok = self.cond.wait_for(lambda: self.counts.get(name, 0) >= count, timeout_ms / 1000)
            return ok, dict(self.counts)


def setup_home(url):
    home = os.environ.get("HERMES_HOME")
    if not home:
        home = tempfile.mkdtemp(prefix="hermes-home-")
        os.environ["HERMES_HOME"] = home
    import yaml

    config = {
        "mcp_servers": {
            SERVER: {
                "url": url,
                "timeout": TIMEOUT,
                "connect_timeout": CONNECT_TIMEOUT,
                "keepalive_interval": 3600,
            }
        }
    }
    with open(os.path.join(home, "config.yaml"), "w", encoding="utf-8") as f:
        yaml.safe_dump(config, f)


class Agent:
    def __init__(self):
        from tools import mcp_tool
        from tools.registry import registry

        self.mcp = mcp_tool
        self.registry = registry

    def server(self):
        with self.mcp._lock:
            return self.mcp._servers.get(SERVER)

    def connect(self, cmd):
        self.mcp.discover_mcp_tools()
        srv = self.server()
        if srv is None or srv.session is None:
            with self.mcp._lock:
                why = self.mcp._server_connect_errors.get(SERVER) or "not connected"
            return {"ok": False, "code": None, "kind": "hermes-connect", "message": why}
        init = srv.initialize_result
        n, sha = digest((init.instructions if init else None) or "")
        return {"serverName": init.serverInfo.name if init else None, "instructionsLen": n, "instructionsSha256": sha}

    def list(self, cmd):
        srv = self.server()
        if srv is None:
            return {"ok": False, "code": None, "kind": "hermes-connect", "message": "not connected"}
        names = [t.name for t in srv._tools]
        return {"count": len(names), "names": names}

    def call(self, cmd):
        name = self.mcp.mcp_prefixed_tool_name(SERVER, cmd["name"])
        raw = self.registry.dispatch(name, cmd.get("arguments") or {})
        if not isinstance(raw, str):
            raw = json.dumps(raw)
        try:
            parsed = json.loads(raw)
        except ValueError:
            parsed = {"result": raw}
        if not isinstance(parsed, dict):
            parsed = {"result": raw}
        if "error" in parsed:
            text = str(parsed["error"])
            out = {"ok": False, "code": None, "kind": "hermes-error", "message": text[:2000]}
        else:
            result = parsed.get("result", "")
            text = result if isinstance(result, str) else json.dumps(result)
            out = {"isError": False}
        n, sha = digest(text)
        out.update({"textLen": n, "textSha256": sha, "textHead": text[:200], "raw": raw[:500]})
        return out

    def close(self, cmd):
        self.mcp.shutdown_mcp_servers()
        return {}


def main():
    if len(sys.argv) != 2:
        print("usage: hermes_client.py URL", file=sys.stderr)
        sys.exit(2)
    guard.take_stdout()
    guard.start_lifetime()
    commands = os.fdopen(os.dup(0), "r", encoding="utf-8")
    # Hermes' terminal prompts read sys.stdin: the user's answers, not the
    # test's commands.
    sys.stdin = io.StringIO(((os.environ.get("ELICIT_ANSWER") or "o") + "\n") * 1000)
    setup_home(sys.argv[1])

    logging.basicConfig(level=logging.INFO, stream=sys.stderr, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    events = Events()
    logging.getLogger().addHandler(events)

    agent = Agent()
    ops = {
        "connect": agent.connect,
        "list": agent.list,
        "call": agent.call,
        "events": lambda cmd: events.snapshot(),
        "close": agent.close,
    }

    def wait_event(cmd):
        ok, counts = events.wait(cmd["event"], int(cmd.get("count", 1)), int(cmd.get("timeoutMs", 10000)))
        if not ok:
            return {"ok": False, "code": None, "kind": "timeout", "message": f"{cmd['event']} below {cmd.get('count', 1)}: {counts}", **counts}
        return counts

    ops["waitEvent"] = wait_event

    for line in commands:
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
            out = fn(cmd)
            out = {"ok": True, **out} if "ok" not in out else out
        except Exception as err:
            traceback.print_exc()
            out = {"ok": False, "code": None, "kind": type(err).__name__, "message": str(err)[:2000]}
        ms = int((time.monotonic() - start) * 1000)
        guard.say("RESULT " + json.dumps({"op": op, "ms": ms, **out}))
        if op == "close":
            break
    os._exit(0)


if __name__ == "__main__":
    main()

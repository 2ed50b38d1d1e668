// A stateful MCP server on the TypeScript SDK v1 (@modelcontextprotocol/sdk),
// Streamable HTTP with SSE answers (enableJsonResponse false), on
// 127.0.0.1:$PORT (0 = any; guard.mjs prints the port). Run with
// node --import ./guard.mjs v1server.mjs.
//
// What it serves, each piece for one interop scenario:
//   - instructions of INSTRUCTIONS_BYTES bytes (default 12288, UTF-8 with
//     multi-byte characters), so the initialize answer is one SSE event well
//     over 4 KiB;
//   - FILLER_TOOLS filler tools (default 40), so tools/list is over 4 KiB;
//   - "work" (no annotations: not replay-safe): appends "<tag> <pid>" to
//     COUNT_FILE when it starts, sends a log notification on the call's SSE
//     stream if notify is set, then sleeps ms milliseconds, so the test can
//     kill the server mid-call (before or after the answer's first event)
//     and count executions across server lives;
//   - "big" (readOnlyHint): a text result of exactly bytes bytes, sent as one
//     SSE event;
//   - "echo" (readOnlyHint);
//   - with POLL_TOOL=1, "poll" (no annotations: not replay-safe): SSE
//     polling (MCP 2025-11-25): records one execution like work, then times
//     times sends a log notification "poll <tag> <i>" on the call's stream
//     and closes that stream (transport.closeSSEStream: the client comes
//     back with GET and Last-Event-ID after the retry interval), and the
//     session's GET stream too when standalone is set
//     (closeStandaloneSSEStream), each everyMs apart; then answers
//     "polled <tag>". It needs EVENT_STORE=1.
// With EVENT_STORE=1 each session keeps its events (the SDK's
// InMemoryEventStore): answer streams carry event ids, and a GET with
// Last-Event-ID resumes one. RETRY_MS sets the transport's retryInterval
// (the retry: field of its priming events).
// With REQUEST_LOG=1 every HTTP request prints one line
// "REQUEST <HTTP method> <JSON-RPC method, or -> <Last-Event-ID, or ->"
// before it is served, so a test can count what reached the server.
// Every initialize prints "INITIALIZE <clientInfo.name>" on stdout, so a test
// can count the sessions a server life saw (one heal = one initialize).
// An unknown Mcp-Session-Id gets 400 "Bad Request: No valid session ID
// provided", as the SDK's own examples and server-everything answer.
import http from "node:http";
import fs from "node:fs";
import { randomUUID } from "node:crypto";
import { McpServer } from "@modelcontextprotocol/sdk/server/mcp.js";
import { StreamableHTTPServerTransport } from "@modelcontextprotocol/sdk/server/streamableHttp.js";
import { InMemoryEventStore } from "@modelcontextprotocol/sdk/examples/shared/inMemoryEventStore.js";
import { z } from "zod";

const port = Number(process.env.PORT || 0);
const countFile = process.env.COUNT_FILE || "";
const instructionsBytes = Number(process.env.INSTRUCTIONS_BYTES || 12288);
const fillerTools = Number(process.env.FILLER_TOOLS || 40);
const eventStore = process.env.EVENT_STORE === "1";
const retryMs = process.env.RETRY_MS === undefined || process.env.RETRY_MS === "" ? undefined : Number(process.env.RETRY_MS);
const requestLog = process.env.REQUEST_LOG === "1";
const pollTool = process.env.POLL_TOOL === "1";

// instructions returns exactly n bytes of UTF-8: numbered lines mixing ASCII
// with 2- and 3-byte characters, so a cut anywhere shows in length and hash.
export function instructions(n) {
  let s = "";
  for (let i = 0; Buffer.byteLength(s) < n; i++) {
    s += `${String(i).padStart(5, "0")} mcpheal interop: café naïve ✓ résumé — keep every byte\n`;
  }
  const b = Buffer.from(s).subarray(0, n);
  // Do not end inside a multi-byte character: pad with ASCII instead.
  let end = n;
  while (end > 0 && (b[end - 1] & 0xc0) === 0x80) end--;
  if (end > 0 && b[end - 1] >= 0xc0) end--;
  return b.subarray(0, end).toString("utf8") + ".".repeat(n - end);
}

// bigText returns n pseudo-random ASCII letters and digits (deterministic).
function bigText(n) {
  const alphabet = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789";
  const b = Buffer.allocUnsafe(n);
  let x = 2463534242;
  for (let i = 0; i < n; i++) {
    x ^= x << 13; x >>>= 0;
    x ^= x >>> 17;
    x ^= x << 5; x >>>= 0;
    b[i] = alphabet.charCodeAt(x % alphabet.length);
  }
  return b.toString("latin1");
}

const sleep = (ms) => new Promise((r) => setTimeout(r, ms));
const text = (t) => ({ content: [{ type: "text", text: t }] });

function newServer() {
  const s = new McpServer(
    { name: "mcpheal-interop-v1", version: "1.0.0" },
    { instructions: instructions(instructionsBytes), capabilities: { logging: {} } },
  );
  s.registerTool("work", {
    description: "Records one execution in the count file, then sleeps ms milliseconds. Not replay-safe.",
    inputSchema: { tag: z.string(), ms: z.number().int().min(0).optional(), notify: z.boolean().optional() },
  }, async ({ tag, ms, notify }, extra) => {
    if (countFile) fs.appendFileSync(countFile, `${tag} ${process.pid}\n`);
    if (notify) {
      await extra.sendNotification({ method: "notifications/message", params: { level: "info", data: `work ${tag} started` } });
    }
    if (ms) await sleep(ms);
    return text(`done ${tag}`);
  });
  if (pollTool) s.registerTool("poll", {
    description: "Closes its answer stream on purpose (SSE polling) times times, everyMs apart, then answers. Not replay-safe.",
    inputSchema: { tag: z.string(), times: z.number().int().min(0), everyMs: z.number().int().min(0), standalone: z.boolean().optional() },
  }, async ({ tag, times, everyMs, standalone }, extra) => {
    if (countFile) fs.appendFileSync(countFile, `${tag} ${process.pid}\n`);
    for (let i = 1; i <= times; i++) {
      await extra.sendNotification({ method: "notifications/message", params: { level: "info", data: `poll ${tag} ${i}` } });
      extra.closeSSEStream?.();
      if (standalone) extra.closeStandaloneSSEStream?.();
      await sleep(everyMs);
    }
    return text(`polled ${tag}`);
  });
  s.registerTool("big", {
    description: "Returns a text result of exactly bytes bytes.",
    inputSchema: { bytes: z.number().int().min(0) },
    annotations: { readOnlyHint: true },
  }, async ({ bytes }) => text(bigText(bytes)));
  s.registerTool("echo", {
    description: "Echoes text.",
    inputSchema: { text: z.string() },
    annotations: { readOnlyHint: true },
  }, async ({ text: t }) => text(t));
  for (let i = 0; i < fillerTools; i++) {
    const n = String(i).padStart(2, "0");
    s.registerTool(`filler_${n}`, {
      description: `Filler tool ${n}: it exists so that the tools/list answer is larger than one 4 KiB buffer. It does nothing useful.`,
      inputSchema: { value: z.string().optional() },
      annotations: { readOnlyHint: true },
    }, async () => text(`filler ${n}`));
  }
  return s;
}

const transports = new Map();

const httpServer = http.createServer(async (req, res) => {
  try {
    if (!req.url.startsWith("/mcp")) {
      res.writeHead(404).end();
      return;
    }
    let body;
    if (req.method === "POST") {
      const chunks = [];
      for await (const c of req) chunks.push(c);
      body = JSON.parse(Buffer.concat(chunks).toString("utf8"));
      if (body?.method === "initialize") {
        process.stdout.write(`INITIALIZE ${body.params?.clientInfo?.name}\n`);
      }
    }
    if (requestLog) {
      const method = typeof body?.method === "string" ? body.method : "-";
      process.stdout.write(`REQUEST ${req.method} ${method} ${req.headers["last-event-id"] || "-"}\n`);
    }
    const sid = req.headers["mcp-session-id"];
    let t = sid ? transports.get(sid) : undefined;
    if (!t && !sid && req.method === "POST") {
      t = new StreamableHTTPServerTransport({
        sessionIdGenerator: () => randomUUID(),
        enableJsonResponse: false,
        eventStore: eventStore ? new InMemoryEventStore() : undefined,
        retryInterval: retryMs,
        onsessioninitialized: (id) => transports.set(id, t),
      });
      t.onclose = () => { if (t.sessionId) transports.delete(t.sessionId); };
      await newServer().connect(t);
    }
    if (!t) {
      res.writeHead(400, { "Content-Type": "application/json" });
      res.end(JSON.stringify({ jsonrpc: "2.0", error: { code: -32000, message: "Bad Request: No valid session ID provided" }, id: null }));
      return;
    }
    await t.handleRequest(req, res, body);
  } catch (err) {
    console.error("v1server:", err);
    if (!res.headersSent) res.writeHead(500).end();
  }
});
httpServer.listen(port, "127.0.0.1");

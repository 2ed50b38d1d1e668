// A session-era MCP server on the TypeScript SDK v1 (@modelcontextprotocol/sdk),
// stateful Streamable HTTP with SSE answers, on 127.0.0.1:$PORT (0 = any;
// guard.mjs prints the port), for the held-route tests: its tools ask the
// client for input with extra.sendRequest, i.e. as requests related to the
// tools/call, which ride the call's own SSE answer. Run with
// node --import ./guard.mjs v1inputs.mjs.
//   - roots-in-call {}: roots/list, returns "roots <JSON of the roots>";
//   - all-three {}: elicitation/create, sampling/createMessage and roots/list
//     in parallel, returns "all <JSON of the three answers>";
//   - slow {tag, ms}: sleeps ms milliseconds in 100 ms steps, each after a
//     notifications/progress when the request has a progressToken, stopping
//     when its request is cancelled (notifications/cancelled aborts
//     extra.signal); prints "CANCELLED slow <tag>" or "COMPLETED slow <tag>"
//     on stdout.
// An unknown Mcp-Session-Id gets 404 -32001 "Session not found", as the
// spec has a server answer for a session it ended.
import http from "node:http";
import { randomUUID } from "node:crypto";
import { McpServer } from "@modelcontextprotocol/sdk/server/mcp.js";
import { StreamableHTTPServerTransport } from "@modelcontextprotocol/sdk/server/streamableHttp.js";
import { ListRootsResultSchema, ElicitResultSchema, CreateMessageResultSchema } from "@modelcontextprotocol/sdk/types.js";
import { z } from "zod";

const say = (line) => process.stdout.write(`${line}\n`);
const text = (t) => ({ content: [{ type: "text", text: t }] });

function newServer() {
  const s = new McpServer({ name: "mcpheal-interop-v1inputs", version: "1.0.0" }, { capabilities: { logging: {} } });
  s.registerTool("roots-in-call", { description: "roots/list related to this call", inputSchema: {} }, async (_a, extra) => {
    const r = await extra.sendRequest({ method: "roots/list" }, ListRootsResultSchema);
    return text(`roots ${JSON.stringify(r.roots)}`);
  });
  s.registerTool("all-three", { description: "elicitation + sampling + roots in parallel", inputSchema: {} }, async (_a, extra) => {
    const [e, m, r] = await Promise.all([
      extra.sendRequest({ method: "elicitation/create", params: { message: "ok?", requestedSchema: { type: "object", properties: { name: { type: "string" } } } } }, ElicitResultSchema),
      extra.sendRequest({ method: "sampling/createMessage", params: { messages: [{ role: "user", content: { type: "text", text: "hi" } }], maxTokens: 5 } }, CreateMessageResultSchema),
      extra.sendRequest({ method: "roots/list" }, ListRootsResultSchema),
    ]);
    return text(`all ${JSON.stringify({ e, m, r })}`);
  });
  s.registerTool("slow", { description: "sleeps ms unless cancelled", inputSchema: { tag: z.string(), ms: z.number() } }, async ({ tag, ms }, extra) => {
    const token = extra._meta?.progressToken;
    for (let t = 0; t < ms; t += 100) {
      if (extra.signal.aborted) break;
      if (token !== undefined) {
        await extra.sendNotification({ method: "notifications/progress", params: { progressToken: token, progress: t, total: ms } });
      }
      await new Promise((r) => setTimeout(r, 100));
    }
    say(`${extra.signal.aborted ? "CANCELLED" : "COMPLETED"} slow ${tag}`);
    return text(extra.signal.aborted ? "cancelled" : "slept");
  });
  return s;
}

const transports = new Map();
http.createServer(async (req, res) => {
  try {
    let body;
    if (req.method === "POST") {
      const chunks = [];
      for await (const c of req) chunks.push(c);
      body = JSON.parse(Buffer.concat(chunks).toString("utf8"));
    }
    const sid = req.headers["mcp-session-id"];
    let t = sid ? transports.get(sid) : undefined;
    if (!t && !sid && req.method === "POST") {
      t = new StreamableHTTPServerTransport({ sessionIdGenerator: () => randomUUID(), onsessioninitialized: (id) => transports.set(id, t) });
      t.onclose = () => { if (t.sessionId) transports.delete(t.sessionId); };
      await newServer().connect(t);
    }
    if (!t) {
      res.writeHead(404, { "content-type": "application/json" }).end(JSON.stringify({ jsonrpc: "2.0", error: { code: -32001, message: "Session not found" }, id: null }));
      return;
    }
    await t.handleRequest(req, res, body);
  } catch (err) {
    console.error("v1inputs:", err);
    if (!res.headersSent) res.writeHead(500).end();
  }
}).listen(Number(process.env.PORT || 0), "127.0.0.1");

// An MCP server that speaks only protocol revision 2026-07-28, on the
// TypeScript SDK v2 (@modelcontextprotocol/server): createMcpHandler with
// legacy 'reject', so a session-era client (initialize, Mcp-Session-Id, GET
// stream) gets HTTP 400 -32022 at its first request. LEGACY=stateless serves
// the same tools dual-era instead (the SDK's default), for a control.
// Streamable HTTP on 127.0.0.1:$PORT (0 = any; guard.mjs prints the port).
// Run with node --import ./guard.mjs eraserver.mjs.
//
// createMcpHandler is a web-standard fetch handler; the node:http adapter
// below feeds it. Closing the HTTP response before it ends aborts the
// Request's signal: on 2026-07-28 that is how a client cancels a request
// (spec basic/transports/streamable-http, Cancellation), and the tool's
// ctx.mcpReq.signal fires.
//
// Tools, each for one bridge scenario:
//   - echo {text}: returns text;
//   - work {tag, ms?}: appends "<tag> <pid>" to COUNT_FILE, then sleeps ms
//     milliseconds, returns "done <tag>" (not replay-safe: the test counts
//     executions);
//   - progress {steps, delayMs?}: per step, logs "step N" at info (sent only
//     when the request's _meta names a log level at or below info) and, when
//     the request has _meta.progressToken, sends notifications/progress;
//     returns "done <steps>";
//   - confirm {}: answers an InputRequiredResult asking for a form
//     elicitation {ok: boolean} with requestState "confirm-round1"; on the
//     retry returns "confirmed <JSON of the accepted content>" (isError if
//     the retry did not echo requestState);
//   - sample {prompt}: answers an InputRequiredResult asking for
//     sampling/createMessage of prompt; on the retry returns
//     "sampled <text of the client's answer>";
//   - slow {ms, tag?}: sleeps ms milliseconds unless cancelled, returns "slept".
// Resource test://r1 (text "r1"). Capabilities: tools.listChanged,
// resources.subscribe and listChanged, logging.
//
// Stdout, one line per event the tests count:
//   DISCOVER <clientInfo.name>       a server/discover
//   INITIALIZE <clientInfo.name>     a legacy initialize (refused unless LEGACY=stateless)
//   LISTEN <uri,uri,…>               a subscriptions/listen, with its resourceSubscriptions
//   CALL <tool>                      a tools/call (each MRTR round is one)
//   CANCELLED <tool> [<tag>]         a tool's request was aborted before it finished
//                                    (tag: the call's tag argument, if any)
//   POST <method>                    every JSON-RPC message posted (requests and notifications)
//   HTTP <method>                    every request that is not a POST (GET, DELETE)
//   NOTIFIED <what>                  a stdin command was published on the event bus
// Stdin commands, one per line: "notify-resource <uri>" publishes
// notifications/resources/updated to the listen streams that subscribe to
// uri; "notify-tools" publishes notifications/tools/list_changed. (Listen
// streams are fed only by handler.notify, never by a per-request McpServer.)
import http from "node:http";
import fs from "node:fs";
import readline from "node:readline";
import { createMcpHandler, McpServer, inputRequired, acceptedContent, inputResponse } from "@modelcontextprotocol/server";
import * as z from "zod";

const port = Number(process.env.PORT || 0);
const countFile = process.env.COUNT_FILE || "";
const legacy = process.env.LEGACY || "reject";

const say = (line) => process.stdout.write(`${line}\n`);
const text = (t) => ({ content: [{ type: "text", text: t }] });

// sleep resolves after ms, or at once when signal aborts; it says whether
// it was aborted.
function sleep(ms, signal) {
  return new Promise((resolve) => {
    if (signal?.aborted) return resolve(true);
    const onAbort = () => { clearTimeout(t); resolve(true); };
    const t = setTimeout(() => { signal?.removeEventListener("abort", onAbort); resolve(false); }, ms);
    signal?.addEventListener("abort", onAbort, { once: true });
  });
}

// tool registers a tool whose handler prints CANCELLED <name> [<tag>] if
// its request is aborted before it returns.
function tool(s, name, config, fn) {
  s.registerTool(name, config, async (args, ctx) => {
    const signal = ctx.mcpReq.signal;
    const tag = typeof args?.tag === "string" ? ` ${args.tag}` : "";
    const onAbort = () => say(`CANCELLED ${name}${tag}`);
    signal.addEventListener("abort", onAbort, { once: true });
    try {
      return await fn(args, ctx);
    } finally {
      signal.removeEventListener("abort", onAbort);
    }
  });
}

// newServer builds the McpServer for one request: createMcpHandler wants a
// fresh instance per request.
function newServer() {
  const s = new McpServer({ name: "mcpheal-interop-era", version: "1.0.0" }, {
    capabilities: { tools: { listChanged: true }, resources: { subscribe: true, listChanged: true }, logging: {} },
    instructions: "A 2026-07-28-only server for mcpheal's bridge tests.",
  });
  tool(s, "echo", { description: "Echoes text.", inputSchema: z.object({ text: z.string() }) },
    async ({ text: t }) => text(t));
  tool(s, "work", {
    description: "Records one execution in the count file, then sleeps ms milliseconds. Not replay-safe.",
    inputSchema: z.object({ tag: z.string(), ms: z.number().int().min(0).optional() }),
  }, async ({ tag, ms }, ctx) => {
    if (countFile) fs.appendFileSync(countFile, `${tag} ${process.pid}\n`);
    if (ms) await sleep(ms, ctx.mcpReq.signal);
    return text(`done ${tag}`);
  });
  tool(s, "progress", {
    description: "Logs and reports progress for each of steps steps.",
    inputSchema: z.object({ steps: z.number().int().min(1), delayMs: z.number().int().min(0).optional() }),
  }, async ({ steps, delayMs }, ctx) => {
    const token = ctx.mcpReq._meta?.progressToken;
    for (let i = 1; i <= steps; i++) {
      await ctx.mcpReq.log("info", `step ${i}`);
      if (token !== undefined) {
        await ctx.mcpReq.notify({ method: "notifications/progress", params: { progressToken: token, progress: i, total: steps } });
      }
      if (delayMs && await sleep(delayMs, ctx.mcpReq.signal)) break;
    }
    return text(`done ${steps}`);
  });
  const confirmSchema = z.object({ ok: z.boolean() });
  tool(s, "confirm", { description: "Asks the user to confirm (form elicitation).", inputSchema: z.object({}) },
    async (_args, ctx) => {
      const content = acceptedContent(ctx.mcpReq.inputResponses, "confirm");
      if (!content) {
        return inputRequired({
          inputRequests: { confirm: inputRequired.elicit({ message: "Confirm?", requestedSchema: confirmSchema }) },
          requestState: "confirm-round1",
        });
      }
      const state = ctx.mcpReq.requestState();
      if (state !== "confirm-round1") {
        return { ...text(`requestState ${JSON.stringify(state)}, want "confirm-round1"`), isError: true };
      }
      return text(`confirmed ${JSON.stringify(content)}`);
    });
  tool(s, "sample", {
    description: "Asks the client's model (sampling/createMessage).",
    inputSchema: z.object({ prompt: z.string() }),
  }, async ({ prompt }, ctx) => {
    const v = inputResponse(ctx.mcpReq.inputResponses, "answer");
    if (v.kind !== "sampling") {
      return inputRequired({
        inputRequests: {
          answer: inputRequired.createMessage({ messages: [{ role: "user", content: { type: "text", text: prompt } }], maxTokens: 50 }),
        },
      });
    }
    const c = v.result.content;
    const answer = Array.isArray(c) ? c.filter((p) => p.type === "text").map((p) => p.text).join("") : c?.text;
    return text(`sampled ${answer}`);
  });
  tool(s, "slow", {
    description: "Sleeps ms milliseconds unless cancelled.",
    inputSchema: z.object({ ms: z.number().int().min(0), tag: z.string().optional() }),
  },
    async ({ ms }, ctx) => {
      const aborted = await sleep(ms, ctx.mcpReq.signal);
      return text(aborted ? "cancelled" : "slept");
    });
  s.registerResource("r1", "test://r1", { mimeType: "text/plain" }, async (uri) => ({ contents: [{ uri: uri.href, text: "r1" }] }));
  return s;
}

const handler = createMcpHandler(newServer, { legacy, onerror: (e) => console.error("eraserver:", e?.message ?? e) });

// report prints the events one posted JSON-RPC message stands for.
function report(msg) {
  if (!msg || typeof msg !== "object" || typeof msg.method !== "string") return;
  say(`POST ${msg.method}`);
  const p = msg.params ?? {};
  switch (msg.method) {
    case "server/discover":
      say(`DISCOVER ${p._meta?.["io.modelcontextprotocol/clientInfo"]?.name ?? ""}`);
      break;
    case "initialize":
      say(`INITIALIZE ${p.clientInfo?.name ?? ""}`);
      break;
    case "subscriptions/listen":
      say(`LISTEN ${(p.notifications?.resourceSubscriptions ?? []).join(",")}`);
      break;
    case "tools/call":
      say(`CALL ${p.name}`);
      break;
  }
}

const httpServer = http.createServer(async (req, res) => {
  const ac = new AbortController();
  // Closing the response before it ends is cancellation (see the top).
  res.on("close", () => { if (!res.writableFinished) ac.abort(); });
  try {
    let body;
    if (req.method === "POST") {
      const chunks = [];
      for await (const c of req) chunks.push(c);
      body = Buffer.concat(chunks);
      try {
        const msg = JSON.parse(body.toString("utf8"));
        for (const m of Array.isArray(msg) ? msg : [msg]) report(m);
      } catch {
        // Not JSON: the handler answers it.
      }
    } else {
      say(`HTTP ${req.method}`);
    }
    const headers = new Headers();
    for (const [k, v] of Object.entries(req.headers)) {
      if (Array.isArray(v)) for (const x of v) headers.append(k, x);
      else if (v !== undefined) headers.set(k, v);
    }
    const r = await handler.fetch(new Request(`http://127.0.0.1:${port}${req.url}`, {
      method: req.method, headers, body, signal: ac.signal,
    }));
    res.writeHead(r.status, Object.fromEntries(r.headers));
    if (!r.body) {
      res.end();
      return;
    }
    const reader = r.body.getReader();
    ac.signal.addEventListener("abort", () => reader.cancel().catch(() => {}), { once: true });
    for (;;) {
      const { done, value } = await reader.read();
      if (done) break;
      res.write(value);
    }
    res.end();
  } catch (err) {
    if (ac.signal.aborted) return; // the client went away
    console.error("eraserver:", err);
    if (!res.headersSent) res.writeHead(500);
    res.end();
  }
});
httpServer.listen(port, "127.0.0.1");

const commands = readline.createInterface({ input: process.stdin, crlfDelay: Infinity });
commands.on("line", (line) => {
  const [cmd, arg] = line.trim().split(/\s+/, 2);
  switch (cmd) {
    case "notify-resource":
      handler.notify.resourceUpdated(arg);
      say(`NOTIFIED resource ${arg}`);
      break;
    case "notify-tools":
      handler.notify.toolsChanged();
      say("NOTIFIED tools");
      break;
    case "":
      break;
    default:
      console.error(`eraserver: unknown command ${JSON.stringify(line)}`);
  }
});

// A line-driven MCP client for the interop tests:
//   node client.mjs v1|v2 URL
// v1 is @modelcontextprotocol/sdk's Client + StreamableHTTPClientTransport,
// v2 is @modelcontextprotocol/client's. Each stdin line is one JSON command;
// each command answers exactly one stdout line "RESULT <json>":
//   {"op":"connect"}                      → serverName, instructions length/sha256
//   {"op":"list"}                         → count and names of all tools (every page)
//   {"op":"call","name":N,"arguments":{}} → isError, text length/sha256, text head
//       "progress":true       also asks for progress; the answer adds progressCount,
//                             the notifications/progress the call received
//       "cancelAfterMs":ms    cancels the call after ms (the SDK sends
//                             notifications/cancelled); the answer is a failure
//   {"op":"subscribe","uri":U}            → resources/subscribe
//   {"op":"unsubscribe","uri":U}          → resources/unsubscribe
//   {"op":"updates"}                      → updates: the URIs of every
//                                           notifications/resources/updated so far
//   {"op":"setLevel","level":L}           → logging/setLevel
//   {"op":"logs"}                         → logs: how many notifications/message so far
//   {"op":"close"}                        → closes the client and exits
// Every answer carries ms, the time the operation took.
// A failure answers {"ok":false,"code":…,"message":…,"kind":…}: code is the
// JSON-RPC error code for a JSON-RPC error (an HTTP status for an HTTP
// failure, as the SDK reports it). Text lengths are UTF-8 bytes.
//
// With VERSION_NEGOTIATION=auto the v2 client negotiates its era
// (versionNegotiation: { mode: "auto" }: server/discover first, the
// session era's initialize as the fallback); without it, the SDK's default
// (the session era). connect answers version: the protocol version it
// speaks.
//
// With CLIENT_CAPABILITIES=1 the client declares sampling, elicitation (form)
// and roots, and answers the server's requests: elicitation/create accepts
// {ok: true}, sampling/createMessage answers the text "sampled-by-agent",
// roots/list lists one root. Without it the client declares nothing, as
// before.
import { createHash } from "node:crypto";
import readline from "node:readline";

const [flavour, url] = process.argv.slice(2);
const sdk = flavour === "v2"
  ? await import("@modelcontextprotocol/client")
  : {
    ...(await import("@modelcontextprotocol/sdk/client/index.js")),
    ...(await import("@modelcontextprotocol/sdk/client/streamableHttp.js")),
  };
// v1 names requests and notifications by zod schema, v2 by method.
const v1types = flavour === "v2" ? {} : await import("@modelcontextprotocol/sdk/types.js");
const byMethod = (method, v1Schema) => (flavour === "v2" ? method : v1types[v1Schema]);
if (!url || !sdk.Client) {
  console.error("usage: node client.mjs v1|v2 URL");
  process.exit(2);
}

const timeout = Number(process.env.REQUEST_TIMEOUT_MS || 15000);
const withCapabilities = process.env.CLIENT_CAPABILITIES === "1";
const clientOptions = {};
if (withCapabilities) clientOptions.capabilities = { sampling: {}, elicitation: { form: {} }, roots: {} };
if (process.env.VERSION_NEGOTIATION) clientOptions.versionNegotiation = { mode: process.env.VERSION_NEGOTIATION };
const client = new sdk.Client(
  { name: process.env.CLIENT_NAME || `mcpheal-interop-${flavour}`, version: "1.0.0" },
  Object.keys(clientOptions).length ? clientOptions : undefined,
);
if (withCapabilities) {
  client.setRequestHandler(byMethod("elicitation/create", "ElicitRequestSchema"),
    async () => ({ action: "accept", content: { ok: true } }));
  client.setRequestHandler(byMethod("sampling/createMessage", "CreateMessageRequestSchema"),
    async () => ({ role: "assistant", model: "test", content: { type: "text", text: "sampled-by-agent" } }));
  client.setRequestHandler(byMethod("roots/list", "ListRootsRequestSchema"),
    async () => ({ roots: [{ uri: "file:///tmp/mcpheal-interop", name: "interop" }] }));
}
const updates = [];
let logs = 0;
client.setNotificationHandler(byMethod("notifications/resources/updated", "ResourceUpdatedNotificationSchema"),
  (n) => { updates.push(n.params.uri); });
client.setNotificationHandler(byMethod("notifications/message", "LoggingMessageNotificationSchema"),
  () => { logs++; });
const transport = new sdk.StreamableHTTPClientTransport(new URL(url));

const digest = (s) => ({
  len: Buffer.byteLength(s, "utf8"),
  sha256: createHash("sha256").update(s, "utf8").digest("hex"),
});

function callTool(params, extra = {}) {
  const options = { timeout, ...extra };
  // v1: callTool(params, resultSchema, options); v2: callTool(params, options).
  return flavour === "v2"
    ? client.callTool(params, options)
    : client.callTool(params, undefined, options);
}

const ops = {
  async connect() {
    await client.connect(transport, { timeout });
    const ins = digest(client.getInstructions() ?? "");
    return {
      serverName: client.getServerVersion()?.name,
      version: client.getNegotiatedProtocolVersion?.() ?? transport.protocolVersion ?? null,
      instructionsLen: ins.len,
      instructionsSha256: ins.sha256,
    };
  },
  async list() {
    const names = [];
    let cursor;
    do {
      const r = await client.listTools(cursor ? { cursor } : undefined, { timeout });
      for (const t of r.tools) names.push(t.name);
      cursor = r.nextCursor;
    } while (cursor);
    return { count: names.length, names };
  },
  async call(cmd) {
    const extra = {};
    let progressCount = 0;
    if (cmd.progress) extra.onprogress = () => { progressCount++; };
    if (cmd.cancelAfterMs !== undefined) {
      const ac = new AbortController();
      setTimeout(() => ac.abort(new Error(`cancelled after ${cmd.cancelAfterMs} ms`)), cmd.cancelAfterMs);
      extra.signal = ac.signal;
    }
    const r = await callTool({ name: cmd.name, arguments: cmd.arguments ?? {} }, extra);
    const t = (r.content ?? []).filter((c) => c.type === "text").map((c) => c.text).join("");
    const d = digest(t);
    const out = { isError: !!r.isError, textLen: d.len, textSha256: d.sha256, textHead: t.slice(0, 200) };
    if (cmd.progress) out.progressCount = progressCount;
    return out;
  },
  async subscribe(cmd) {
    await client.subscribeResource({ uri: cmd.uri }, { timeout });
    return {};
  },
  async unsubscribe(cmd) {
    await client.unsubscribeResource({ uri: cmd.uri }, { timeout });
    return {};
  },
  async updates() {
    return { updates: [...updates] };
  },
  async setLevel(cmd) {
    await client.setLoggingLevel(cmd.level, { timeout });
    return {};
  },
  async logs() {
    return { logs };
  },
  async close() {
    await client.close();
    return {};
  },
};

function failure(err) {
  let code = err?.code;
  if (typeof code !== "number") code = null;
  return { ok: false, code, message: String(err?.message ?? err).slice(0, 2000), kind: err?.constructor?.name };
}

const rl = readline.createInterface({ input: process.stdin, crlfDelay: Infinity });
for await (const line of rl) {
  if (!line.trim()) continue;
  let out;
  let cmd;
  const start = Date.now();
  try {
    cmd = JSON.parse(line);
    const fn = ops[cmd.op];
    if (!fn) throw new Error(`unknown op ${cmd.op}`);
    out = { ok: true, ...(await fn(cmd)) };
  } catch (err) {
    out = failure(err);
  }
  process.stdout.write(`RESULT ${JSON.stringify({ op: cmd?.op, ms: Date.now() - start, ...out })}\n`);
  if (cmd?.op === "close") break;
}
process.exit(0);

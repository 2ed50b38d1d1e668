// A line-driven MCP client for the held-route tests: the TS SDK v2 client
// (@modelcontextprotocol/client) pinned to MCP 2026-07-28, the way an agent
// of that revision is built:
//   new Client(info, { versionNegotiation: { mode: { pin: "2026-07-28" } } })
// It never falls back to the session era: against a session-era server it
// fails at connect (ERA_NEGOTIATION_FAILED).
//   node client2026.mjs URL
// Each stdin line is one JSON command; each command answers exactly one
// stdout line "RESULT <json>":
//   {"op":"connect"}                      → serverName, era, version (the
//                                           negotiated protocol version),
//                                           instructionsLen, sessionId (the
//                                           transport's, null if none)
//   {"op":"list"}                         → count and names of all tools (every page)
//   {"op":"call","name":N,"arguments":{}} → isError, textLen, textHead (the first
//                                           2000 characters of the text content)
//       "progress":true       also asks for progress; progressCount is what it received
//                             (in a failure's answer too)
//       "cancelAfterMs":ms    aborts the call after ms (an AbortSignal: the SDK
//                             closes the request's connection); the answer is a failure
//   {"op":"lists"}                        → prompts, resources, templates: the names
//                                           (URI templates) of all prompts, resources
//                                           and resource templates (every page)
//   {"op":"read","uri":U}                 → resources/read: textLen, textHead of its text
//   {"op":"listen","resourceSubscriptions":[U…],"toolsListChanged":b,"resourcesListChanged":b}
//                                         → subscriptions/listen; honored is the
//                                           filter the server acknowledged
//   {"op":"unlisten"}                     → closes every open listen
//   {"op":"updates"}                      → updates: the URIs of every
//                                           notifications/resources/updated so far
//   {"op":"inputs"}                       → inputs: the server's requests the handlers
//                                           answered so far, in order ({method, text})
//   {"op":"close"}                        → closes the client and exits
// Every answer carries ms, the time the operation took.
// A failure answers {"ok":false,"code":…,"sdkCode":…,"message":…,"kind":…}:
// code is the JSON-RPC error code when it is a number, sdkCode the SDK's own
// error code when it is a string (ERA_NEGOTIATION_FAILED, REQUEST_TIMEOUT, …).
//
// The client declares sampling, elicitation (form) and roots, and answers the
// server's requests (which reach it as InputRequiredResults): elicitation/create
// accepts {name: "held-agent", check: true}, sampling/createMessage answers the
// text "sampled-by-held-agent", roots/list lists one root. CLIENT_NAME names
// it; REQUEST_TIMEOUT_MS bounds every request.
import readline from "node:readline";
import { Client, StreamableHTTPClientTransport } from "@modelcontextprotocol/client";

const [url] = process.argv.slice(2);
if (!url) {
  console.error("usage: node client2026.mjs URL");
  process.exit(2);
}
const timeout = Number(process.env.REQUEST_TIMEOUT_MS || 15000);

const client = new Client(
  { name: process.env.CLIENT_NAME || "mcpheal-interop-2026", version: "1.0.0" },
  {
    capabilities: { sampling: {}, elicitation: { form: {} }, roots: {} },
    versionNegotiation: { mode: { pin: "2026-07-28" } },
  },
);
const inputs = [];
client.setRequestHandler("elicitation/create", async (req) => {
  inputs.push({ method: req.method, text: String(req.params?.message ?? "") });
  return { action: "accept", content: { name: "held-agent", check: true } };
});
client.setRequestHandler("sampling/createMessage", async (req) => {
  const m = req.params?.messages?.[0]?.content;
  inputs.push({ method: req.method, text: m?.type === "text" ? m.text : "" });
  return { role: "assistant", model: "held-test-model", content: { type: "text", text: "sampled-by-held-agent" } };
});
client.setRequestHandler("roots/list", async (req) => {
  inputs.push({ method: req.method, text: "" });
  return { roots: [{ uri: "file:///tmp/mcpheal-held", name: "held" }] };
});
const updates = [];
client.setNotificationHandler("notifications/resources/updated", (n) => { updates.push(n.params.uri); });
const transport = new StreamableHTTPClientTransport(new URL(url));
const listens = [];

const ops = {
  async connect() {
    await client.connect(transport, { timeout });
    return {
      serverName: client.getServerVersion()?.name,
      era: client.getProtocolEra?.(),
      version: client.getNegotiatedProtocolVersion?.(),
      instructionsLen: Buffer.byteLength(client.getInstructions() ?? "", "utf8"),
      sessionId: transport.sessionId ?? null,
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
    const options = { timeout };
    let progressCount = 0;
    if (cmd.progress) options.onprogress = () => { progressCount++; };
    if (cmd.cancelAfterMs !== undefined) {
      const ac = new AbortController();
      setTimeout(() => ac.abort(new Error(`cancelled after ${cmd.cancelAfterMs} ms`)), cmd.cancelAfterMs);
      options.signal = ac.signal;
    }
    let r;
    try {
      r = await client.callTool({ name: cmd.name, arguments: cmd.arguments ?? {} }, options);
    } catch (err) {
      if (cmd.progress && err && typeof err === "object") err.progressCount = progressCount;
      throw err;
    }
    const t = (r.content ?? []).filter((c) => c.type === "text").map((c) => c.text).join("");
    const out = { isError: !!r.isError, textLen: Buffer.byteLength(t, "utf8"), textHead: t.slice(0, 2000) };
    if (cmd.progress) out.progressCount = progressCount;
    return out;
  },
  async lists() {
    // Each list the server advertises, every page (the client sends no
    // request for one whose capability discover did not list).
    const all = async (fn, key) => {
      const names = [];
      let cursor;
      do {
        const r = await fn(cursor ? { cursor } : undefined, { timeout });
        for (const x of r[key]) names.push(x.name ?? x.uriTemplate);
        cursor = r.nextCursor;
      } while (cursor);
      return names;
    };
    return {
      prompts: await all((p, o) => client.listPrompts(p, o), "prompts"),
      resources: await all((p, o) => client.listResources(p, o), "resources"),
      templates: await all((p, o) => client.listResourceTemplates(p, o), "resourceTemplates"),
    };
  },
  async read(cmd) {
    const r = await client.readResource({ uri: cmd.uri }, { timeout });
    const t = (r.contents ?? []).map((c) => c.text ?? "").join("");
    return { textLen: Buffer.byteLength(t, "utf8"), textHead: t.slice(0, 2000) };
  },
  async listen(cmd) {
    const filter = {};
    for (const k of ["resourceSubscriptions", "toolsListChanged", "resourcesListChanged", "promptsListChanged"]) {
      if (cmd[k] !== undefined) filter[k] = cmd[k];
    }
    const sub = await client.listen(filter, { timeout });
    listens.push(sub);
    return { honored: sub.honoredFilter ?? null };
  },
  async unlisten() {
    while (listens.length) await listens.pop().close();
    return {};
  },
  async updates() {
    return { updates: [...updates] };
  },
  async inputs() {
    return { inputs: [...inputs] };
  },
  async close() {
    await client.close();
    return {};
  },
};

function failure(err) {
  const code = typeof err?.code === "number" ? err.code : null;
  const sdkCode = typeof err?.code === "string" ? err.code : null;
  const out = { ok: false, code, sdkCode, message: String(err?.message ?? err).slice(0, 2000), kind: err?.constructor?.name };
  if (typeof err?.progressCount === "number") out.progressCount = err.progressCount;
  return out;
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

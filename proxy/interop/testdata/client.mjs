// A line-driven MCP client for the interop tests:
//   node client.mjs v1|v2 URL
// v1 is @modelcontextprotocol/sdk's Client + StreamableHTTPClientTransport,
// v2 is @modelcontextprotocol/client's. Each stdin line is one JSON command;
// each command answers exactly one stdout line "RESULT <json>":
//   {"op":"connect"}                      → serverName, instructions length/sha256
//   {"op":"list"}                         → count and names of all tools (every page)
//   {"op":"call","name":N,"arguments":{}} → isError, text length/sha256, text head
//   {"op":"close"}                        → closes the client and exits
// Every answer carries ms, the time the operation took.
// A failure answers {"ok":false,"code":…,"message":…,"kind":…}: code is the
// JSON-RPC error code for a JSON-RPC error (an HTTP status for an HTTP
// failure, as the SDK reports it). Text lengths are UTF-8 bytes.
import { createHash } from "node:crypto";
import readline from "node:readline";

const [flavour, url] = process.argv.slice(2);
const sdk = flavour === "v2"
  ? await import("@modelcontextprotocol/client")
  : {
    ...(await import("@modelcontextprotocol/sdk/client/index.js")),
    ...(await import("@modelcontextprotocol/sdk/client/streamableHttp.js")),
  };
if (!url || !sdk.Client) {
  console.error("usage: node client.mjs v1|v2 URL");
  process.exit(2);
}

const timeout = Number(process.env.REQUEST_TIMEOUT_MS || 15000);
const client = new sdk.Client({ name: process.env.CLIENT_NAME || `mcpheal-interop-${flavour}`, version: "1.0.0" });
const transport = new sdk.StreamableHTTPClientTransport(new URL(url));

const digest = (s) => ({
  len: Buffer.byteLength(s, "utf8"),
  sha256: createHash("sha256").update(s, "utf8").digest("hex"),
});

function callTool(params) {
  // v1: callTool(params, resultSchema, options); v2: callTool(params, options).
  return flavour === "v2"
    ? client.callTool(params, { timeout })
    : client.callTool(params, undefined, { timeout });
}

const ops = {
  async connect() {
    await client.connect(transport, { timeout });
    const ins = digest(client.getInstructions() ?? "");
    return {
      serverName: client.getServerVersion()?.name,
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
    const r = await callTool({ name: cmd.name, arguments: cmd.arguments ?? {} });
    const t = (r.content ?? []).filter((c) => c.type === "text").map((c) => c.text).join("");
    const d = digest(t);
    return { isError: !!r.isError, textLen: d.len, textSha256: d.sha256, textHead: t.slice(0, 200) };
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

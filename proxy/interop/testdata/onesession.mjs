// An MCP server of ONE session, as some servers are (a stdio server behind a
// single Streamable HTTP transport): the TypeScript SDK v1's
// StreamableHTTPServerTransport, created once. Its first initialize opens
// the session; any later initialize gets the SDK's own 400 "Invalid
// Request: Server already initialized"; a DELETE ends the session and the
// server with it (the transport is closed for good). Run with
// node --import ./guard.mjs onesession.mjs; 127.0.0.1:$PORT.
// Prints "INITIALIZE <clientInfo.name>" for every initialize it receives,
// "REFUSED <clientInfo.name>" for each it refuses, "PING" for a ping,
// "DELETE" for a DELETE.
// Tool: "echo" (readOnlyHint).
import http from "node:http";
import { randomUUID } from "node:crypto";
import { McpServer } from "@modelcontextprotocol/sdk/server/mcp.js";
import { StreamableHTTPServerTransport } from "@modelcontextprotocol/sdk/server/streamableHttp.js";
import { z } from "zod";

const server = new McpServer({ name: "one-session", version: "1.0.0" });
server.registerTool("echo", { inputSchema: { text: z.string() }, annotations: { readOnlyHint: true } },
  async ({ text }) => ({ content: [{ type: "text", text }] }));
const transport = new StreamableHTTPServerTransport({ sessionIdGenerator: () => randomUUID() });
await server.connect(transport);
let opened = false;

http.createServer(async (req, res) => {
  let body;
  if (req.method === "POST") {
    const chunks = [];
    for await (const c of req) chunks.push(c);
    try { body = JSON.parse(Buffer.concat(chunks).toString("utf8")); } catch { body = undefined; }
    if (body && body.method === "initialize") {
      const name = body.params?.clientInfo?.name ?? "?";
      process.stdout.write(`${opened ? "REFUSED" : "INITIALIZE"} ${name}\n`);
      opened = true;
    }
    if (body && body.method === "ping") process.stdout.write("PING\n");
  }
  if (req.method === "DELETE") process.stdout.write("DELETE\n");
  await transport.handleRequest(req, res, body);
}).listen(Number(process.env.PORT || 0));

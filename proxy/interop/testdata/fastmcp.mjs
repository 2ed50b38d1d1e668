// A FastMCP (npm fastmcp) server, httpStream transport, stateful, on
// 127.0.0.1:$PORT (guard.mjs prints the port). Run with
// node --import ./guard.mjs fastmcp.mjs.
import { FastMCP } from "fastmcp";
import { z } from "zod";

const server = new FastMCP({ name: "mcpheal-interop-fastmcp", version: "1.0.0" });
server.addTool({
  name: "echo",
  description: "Echoes text.",
  parameters: z.object({ text: z.string() }),
  annotations: { readOnlyHint: true },
  execute: async ({ text }) => text,
});
server.addTool({
  name: "add",
  description: "Adds two numbers.",
  parameters: z.object({ a: z.number(), b: z.number() }),
  execute: async ({ a, b }) => String(a + b),
});
await server.start({
  transportType: "httpStream",
  httpStream: { host: "127.0.0.1", port: Number(process.env.PORT || 0), endpoint: "/mcp" },
});

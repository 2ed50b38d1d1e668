// A FastMCP (npm fastmcp) server, httpStream transport, stateful, on
// 127.0.0.1:$PORT (guard.mjs prints the port). Run with
// node --import ./guard.mjs fastmcp.mjs.
//
// By default it serves two tools, echo and add. With HELD_TOOLS=1 (the
// held-route tests) it also serves, all through fastmcp's own API:
//   - work {tag, ms?} (no annotations: not replay-safe): appends
//     "<tag> <pid>" to COUNT_FILE, then sleeps ms milliseconds, returns
//     "done <tag>";
//   - slow {tag, ms}: sleeps ms milliseconds in 100 ms steps, each after a
//     progress notification when the request has a progressToken, until its
//     context.signal aborts (fastmcp aborts it on notifications/cancelled);
//     prints "CANCELLED slow <tag>" or "COMPLETED slow <tag>" on stdout;
//   - resource test://held/r1, so that the server offers resource
//     subscriptions; the stdin command "notify-resource <uri>" calls
//     FastMCP.sendResourceUpdated(uri) (every session subscribed to it gets
//     notifications/resources/updated) and prints "NOTIFIED <uri>".
import fs from "node:fs";
import readline from "node:readline";
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

if (process.env.HELD_TOOLS === "1") {
  const say = (line) => process.stdout.write(`${line}\n`);
  const countFile = process.env.COUNT_FILE || "";
  server.addTool({
    name: "work",
    description: "Records one execution in the count file, then sleeps ms milliseconds. Not replay-safe.",
    parameters: z.object({ tag: z.string(), ms: z.number().int().min(0).optional() }),
    execute: async ({ tag, ms }) => {
      if (countFile) fs.appendFileSync(countFile, `${tag} ${process.pid}\n`);
      if (ms) await new Promise((r) => setTimeout(r, ms));
      return `done ${tag}`;
    },
  });
  server.addTool({
    name: "slow",
    description: "Sleeps ms milliseconds unless cancelled.",
    parameters: z.object({ tag: z.string(), ms: z.number().int().min(0) }),
    execute: async ({ tag, ms }, { signal, reportProgress }) => {
      for (let t = 0; t < ms && !signal.aborted; t += 100) {
        await reportProgress({ progress: t, total: ms }); // only with a progressToken
        await new Promise((r) => setTimeout(r, 100));
      }
      const aborted = signal.aborted;
      say(`${aborted ? "CANCELLED" : "COMPLETED"} slow ${tag}`);
      return aborted ? "cancelled" : "slept";
    },
  });
  server.addResource({
    uri: "test://held/r1",
    name: "r1",
    mimeType: "text/plain",
    load: async () => ({ text: "r1" }),
  });
  const rl = readline.createInterface({ input: process.stdin });
  rl.on("line", async (line) => {
    const [cmd, arg] = line.trim().split(/\s+/, 2);
    if (cmd === "notify-resource" && arg) {
      await server.sendResourceUpdated(arg);
      say(`NOTIFIED ${arg}`);
    }
  });
}

await server.start({
  transportType: "httpStream",
  httpStream: { host: "127.0.0.1", port: Number(process.env.PORT || 0), endpoint: "/mcp" },
});

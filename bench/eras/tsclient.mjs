// The TypeScript SDK v2 client (@modelcontextprotocol/client 2.4.0) in
// version-negotiation "auto" mode, for bench/eras (main.go runs it):
//   node bench/eras/tsclient.mjs PHASE JSON
// with ERAS_TESTDATA naming proxy/interop/testdata (its node_modules hold
// the SDK). JSON: {targets:[{name,url,cold}], name, tool, args, connects,
// cold, calls, n, trace}. Phases, each answering one stdout line
// "RESULT <json>":
//   connect → {warm:{target:sample}, samples:{target:[sample]}}, sample =
//             {connect, firstCall (ms), era}; one untimed round first, then
//             `connects` rounds, targets in a rotating order (a cold target,
//             a new clientInfo each time, only for the first `cold` rounds)
//   calls   → {target:[ms]}: one client per non-cold target, `calls`
//             rounds of one call each, interleaved
//   count   → {wallMs, errors}: n clients named `name` connect to the first
//             target at once, call once each, close
//   trace   → {text}: `trace` connects per target with every HTTP exchange
//             timed (start, response head, end of body; ms from the
//             connect's start)
import { performance } from "node:perf_hooks";
import { pathToFileURL } from "node:url";

const TD = process.env.ERAS_TESTDATA || "proxy/interop/testdata";
const { Client, StreamableHTTPClientTransport } = await import(
  pathToFileURL(`${TD}/node_modules/@modelcontextprotocol/client/dist/index.mjs`).href);

const [phase, json] = process.argv.slice(2);
const cfg = JSON.parse(json);
const now = () => performance.now();
const TIMEOUT = 30000;
setTimeout(() => { console.error("tsclient: 4 minutes passed, exiting"); process.exit(4); }, 240000).unref();

function newClient(url, name, fetchImpl) {
  const c = new Client({ name, version: "1.0.0" }, { versionNegotiation: { mode: "auto" } });
  const t = new StreamableHTTPClientTransport(new URL(url), fetchImpl ? { fetch: fetchImpl } : undefined);
  return { c, t };
}

async function close({ c, t }) {
  try {
    if (t.sessionId) await t.terminateSession();
  } catch { /* the server may not allow DELETE */ }
  try { await c.close(); } catch { /* closed */ }
}

const era = (c) => String(c.getNegotiatedProtocolVersion?.() ?? c.getProtocolEra?.() ?? "?");

async function call(c) {
  const t0 = now();
  const r = await c.callTool({ name: cfg.tool, arguments: cfg.args }, { timeout: TIMEOUT });
  const d = now() - t0;
  if (r.isError) throw new Error(`tool error: ${JSON.stringify(r.content)}`);
  return d;
}

async function one(target, name, fetchImpl) {
  const cl = newClient(target.url, name, fetchImpl);
  const t0 = now();
  try {
    await cl.c.connect(cl.t, { timeout: TIMEOUT });
  } catch (e) {
    return { connect: now() - t0, err: String(e?.message ?? e).slice(0, 300) };
  }
  const s = { connect: now() - t0, era: era(cl.c) };
  try {
    s.firstCall = await call(cl.c);
  } catch (e) {
    s.err = String(e?.message ?? e).slice(0, 300);
  }
  await close(cl);
  return s;
}

const rotate = (xs, i) => xs.slice(i % xs.length).concat(xs.slice(0, i % xs.length));
const rpcOf = (body) => {
  if (typeof body !== "string") return "";
  try {
    const m = JSON.parse(body);
    return m.method ?? (m.id !== undefined ? "(response)" : "?");
  } catch { return "?"; }
};

// tracing returns a fetch that records each exchange in log, times from
// clock.t0.
function tracing(log, clock) {
  return async (url, init) => {
    const e = { method: init?.method ?? "GET", rpc: rpcOf(init?.body), start: now() - clock.t0, head: null, end: null, status: 0 };
    log.push(e);
    let res;
    try {
      res = await fetch(url, init);
    } catch (err) {
      e.head = now() - clock.t0;
      e.status = -1;
      throw err;
    }
    e.head = now() - clock.t0;
    e.status = res.status;
    e.sid = res.headers.get("mcp-session-id")?.slice(0, 8) ?? "";
    if (!res.body || [101, 204, 205, 304].includes(res.status)) {
      e.end = e.head;
      return res;
    }
    const body = res.body.pipeThrough(new TransformStream({ flush() { e.end = now() - clock.t0; } }));
    return new Response(body, { status: res.status, statusText: res.statusText, headers: res.headers });
  };
}

const f1 = (x) => (x === null ? "open" : `${x.toFixed(1)}ms`);

const phases = {
  async connect() {
    const warm = {};
    const samples = {};
    for (const t of cfg.targets) {
      samples[t.name] = [];
      if (!t.cold) warm[t.name] = await one(t, cfg.name);
    }
    for (let i = 0; i < cfg.connects; i++) {
      for (const t of rotate(cfg.targets, i)) {
        if (t.cold && i >= cfg.cold) continue;
        samples[t.name].push(await one(t, t.cold ? `${cfg.name}-cold-${i}` : cfg.name));
      }
    }
    return { warm, samples };
  },
  async calls() {
    const targets = cfg.targets.filter((t) => !t.cold);
    const clients = {};
    const out = {};
    for (const t of targets) {
      clients[t.name] = newClient(t.url, cfg.name);
      await clients[t.name].c.connect(clients[t.name].t, { timeout: TIMEOUT });
      out[t.name] = [];
    }
    for (let i = 0; i < cfg.calls; i++) {
      for (const t of rotate(targets, i)) out[t.name].push(await call(clients[t.name].c));
    }
    for (const cl of Object.values(clients)) await close(cl);
    return out;
  },
  async count() {
    const t = cfg.targets[0];
    let errors = 0;
    const t0 = now();
    const done = await Promise.all(Array.from({ length: cfg.n }, async () => {
      const cl = newClient(t.url, cfg.name);
      try {
        await cl.c.connect(cl.t, { timeout: TIMEOUT });
        await call(cl.c);
      } catch (e) {
        errors++;
        console.error("count:", String(e?.message ?? e));
      }
      return cl;
    }));
    const wallMs = now() - t0;
    for (const cl of done) await close(cl);
    return { wallMs, errors };
  },
  async trace() {
    let text = "";
    const log = [];
    const clock = { t0: now() };
    const fetchImpl = tracing(log, clock);
    for (const t of cfg.targets) await one(t, cfg.name, fetchImpl); // warm connections
    for (let i = 0; i < cfg.trace; i++) {
      for (const t of cfg.targets) {
        log.length = 0;
        clock.t0 = now();
        const cl = newClient(t.url, t.cold ? `${cfg.name}-tracecold-${i}` : cfg.name, fetchImpl);
        let line = `ts ${cfg.name.replace(/^eras-ts-/, "")} ${t.name} #${i}: `;
        try {
          await cl.c.connect(cl.t, { timeout: TIMEOUT });
          line += `connect ${f1(now() - clock.t0)}`;
          const fc = await call(cl.c);
          line += `, first call ${f1(fc)}, era ${era(cl.c)}`;
        } catch (e) {
          line += `error ${String(e?.message ?? e).slice(0, 200)}`;
        }
        await new Promise((r) => setTimeout(r, 50));
        text += line + "\n";
        for (const e of log) {
          text += `    ${e.method.padEnd(6)} ${e.rpc.padEnd(26)} ${String(e.status).padStart(4)}  start ${f1(e.start).padStart(8)}  head ${f1(e.head).padStart(8)}  end ${f1(e.end).padStart(8)}  ${e.sid ?? ""}\n`;
        }
        await close(cl);
      }
    }
    return { text };
  },
};

const out = await phases[phase]();
process.stdout.write(`RESULT ${JSON.stringify(out)}\n`);
process.exit(0);

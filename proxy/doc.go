// Package proxy is mcpheal's HTTP side: it serves agents, sends their
// requests upstream, and heals upstream sessions that die, so that an
// agent's MCP session outlives them.
//
// # One POST, heal included, in reading order
//
//  1. [Server.ServeMCP] (mcp.go) guards the request (size, Host/Origin,
//     inbound auth) and routes it by HTTP method. [Server.servePost]
//     parses the JSON-RPC message ([parseMessage], jsonrpc.go: a member
//     routed on that appears twice is refused), sends an initialize to
//     [Server.initialize] (initialize.go: forward it, record the recipe,
//     mint the client id) and looks every other request's session up.
//  2. [Server.forward] (forward.go) starts an attempt: the agent's request
//     with its session id swapped for the upstream's. [attempt.run] runs
//     the loop and then writes the one answer the agent gets.
//  3. [attempt.loop] is send → judge → decide → act:
//     [attempt.send] makes one exchange (a request that is not
//     replay-safe goes with upstream.Client.DoOnce: never resent, never on
//     a connection whose liveness is in doubt); [attempt.judge] classifies
//     the answer (classify.Classify, peeking at the first event of an SSE
//     answer through the one SSE framer, classify/sse) and records whether
//     the upstream may have run the request; [decide] (decide.go) turns
//     those facts into an action, as a pure function whose table test is
//     the README's "What it does with each answer" and "Replay rules".
//  4. The actions: pass the answer through; heal ([attempt.heal],
//     heal.go: single-flight re-initialize of the session from its recipe,
//     journal replay, then the request is sent again); wait out an outage
//     and retry ([attempt.backoff], outage.go); refuse with -32011 (the
//     request may have run and is not safe to run twice); fail with 503.
//  5. [attempt.answer] (answer.go) is the single exit: it counts the
//     outcome and writes the agent's answer, the upstream's
//     ([Server.respond]: headers with every session id replaced, a JSON
//     body, or an SSE answer relayed event by event by [sseBody]) or
//     mcpheal's own JSON-RPC error.
//
// Requests mcpheal makes itself (the initialize of a heal, the journal
// replay, tools/list after a heal, keepalive pings, upstream GET streams,
// DELETEs) are built in one place, [Server.build], and those whose answer
// is read whole go through [Server.call] (call.go).
//
// # Heal states of one session
//
//	      ┌───────── answer OK ─────────┐
//	      ▼                             │
//	[generation g] ── SessionGone ──▶ [healing g] ── new upstream id ──▶ [generation g+1]
//	      │               (first failure of g leads;        │
//	      │                later ones of g wait for it)     └── recipe refused ──▶ 404, session dropped
//	      └── transport failure ──▶ wait (one probe per session) ──▶ retry on g
//
// # Invariants
//
//   - A request that is not replay-safe is sent a second time only on proof
//     that the upstream did not run it (nothing written, a refused
//     connection, a session rejection, a 5xx that is a known server
//     refusal).
//   - The upstream's Mcp-Session-Id never reaches the agent.
//   - A *fasthttp.RequestCtx never outlives the handler; background work
//     (keepalive, DELETEs, GET stream pumps) is owned by the Server and
//     ends on Close.
package proxy

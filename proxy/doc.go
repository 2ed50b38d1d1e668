// Package proxy is mcpheal's HTTP side: it serves agents, sends their
// requests upstream, and heals upstream sessions that die, so that an
// agent's MCP session outlives them.
//
// # One pipeline, in reading order
//
// Every agent request, on every route, takes the same four stages
// ([Server.ServeMCP], pipeline.go). A capability is a new route behind
// these stages, never a path around them.
//
//  1. guard (guard.go): [guard.check] runs every check, each in one place:
//     body size, Host and Origin (DNS rebinding), inbound auth, method and
//     media types, JSON depth and validity, members that appear twice; the
//     session the agent names ([sessions.lookup], sessions.go: in memory,
//     or restored from its sealed id; not ended, not past its maximum age)
//     and the credential it is bound to (binding.go: refused as unknown,
//     or let through only to the upstream, which judges a rotated token);
//     and the memory a request would add to its session's journal
//     (max_journal, memory_budget). Its result is a [request]: what every
//     later stage reads, so that none goes back to the RequestCtx.
//  2. route ([Server.route], pipeline.go): a session-era agent of an
//     upstream that speaks only 2026-07-28 goes to the bridge (bridge.go),
//     a 2026-07-28 agent of a session-era upstream to the held route
//     (held.go); everything else passes through ([Server.forward]; a new
//     session: [Server.initialize]; a GET stream: [Server.serveStream],
//     getstream.go; a GET resuming an answer mcpheal keeps:
//     [Server.serveLog], answerlog.go). New sessions are admitted by
//     [sessions.admit], under the store's caps and the memory budget. The
//     bridge, the held route and open streams hold a [routeKit], the
//     stages they use, not the Server.
//  3. attempt (attempt.go, decide.go): [attempt.loop] is send → judge →
//     decide → act, for every route. [attempt.send] makes one exchange
//     through the upstream link (link.go; a request that is not replay-safe
//     goes with doOnce: never resent, never on a connection whose liveness
//     is in doubt); [attempt.judge] classifies the answer (classify.Classify,
//     peeking at the first event of an SSE answer through the one SSE
//     framer, classify/sse) and records whether the upstream may have run
//     the request; [decide] turns those facts into an action, a pure
//     function whose table test is the docs/healing.md's "What it does with each
//     answer" and "Replay rules", with the one replay rule, [replayable].
//     The actions: pass the answer on; heal ([attempt.heal] → the healer,
//     heal.go: single-flight re-initialize from the recipe, journal replay,
//     then the request again); wait out an outage and retry
//     ([attempt.backoff], the one backoff, upstream.Backoff); refuse with
//     -32011 (the request may have run and is not safe to run twice); fail.
//  4. answer (answer.go): [attempt.answer] counts the outcome and writes the
//     agent's answer: the upstream's ([attempt.respond]: headers with every
//     session id replaced, a JSON body, or an SSE answer relayed event by
//     event by [sseBody]) or mcpheal's own error ([attempt.fail], the one
//     table of mcpheal's errors, for JSON and SSE alike). Events mcpheal
//     writes itself go through the one SSE writer (sse.AppendEvent), on
//     open streams by [agentStream] (agentstream.go).
//
// A heal, read in order: attempt.go ([attempt.loop] judges the dead
// session's answer with classify, [decide] says heal, [attempt.heal]),
// heal.go ([healer.heal], [healer.reinit], [healer.initUpstream]: the
// single flight of session/session.go, [session.Session.Heal]), fleet.go
// (another process's heal adopted, this one published), journal.go (the
// journal replay), link.go and call.go (the requests mcpheal makes:
// [link.build], [link.call], through the upstream client), streams.go
// (GET streams moved to the new session), events.go (the new
// generation's event ids), then the request again ([attempt.send]) and its
// answer (sse.go, headers.go). That is what a heal runs more often than a
// call without one, measured: 29 files, 19 of them with code only a heal
// runs (bench/healcover.sh; docs/healing.md "What a heal runs").
//
// Requests mcpheal makes itself (the initialize of a heal, the journal
// replay, tools/list after a heal, keepalive pings, upstream GET streams,
// DELETEs, the bridge's 2026-07-28 requests) are built in one place,
// [link.build].
//
// # Heal states of one session
//
//	      ┌───────── answer OK ─────────┐
//	      ▼                             │
//	[generation g] ── SessionGone ──▶ [healing g] ── new upstream id ──▶ [generation g+1]
//	      │               (first failure of g leads;        │
//	      │                later ones of g wait for it)     └── recipe refused ──▶ 404, session ended
//	      └── transport failure ──▶ wait (one probe per session) ──▶ retry on g
//
// # Invariants
//
//   - No route answers an agent before the guard ran; no route sends
//     upstream but through the attempt loop or the link.
//   - A request that is not replay-safe is sent a second time only on proof
//     that the upstream did not run it (nothing written, a refused
//     connection, a session rejection, a 5xx that is a known server
//     refusal).
//   - The upstream's Mcp-Session-Id never reaches the agent.
//   - What a session holds (its recipe, its journal, answers buffered for
//     it) is counted in memory_budget.
//   - A *fasthttp.RequestCtx never outlives the handler; background work
//     (keepalive, DELETEs, GET stream pumps) is owned by the Server and
//     ends on Close.
package proxy

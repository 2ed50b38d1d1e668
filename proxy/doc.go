// Package proxy is mcpheal's HTTP side: it serves agents, sends their
// requests upstream, and heals upstream sessions that die, so that an
// agent's MCP session outlives them.
//
// # The house
//
// proxy is the front door; the stages below it are packages of their own,
// and their imports run one way, down (deps_test.go holds the order and
// fails on an import that runs up):
//
//	proxy                  the front door: Server, Router, the guard, route selection
//	internal/route/held    2026-07-28 agents of a session-era server
//	internal/route/bridge  session-era agents of a 2026-07-28-only server
//	internal/route/stream  agents' GET streams, and answers resumed from mcpheal's log
//	internal/exchange      the one loop (send, judge, decide, act) and the one answer writer
//	internal/heal          sessions, their sealed ids, heals, keepalive, the fleet
//	internal/era           the upstream's protocol era
//	internal/link          every request sent upstream; the breaker; outages;
//	                       the one retry policy (link.Retry)
//	internal/obs           counters and traces
//	internal/wire          JSON-RPC, headers, SSE events, the memory budget
//	internal/conf          the configuration
//
// A stage is given the few stages below it that it uses (exchange.Stages
// for the exchange; a route's own fields for each route, held.Route,
// bridge.Route, stream.Route; heal's StreamNotes for the streams a heal
// moves); nothing below calls back up: an outcome travels up as a value
// (the exchange's era change, Attempt.Run's reroute, is acted on here). A
// route starts its attempts with an exchange.Env, which gives it the
// ground (configuration, log, counters, memory budget) and none of the
// exchange's stages: the compiler keeps a route from a stage it was not
// given. It sends upstream through the exchange's attempts and, for what
// it sends itself, through its own Upstream: the few link methods it names
// (held.Upstream, bridge.Upstream, stream.Upstream), as a handler reaches
// its transport only as a RoundTripper; TestRoutesSendThroughTheirUpstream
// fails on a route that reaches the link past it (through a stage's own
// field), TestEnvGivesOnlyTheGround on an Env that hands a route a stage.
//
// # One pipeline, in reading order
//
// Every agent request, on every route, takes the same four stages
// ([Server.ServeMCP], pipeline.go). A capability is a new route behind
// these stages, never a path around them.
//
//  1. guard (guard.go): guard.check runs every check, each in one place:
//     body size, Host and Origin (DNS rebinding), inbound auth, method and
//     media types, JSON depth and validity, members that appear twice; the
//     session the agent names (heal.Sessions.Lookup: in memory, or restored
//     from its sealed id; not ended, not past its maximum age) and the
//     credential it is bound to (heal.StandingOf: refused as unknown, or
//     let through only to the upstream, which judges a rotated token); and
//     the memory a request would add to its session's journal
//     (max_journal, memory_budget). Its result is an exchange.Request: what
//     every later stage reads, so that none goes back to the RequestCtx.
//  2. route (Server.route, pipeline.go): a session-era agent of an upstream
//     that speaks only 2026-07-28 goes to the bridge, a 2026-07-28 agent of
//     a session-era upstream to the held route; a GET to the stream route;
//     everything else passes through (Server.forward; a new session:
//     Server.initialize). The upstream's era is era.State's to tell; the
//     choice is made here, and only here, also when the exchange reports
//     that the era changed under a request (Server.reroute).
//  3. attempt (internal/exchange): exchange.Attempt.Loop is send → judge →
//     decide → act, for every route, with the one replay rule
//     (exchange.Decide) and the one heal (heal.Healer.Heal). What each try
//     brings back is the attempt's answer stream, one type that owns all
//     that is done with it: the peek at its first event, the relay event
//     by event, the bodies fasthttp writes, the resumption upstream of a
//     stream cut early (exchange's stream.go, relay.go, body.go, resume.go);
//     it reads the call it answers and never reaches the loop's state.
//  4. answer (internal/exchange): Attempt.Answer counts the outcome and
//     writes the agent's answer: the upstream's, or mcpheal's own error
//     (exchange.WriteFailure, with the status every client surfaces at
//     once: docs/observability.md "Errors mcpheal writes itself"). Every
//     route hands what it answers (its own refusals, its failures, the
//     answers it put in the agent's era, its event streams) to the one
//     exchange.Writer, which writes it and counts its request once;
//     TestRoutesAnswerThroughWriter fails on a route that writes or counts
//     an answer itself.
//
// A heal, read in order: exchange (attempt.go: the dead session's answer
// judged, Decide says heal), heal (heal.go: Healer.Heal, single-flight per
// session through session.Session.Heal; journal.go, the journal replay;
// fleet.go, another replica's heal adopted), link (call.go: the requests
// mcpheal makes, Link.Build and Link.Call), route/stream (the GET streams
// moved to the new session), wire (events.go: the new generation's event
// ids), then the request again and its answer. What that runs is measured
// by bench/healcover.sh (docs/healing.md "What a heal runs").
//
// # Invariants
//
//   - No route answers an agent before the guard ran; no route sends
//     upstream but through the exchange's loop or its Upstream.
//   - Every loop that tries the upstream again (a request, its answer
//     stream's resumption, a heal, a GET stream, a bridged listen, the
//     outage watcher) paces and budgets its tries through one link.Retry,
//     at a pace named in retry.go; a heal waits out an open breaker
//     through it (Retry.Gate), the attempt by its outage's own end; a GET
//     stream's try counts an open breaker as a failed try, and a bridged
//     listen backs off on its failures only. What is tried again is
//     exchange.Decide's rule (and a loop's own switch where no agent's
//     request is in it).
//   - A request that is not replay-safe is sent a second time only on proof
//     that the upstream did not run it (nothing written, a refused
//     connection, a session rejection, a 5xx that is a known server
//     refusal).
//   - The upstream's Mcp-Session-Id never reaches the agent.
//   - What a session holds (its recipe, its journal, answers buffered for
//     it, events held whole) is counted in memory_budget.
//   - A *fasthttp.RequestCtx never outlives the handler; background work
//     (keepalive, DELETEs, GET stream pumps) is owned by the Server and
//     ends on Close.
package proxy

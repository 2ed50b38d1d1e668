// Package held is the route of an MCP 2026-07-28 agent in front of a
// session-era upstream (docs/eras.md "2026-07-28 agents, session-era
// servers"): mcpheal holds one upstream session per credential and client
// for it (Route), answers server/discover from the session's initialize,
// sends every other request on the held session through the exchange,
// turns a server's requests for input into an InputRequiredResult and the
// agent's retry into their answers (held_call.go), and serves
// subscriptions/listen from the session's GET stream (held_listen.go,
// through route/stream).
//
// Its requests go through the exchange's loop, under the one replay rule
// and the one heal; only their translation is this route's.
package held

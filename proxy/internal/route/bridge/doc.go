// Package bridge is the route of a session-era agent in front of an
// upstream that speaks only MCP 2026-07-28 (docs/eras.md "Session-era
// agents, 2026-07-28 servers"): mcpheal owns the agent's session, answers
// initialize from server/discover, sends each request with the 2026-07-28
// envelope through the exchange, turns an InputRequiredResult into the
// session era's requests on the call's stream, and serves the GET stream
// from subscriptions/listen.
package bridge

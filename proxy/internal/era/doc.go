// Package era tells the upstream's protocol era (docs/eras.md "Across
// protocol eras"): the session era only, MCP 2026-07-28 only, or both, in
// the server's own words (server/discover, a -32022's data.supported, a
// session-era initialize and ping), asked once and again after an outage
// or an answer that shows the upstream changed era. It decides which
// agents the bridge or the held route takes (State.Bridged,
// State.HeldRoute); the route stage acts on it.
//
// It sends through link only, and holds what server/discover said
// (Discovery) in the memory budget.
package era

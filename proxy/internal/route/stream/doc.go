// Package stream is the route of an agent's GET (docs/streams.md): its
// standalone SSE stream, held open across heals (Route.Serve: a pump reads
// the upstream GET and reopens it, with Last-Event-ID in the same
// generation, after a heal in the next), and the resumption of an answer
// mcpheal keeps for an agent whose connection dropped (Route.ServeLog).
// Set holds the open streams of the upstream, which a heal moves to the
// new upstream session (heal.StreamNotes).
//
// It sends through the exchange (exchange.NewAttempt) and link; it writes
// to the agent through exchange.AgentStream.
package stream

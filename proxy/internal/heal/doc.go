// Package heal keeps agents' sessions (docs/healing.md): the store of
// sessions and their sealed ids (Sessions: admit, lookup, restore, end),
// the credential a session is bound to (Standing), the fleet of replicas
// sharing them (Fleet), and the re-creation of an upstream session that
// died (Healer.Heal: single-flight per session through session.Session.Heal,
// the recorded initialize, notifications/initialized, the journal replay),
// the tools/list that follows the request that needed it, and keepalive.
//
//	[generation g] ── SessionGone ──▶ [healing g] ── new upstream id ──▶ [generation g+1]
//	                   (first failure of g leads;        │
//	                    later ones of g wait for it)     └── recipe refused ──▶ session ended
//
// It sends through link only. What it must tell the streams above it (a
// session healed, an event for its agents) goes through the StreamNotes it
// is given; it never calls up. A heal runs only under the credential the
// session is bound to, and a session found gone by keepalive is left for
// its agent's next request to heal.
package heal

// Package session maps the agent-facing session id that mcpheal mints to the
// disposable upstream session behind it, and coordinates healing.
//
// A Session holds the recipe (the agent's initialize body, negotiated
// protocol version, credential fingerprint), the current upstream session id
// and a generation number. Every request reads (upstream id, generation)
// before it is forwarded. When the upstream answer says the session is dead,
// the request calls Heal with the generation it used:
//
//	       request fails under gen g
//	                 │
//	   gen still g? ─┴─ no ──▶ use the current upstream (someone healed)
//	       │ yes
//	heal in flight? ── yes ──▶ wait for it (own deadline)
//	       │ no
//	start the leader: init(ctx) on a context detached from the request
//	       │
//	ok ──▶ upstream = new id, gen = g+1, wake waiters
//	err ─▶ gen stays g, waiters get the error; the next failure tries again
//
// So N concurrent failures on one dead session cause exactly one re-init, and
// a late failure from an old generation never causes a second one.
//
// What this package must not do: any I/O or import another mcpheal package.
// It declares InitFunc; the proxy supplies the upstream work.
//
// The Store is a bounded LRU (golang-lru/v2). Idle expiry is a sweep over the
// LRU's cold end, owned by the Store and stopped by Close.
package session

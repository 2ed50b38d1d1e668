// Package wire is mcpheal's vocabulary of bytes, the stage below every
// other of proxy (proxy/doc.go): the JSON-RPC message an agent sent as
// mcpheal routes on it (Message, ParseMessage) and the errors mcpheal
// writes (the codes, AppendError, WriteError); the headers it drops or
// replaces (NameSet, StripRequestHeader, StripResponseHeader); the SSE
// events it relays and rewrites (EventRewriter: ids, a heal's renumbered
// requests, the line relay), peeks at (PeekFirst) and reads whole
// (ReadAnswer); the 2026-07-28 envelope; and the memory budget every
// stage charges (Budget, HoldMeter).
//
// It must not send, heal, count or log: it turns bytes into bytes and
// facts. Its invariants: a relayed event is the upstream's, byte for byte,
// but for the fields mcpheal owns (an id, a renumbered request id); a line
// held whole past FreeHold is counted in the budget (HoldMeter) until the
// relay has handed it on.
package wire

package session

import (
	"crypto/rand"
	"encoding/hex"
)

// ClientID is the session id the agent sees: 128 random bits in hex, never
// derived from an upstream id.
type ClientID string

// UpstreamID is an upstream server's Mcp-Session-Id. It never reaches the
// agent. Empty means the upstream is stateless.
type UpstreamID string

// NewClientID returns a fresh random ClientID (32 visible ASCII characters,
// as MCP 2025-11-25 §Session Management asks).
func NewClientID() ClientID {
	var b [16]byte
	_, _ = rand.Read(b[:]) // crypto/rand.Read never fails (Go 1.24+)
	return ClientID(hex.EncodeToString(b[:]))
}

// Short returns a short, non-reversible tag of id for logs.
func (id ClientID) Short() string { return shortHash(string(id)) }

// Short returns a short, non-reversible tag of id for logs.
func (id UpstreamID) Short() string { return shortHash(string(id)) }

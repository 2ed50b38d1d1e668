package proxy

import (
	"io"
	"testing"

	"github.com/rs/zerolog"
)

// BenchmarkFingerprint is the per-request cost of checking a session's
// credential binding.
func BenchmarkFingerprint(b *testing.B) {
	s, err := New(Config{Upstream: "http://127.0.0.1:1/mcp", Keepalive: -1}, zerolog.New(io.Discard))
	if err != nil {
		b.Fatal(err)
	}
	defer s.Close()
	auth := []byte("Bearer eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiJ1c2VyLTEifQ.abcdefabcdef")
	b.ReportAllocs()
	for b.Loop() {
		_ = s.fingerprint(auth)
	}
}

package main

import (
	"context"
	"net"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/mcpheal/mcpheal/bench"
)

// The bare relay that measures the floor under mcpheal must be a relay:
// sessions and calls to a real Go SDK server work through it, for JSON and
// SSE answers, and it counts what it answered.
func TestPassthrough(t *testing.T) {
	t.Parallel()
	for _, jsonAnswers := range []bool{true, false} {
		echo := bench.NewEcho(jsonAnswers)
		up := httptest.NewServer(echo.Handler)
		t.Cleanup(up.Close)
		p, err := newPassthrough(up.URL + "/mcp")
		if err != nil {
			t.Fatal(err)
		}
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		go func() { _ = p.Serve(ln) }()
		t.Cleanup(func() { _ = p.Shutdown(context.Background()) })
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		t.Cleanup(cancel)
		hc := &http.Client{}
		s, err := bench.Initialize(ctx, hc, "http://"+ln.Addr().String()+"/mcp", true)
		if err != nil {
			t.Fatalf("json %v: initialize through the passthrough: %v", jsonAnswers, err)
		}
		for id := uint64(1); id <= 20; id++ {
			if err := s.Call(ctx, hc, id); err != nil {
				t.Fatalf("json %v: %v", jsonAnswers, err)
			}
		}
		if got := p.Stats().Requests; got < 22 { // initialize, initialized, 20 calls
			t.Errorf("json %v: passthrough counted %d answers, want at least 22", jsonAnswers, got)
		}
		if echo.Initializes() != 1 {
			t.Errorf("json %v: upstream saw %d initializes, want 1", jsonAnswers, echo.Initializes())
		}
	}
	if _, err := newPassthrough("not a url"); err == nil {
		t.Error("newPassthrough accepted an upstream without a host")
	}
}

package main

import (
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/tidwall/gjson"

	"github.com/mcpheal/mcpheal/bench"
)

func TestHostileUpstream(t *testing.T) {
	t.Parallel()
	up := newHostileUpstream()
	srv := httptest.NewServer(up)
	defer srv.Close()
	ctx := context.Background()
	hc := srv.Client()
	s, err := bench.Initialize(ctx, hc, srv.URL, true)
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Call(ctx, hc, 7); err != nil {
		t.Fatal(err)
	}
	post := func(sid, body string) *http.Response {
		t.Helper()
		req, _ := http.NewRequest(http.MethodPost, srv.URL, strings.NewReader(body))
		req.Header.Set("Content-Type", "application/json")
		if sid != "" {
			req.Header.Set("Mcp-Session-Id", sid)
		}
		resp, err := hc.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		return resp
	}
	if resp := post("nobody", `{"jsonrpc":"2.0","id":1,"method":"ping"}`); resp.StatusCode != http.StatusNotFound {
		t.Errorf("unknown session: %d, want 404", resp.StatusCode)
	}
	for _, tc := range []struct {
		tool   string
		n      int
		length bool
	}{{"big", 300_000, true}, {"huge", 200_000, false}} {
		resp := post(s.ID, string(toolCall(3, tc.tool, `{"bytes":`+strconv.Itoa(tc.n)+`}`)))
		body, err := io.ReadAll(resp.Body)
		resp.Body.Close()
		if err != nil {
			t.Fatal(err)
		}
		if got := len(gjson.GetBytes(body, "result.content.0.text").Str); got != tc.n {
			t.Errorf("%s: %d bytes of text, want %d", tc.tool, got, tc.n)
		}
		if (resp.ContentLength >= 0) != tc.length {
			t.Errorf("%s: Content-Length %d, announced want %v", tc.tool, resp.ContentLength, tc.length)
		}
	}
	// An endless answer streams until its reader goes away.
	rctx, cancel := context.WithCancel(ctx)
	req, _ := http.NewRequestWithContext(rctx, http.MethodPost, srv.URL, strings.NewReader(string(toolCall(4, "endless", `{"mibps":16}`))))
	req.Header.Set("Mcp-Session-Id", s.ID)
	resp, err := hc.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	if n, _ := io.CopyN(io.Discard, resp.Body, 256<<10); n != 256<<10 || resp.Header.Get("Content-Type") != "text/event-stream" {
		t.Errorf("endless: %d bytes, %q", n, resp.Header.Get("Content-Type"))
	}
	cancel()
	resp.Body.Close()
	for deadline := time.Now().Add(5 * time.Second); up.streams.Load() != 0; time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("the endless answer is still written after its reader left")
		}
	}
	st := up.stats()
	if st.Calls["big"] != 1 || st.Calls["huge"] != 1 || st.Calls["endless"] != 1 || st.Calls[bench.EchoTool] != 1 || st.Initializes != 1 {
		t.Errorf("stats %+v", st)
	}
}

func TestLastEventError(t *testing.T) {
	t.Parallel()
	tail := []byte("xxxx\n\nevent: message\ndata: {\"jsonrpc\":\"2.0\",\"error\":{\"code\":-32016,\"message\":\"too big (max_sse_line)\"},\"id\":5}\n\n")
	if code, msg := lastEventError(tail); code != -32016 || !strings.Contains(msg, "max_sse_line") {
		t.Errorf("lastEventError = %d %q", code, msg)
	}
	if code, _ := lastEventError([]byte("id: xxxx")); code != 0 {
		t.Errorf("no event: code %d", code)
	}
}

func TestTally(t *testing.T) {
	t.Parallel()
	var tl tally
	if tl.String() != "nothing" {
		t.Errorf("empty tally: %q", tl.String())
	}
	tl.add("400 -32600", "too deep")
	tl.add("200", "")
	tl.add("400 -32600", "other")
	if got := tl.String(); got != "400 -32600 ×2, 200 ×1" {
		t.Errorf("tally = %q", got)
	}
	if m := tl.messages(); len(m) != 1 || !strings.Contains(m[0], "too deep") {
		t.Errorf("messages = %q", m)
	}
}

func TestOnlyHostile(t *testing.T) {
	t.Parallel()
	c, err := parseFlags([]string{"-only", "hostile"})
	if err != nil {
		t.Fatal(err)
	}
	if len(c.hostileBudgets) != 2 || len(c.variants) != 0 || len(c.largeSizes) != 0 || c.memSessions != 0 || c.goBench || c.out != "" || c.plot != "" {
		t.Errorf("-only hostile config = %+v", c)
	}
	if c, _ := parseFlags([]string{"-smoke"}); len(c.hostileBudgets) != 0 {
		t.Errorf("-smoke runs the hostile section: %v", c.hostileBudgets)
	}
	if c, _ := parseFlags([]string{"-only", "large"}); len(c.hostileBudgets) != 0 {
		t.Errorf("-only large runs the hostile section: %v", c.hostileBudgets)
	}
	if _, err := parseFlags([]string{"-hostile-attacks", "nested,nope"}); err == nil {
		t.Error("-hostile-attacks accepted an unknown attack")
	}
	if c, _ := parseFlags([]string{}); len(c.hostileBudgets) != 2 || c.hostileBudgets[1] != 64 {
		t.Errorf("full run: hostile passes %v, want [0 64]", c.hostileBudgets)
	}
}

func TestHostileAttackList(t *testing.T) {
	t.Parallel()
	h := &harness{}
	all := h.hostileAttacks(&hostilePass{Budget: defMemoryBudget})
	if len(all) != len(hostileAttackIDs) {
		t.Fatalf("%d attacks, %d ids", len(all), len(hostileAttackIDs))
	}
	for i, at := range all {
		if at.id != hostileAttackIDs[i] || at.run == nil || at.cap == "" {
			t.Errorf("attack %d: %+v", i, at)
		}
	}
	h.cfg.hostileAttacks = []string{"slow", "nested"}
	if got := h.hostileAttacks(&hostilePass{}); len(got) != 2 || got[0].id != "nested" || got[1].id != "slow" {
		t.Errorf("-hostile-attacks slow,nested: %d attacks", len(got))
	}
}

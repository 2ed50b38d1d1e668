package main

import (
	"bufio"
	"bytes"
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"testing/iotest"
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

func TestHostileSubscribe(t *testing.T) {
	t.Parallel()
	up := newHostileUpstream()
	srv := httptest.NewServer(up)
	defer srv.Close()
	ctx := context.Background()
	s, err := bench.Initialize(ctx, srv.Client(), srv.URL, true)
	if err != nil {
		t.Fatal(err)
	}
	req, _ := http.NewRequest(http.MethodPost, srv.URL, bytes.NewReader(subscribeBody(3, 100_000)))
	req.Header = s.Header()
	resp, err := srv.Client().Do(req)
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK || !gjson.GetBytes(body, "result").IsObject() {
		t.Errorf("subscribe: %d %.200s", resp.StatusCode, body)
	}
	if got := up.stats().Subscribes; got != 1 {
		t.Errorf("%d subscribes counted, want 1", got)
	}
	if uri := gjson.GetBytes(subscribeBody(3, 100_000), "params.uri").Str; len(uri) != 100_000 || !strings.HasPrefix(uri, hostileFloodURI+"3/") {
		t.Errorf("subscribeBody: a URI of %d bytes, %.30q", len(uri), uri)
	}
}

func TestHostileModern(t *testing.T) {
	t.Parallel()
	up := newHostileUpstream()
	mux := http.NewServeMux()
	up.register(mux)
	const fat = 300_000
	mux.Handle("/fat-test/mcp", &hostileModern{u: up, instructions: fat})
	srv := httptest.NewServer(mux)
	defer srv.Close()
	hc := srv.Client()
	post := func(path, version, body string) (int, []byte) {
		t.Helper()
		req, _ := http.NewRequest(http.MethodPost, srv.URL+path, strings.NewReader(body))
		req.Header.Set("Content-Type", "application/json")
		if version != "" {
			req.Header.Set("Mcp-Protocol-Version", version)
		}
		resp, err := hc.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, err := io.ReadAll(resp.Body)
		if err != nil {
			t.Fatal(err)
		}
		return resp.StatusCode, b
	}
	const discover = `{"jsonrpc":"2.0","id":5,"method":"server/discover","params":{}}`
	st, b := post(hostileModernPath, modernVersion, discover)
	if st != http.StatusOK || gjson.GetBytes(b, "result.supportedVersions").Raw != `["2026-07-28"]` ||
		!gjson.GetBytes(b, "result.capabilities.resources.subscribe").Bool() || gjson.GetBytes(b, "id").Raw != "5" ||
		gjson.GetBytes(b, `result._meta.io\.modelcontextprotocol/serverInfo.name`).Str != "hostile" || gjson.GetBytes(b, "result.instructions").Exists() {
		t.Errorf("discover: %d %.300s", st, b)
	}
	st, b = post("/fat-test/mcp", modernVersion, discover)
	if ins := gjson.GetBytes(b, "result.instructions").Str; st != http.StatusOK || len(ins) != fat || strings.Trim(ins, "x") != "" {
		t.Errorf("fat discover: %d, %d bytes of instructions", st, len(ins))
	}
	if n, _, err := countInstructions(bufio.NewReader(bytes.NewReader(b))); n != fat || err != nil {
		t.Errorf("countInstructions: %d, %v", n, err)
	}
	// A session-era request is refused as such a server does.
	if st, b := post(hostileModernPath, bench.ProtocolVersion, string(initBodyVersion("x", "2025-11-25"))); st != http.StatusBadRequest ||
		gjson.GetBytes(b, "error.code").Int() != -32022 {
		t.Errorf("initialize: %d %s", st, b)
	}
	if st, b := post(hostileModernPath, modernVersion, string(toolCall(6, bench.EchoTool, `{"text":"hi"}`))); st != http.StatusOK ||
		gjson.GetBytes(b, "result.content.0.text").Str != "hi" {
		t.Errorf("echo: %d %s", st, b)
	}
	if st, _ := post(hostileModernPath, modernVersion, string(subscribeBody(1, 1000))); st != http.StatusNotFound {
		t.Errorf("resources/subscribe: %d, want 404", st)
	}
	if resp, err := hc.Get(srv.URL + hostileModernPath); err != nil || resp.StatusCode != http.StatusMethodNotAllowed {
		t.Errorf("GET: %v %v", resp, err)
	}
	// A listen's URIs are counted; it stays open until the client leaves.
	listen := `{"jsonrpc":"2.0","id":0,"method":"subscriptions/listen","params":{"notifications":{"resourceSubscriptions":["` +
		hostileFloodURI + `1/a","` + hostileFloodURI + `2/b","other://x"]}}}`
	ctx, cancel := context.WithCancel(context.Background())
	req, _ := http.NewRequestWithContext(ctx, http.MethodPost, srv.URL+hostileModernPath, strings.NewReader(listen))
	req.Header.Set("Mcp-Protocol-Version", modernVersion)
	resp, err := hc.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	line, _ := bufio.NewReader(resp.Body).ReadString('\n')
	cancel()
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK || line != "event: message\n" {
		t.Errorf("listen: %d %q", resp.StatusCode, line)
	}
	s := up.stats()
	if s.Subscribes != 3 || s.Listens != 1 || s.Discovers != 2 || s.Calls[bench.EchoTool] != 1 {
		t.Errorf("stats %+v, want 3 subscribes (1 + 2 URIs in a listen), 1 listen, 2 discovers, 1 echo", s)
	}
}

func TestReadCounting(t *testing.T) {
	t.Parallel()
	marker := []byte(`"ab`)
	body := strings.Repeat(`x"ab`, 1000) + `"a`
	for _, limit := range []int{0, 1, 2, 3, 4, 5, 1000, 5000} {
		head, n, err := readCounting(iotest.OneByteReader(strings.NewReader(body)), limit, marker)
		if err != nil || n != 1000 || len(head) != min(limit, len(body)) {
			t.Errorf("limit %d: %d markers, %d bytes of head, %v", limit, n, len(head), err)
		}
	}
}

func TestCountInstructions(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		body string
		want int
		err  bool
	}{
		{`{"result":{"instructions":"xxxx"}}`, 4, false},
		{`{"result":{"instructions":""}}`, 0, false},
		{`{"result":{}}`, -1, false},
		{`{"result":{"instructions":"xxyx"}}`, 0, true},
		{`data: {"result":{"instructions":"` + strings.Repeat("x", 200_000) + `"}}` + "\n\n", 200_000, false},
	} {
		n, read, err := countInstructions(bufio.NewReaderSize(strings.NewReader(tc.body), 16))
		if (err != nil) != tc.err || !tc.err && (n != tc.want || read != int64(len(tc.body))) {
			t.Errorf("%.40q: %d instructions, %d bytes read, %v", tc.body, n, read, err)
		}
	}
}

func TestBarrier(t *testing.T) {
	t.Parallel()
	b := newBarrier(3, time.Minute)
	var wg sync.WaitGroup
	for range 3 {
		wg.Add(1)
		go func() { defer wg.Done(); b.arrive() }()
	}
	wg.Wait()
	if !b.met() {
		t.Error("3 of 3 arrived: not met")
	}
	b = newBarrier(2, 10*time.Millisecond)
	b.arrive() // returns at the timeout
	if b.met() {
		t.Error("1 of 2 arrived: met")
	}
}

func TestHostileBigEvent(t *testing.T) {
	t.Parallel()
	up := newHostileUpstream()
	mux := http.NewServeMux()
	up.register(mux)
	srv := httptest.NewServer(mux)
	defer srv.Close()
	ctx := context.Background()
	hc := srv.Client()
	s, err := bench.Initialize(ctx, hc, srv.URL+hostilePath, true)
	if err != nil {
		t.Fatal(err)
	}
	call := func(body []byte) (streamAnswer, time.Duration) {
		t.Helper()
		req, _ := http.NewRequest(http.MethodPost, s.URL, bytes.NewReader(body))
		req.Header = s.Header()
		start := time.Now()
		resp, err := hc.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		return readStream(resp), time.Since(start)
	}
	const size = 300_000
	// A progress event of size bytes naming the call's token, then the
	// result.
	x, _ := call(heldCallBody(5, "big_progress", `{"bytes":300000}`))
	if x.err != nil || x.status != http.StatusOK || x.result() != "done" || x.n < size ||
		!bytes.HasPrefix(x.head, []byte(`event: message`+"\n"+`data: {"jsonrpc":"2.0","method":"notifications/progress","params":{"progressToken":5,`)) {
		t.Errorf("big_progress: %s, %d bytes, head %.120q", x.key(), x.n, x.head)
	}
	// A sampling request whose line ends only after the hold.
	x, took := call(toolCall(6, "big_request", `{"bytes":300000,"hold_ms":300}`))
	if x.err != nil || x.result() != "done" || x.n < size || took < 300*time.Millisecond ||
		!bytes.Contains(x.head, []byte(`"id":"ask-6","method":"sampling/createMessage"`)) {
		t.Errorf("big_request: %s, %d bytes in %s, head %.120q", x.key(), x.n, took, x.head)
	}
	req, _ := http.NewRequest(http.MethodPost, s.URL, bytes.NewReader(toolCall(7, "big_request", `{"bytes":300000,"hold_ms":2000}`)))
	req.Header = s.Header()
	resp, err := hc.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	br := bufio.NewReader(resp.Body)
	if _, err := br.ReadString('\n'); err != nil { // event: message
		t.Fatal(err)
	}
	got := make(chan error, 1)
	go func() { _, err := br.ReadString('\n'); got <- err }()
	select {
	case err := <-got:
		t.Errorf("the request's line ended before the hold (%v)", err)
	case <-time.After(500 * time.Millisecond):
	}
	resp.Body.Close()
	// Expired sessions get 404 -32001; the counters say so.
	if err := getJSON(ctx, hc, http.MethodPost, srv.URL+"/admin/expire", &struct{}{}); err != nil {
		t.Fatal(err)
	}
	req, _ = http.NewRequest(http.MethodPost, s.URL, strings.NewReader(`{"jsonrpc":"2.0","id":8,"method":"ping"}`))
	req.Header = s.Header()
	if resp, err := hc.Do(req); err != nil || resp.StatusCode != http.StatusNotFound {
		t.Errorf("ping after expire: %v %v, want 404", resp, err)
	}
	// The protected resource metadata: hostileMetadata bytes of padding,
	// the resource the server's own URL, with Content-Length.
	resp, err = hc.Get(srv.URL + hostileWellKnown)
	if err != nil {
		t.Fatal(err)
	}
	doc, err := io.ReadAll(resp.Body)
	resp.Body.Close()
	if err != nil || resp.ContentLength != int64(len(doc)) || gjson.GetBytes(doc, "resource").Str != srv.URL+hostilePath ||
		len(gjson.GetBytes(doc, "bench_padding").Str) != hostileMetadata {
		t.Errorf("metadata: %d bytes (Content-Length %d), %v, %.100s", len(doc), resp.ContentLength, err, doc)
	}
	st := up.stats()
	if st.Calls["big_progress"] != 1 || st.Calls["big_request"] != 2 || st.Expired != 1 || st.WellKnowns != 1 {
		t.Errorf("stats %+v, want 1 big_progress, 2 big_request, 1 expired, 1 metadata document", st)
	}
}

func TestLastMessage(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		tail string
		sse  bool
		want string
	}{
		{"xxxx\"}}\n\nevent: message\ndata: {\"id\":1,\"result\":{\"content\":[{\"text\":\"done\"}]}}\n\n", true, "done"},
		{"data: {\"id\":1,\"error\":{\"code\":-32017}}\r\n\r\n", true, "-32017"},
		{"xxdata:xx\n\ndata: {\"id\":2,\"result\":{\"content\":[{\"text\":\"a\"}]}}\n\n", true, "a"},
		{"abcdata: {\"id\":3}", true, ""},
		{` {"id":4,"error":{"code":-32016}} `, false, "-32016"},
	} {
		m := lastMessage([]byte(tc.tail), tc.sse)
		got := m.Get("result.content.0.text").Str
		if c := m.Get("error.code"); c.Exists() {
			got = c.Raw
		}
		if got != tc.want {
			t.Errorf("lastMessage(%.40q) = %s, want %q", tc.tail, m.Raw, tc.want)
		}
	}
}

func TestHeldCallBody(t *testing.T) {
	t.Parallel()
	b := heldCallBody(7, "big_progress", `{"bytes":1}`)
	m := gjson.ParseBytes(b)
	if !gjson.ValidBytes(b) || m.Get("params.name").Str != "big_progress" || m.Get("params.arguments.bytes").Int() != 1 ||
		m.Get("params._meta.progressToken").Int() != 7 || m.Get(`params._meta.io\.modelcontextprotocol/protocolVersion`).Str != modernVersion ||
		!m.Get(`params._meta.io\.modelcontextprotocol/clientInfo.name`).Exists() {
		t.Errorf("heldCallBody: %s", b)
	}
	if h := heldHeader("big_progress"); h.Get("Mcp-Protocol-Version") != modernVersion || h.Get("Mcp-Method") != "tools/call" || h.Get("Mcp-Name") != "big_progress" {
		t.Errorf("heldHeader: %v", h)
	}
}

// TestPostInstructions: an initialize answer is read for its instructions,
// and mcpheal's own error in HTTP 200 (-32017) is read as the error.
func TestPostInstructions(t *testing.T) {
	t.Parallel()
	var body atomic.Value
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		_, _ = io.WriteString(w, body.Load().(string))
	}))
	defer srv.Close()
	a := &attackRun{url: srv.URL, hc: srv.Client()}
	body.Store(`{"jsonrpc":"2.0","id":1,"error":{"code":-32017,"message":"initialize not answered: mcpheal's memory_budget is reached"}}`)
	x, instr := a.postInstructions(context.Background(), initBodyVersion("x", "2025-11-25"), func() {})
	if x.status != http.StatusOK || x.code != -32017 || !strings.Contains(x.msg, "memory_budget") || instr != -1 {
		t.Errorf("refusal: %+v, %d instructions", x, instr)
	}
	body.Store(`{"jsonrpc":"2.0","id":1,"result":{"protocolVersion":"2025-11-25","instructions":"` + strings.Repeat("x", 100_000) + `"}}`)
	x, instr = a.postInstructions(context.Background(), initBodyVersion("x", "2025-11-25"), func() {})
	if x.status != http.StatusOK || x.code != 0 || x.err != nil || instr != 100_000 {
		t.Errorf("answer: %+v, %d instructions", x, instr)
	}
}

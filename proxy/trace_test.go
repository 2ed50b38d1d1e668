package proxy

import (
	"context"
	"encoding/hex"
	"io"
	"net"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/modelcontextprotocol/go-sdk/mcp"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	coltracepb "go.opentelemetry.io/proto/otlp/collector/trace/v1"
	commonpb "go.opentelemetry.io/proto/otlp/common/v1"
	tracepb "go.opentelemetry.io/proto/otlp/trace/v1"
	"google.golang.org/protobuf/proto"

	"github.com/mcpheal/mcpheal/proxy/internal/conf"
	"github.com/mcpheal/mcpheal/proxy/internal/obs"
	"github.com/mcpheal/mcpheal/proxy/internal/peers"
	"github.com/mcpheal/mcpheal/proxy/telemetry"
)

// otlpReceiver is an OTLP/HTTP traces endpoint on 127.0.0.1 that decodes
// what it receives with the OTLP protobuf definitions and keeps the spans.
type otlpReceiver struct {
	url   string
	mu    sync.Mutex
	spans []*tracepb.Span
	attrs map[*tracepb.Span]map[string]string
}

func startOTLPReceiver(t *testing.T) *otlpReceiver {
	t.Helper()
	rcv := &otlpReceiver{attrs: map[*tracepb.Span]map[string]string{}}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{ReadHeaderTimeout: 5 * time.Second, Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		var req coltracepb.ExportTraceServiceRequest
		if r.URL.Path != "/v1/traces" || r.Header.Get("Content-Type") != "application/x-protobuf" || proto.Unmarshal(body, &req) != nil {
			t.Errorf("OTLP receiver: %s %s %s: not an OTLP/HTTP protobuf export", r.Method, r.URL.Path, r.Header.Get("Content-Type"))
			w.WriteHeader(http.StatusBadRequest)
			return
		}
		rcv.mu.Lock()
		for _, rs := range req.ResourceSpans {
			for _, ss := range rs.ScopeSpans {
				for _, sp := range ss.Spans {
					rcv.spans = append(rcv.spans, sp)
					m := map[string]string{}
					for _, kv := range sp.Attributes {
						switch v := kv.Value.Value.(type) {
						case *commonpb.AnyValue_StringValue:
							m[kv.Key] = v.StringValue
						case *commonpb.AnyValue_IntValue:
							m[kv.Key] = strconv.FormatInt(v.IntValue, 10)
						}
					}
					rcv.attrs[sp] = m
				}
			}
		}
		rcv.mu.Unlock()
		w.Header().Set("Content-Type", "application/x-protobuf")
		b, _ := proto.Marshal(&coltracepb.ExportTraceServiceResponse{})
		_, _ = w.Write(b)
	})}
	go func() { _ = srv.Serve(ln) }()
	t.Cleanup(func() { _ = srv.Close() })
	rcv.url = "http://" + ln.Addr().String()
	return rcv
}

// named returns the spans of that name.
func (rcv *otlpReceiver) named(name string) []*tracepb.Span {
	rcv.mu.Lock()
	defer rcv.mu.Unlock()
	var out []*tracepb.Span
	for _, sp := range rcv.spans {
		if sp.Name == name {
			out = append(out, sp)
		}
	}
	return out
}

func (rcv *otlpReceiver) attr(sp *tracepb.Span, key string) string {
	rcv.mu.Lock()
	defer rcv.mu.Unlock()
	return rcv.attrs[sp][key]
}

// TestTraceOfAHeal: an agent's tools/call, carrying its W3C trace
// context, meets a dead upstream session, and mcpheal heals it. Exported
// by OTLP and decoded here: the agent's trace is continued by the
// request's span; under it, the failed exchange, the heal span (reason
// session_gone, outcome ok) with the initialize under it, and the replay;
// every request mcpheal sent upstream for the call, the heal's initialize
// included, carries that trace id.
func TestTraceOfAHeal(t *testing.T) {
	t.Parallel()
	rcv := startOTLPReceiver(t)
	tp, shutdown, err := telemetry.New(context.Background(), telemetry.Config{Endpoint: rcv.url}, "test",
		func(string) (string, bool) { return "", false })
	if err != nil || tp == nil {
		t.Fatalf("telemetry.New = %v, %v", tp, err)
	}
	up := peers.StartGoSDK(t, peers.GoSDKOpts{})
	_, url, logs := startProxyLog(t, up.URL(), func(c *conf.Config) { c.Tracer = tp })
	sid := peers.RawInitialize(t, url)
	up.ExpireSessions()
	before := len(up.Requests())

	const traceID = "4bf92f3577b34da6a3ce929d0e0e4736"
	req, _ := http.NewRequest(http.MethodPost, url, strings.NewReader(
		`{"jsonrpc":"2.0","id":7,"method":"tools/call","params":{"name":"echo","arguments":{"text":"traced"}}}`))
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Accept", "application/json, text/event-stream")
	req.Header.Set("Mcp-Session-Id", sid)
	req.Header.Set("MCP-Protocol-Version", "2025-11-25")
	req.Header.Set("traceparent", "00-"+traceID+"-00f067aa0ba902b7-01")
	resp, err := peers.RawClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK || !strings.Contains(string(body), "traced") {
		t.Fatalf("call after the upstream session died: %d %s; want healed", resp.StatusCode, body)
	}
	if err := shutdown(context.Background()); err != nil {
		t.Fatalf("flushing the spans: %v", err)
	}

	calls := rcv.named("tools/call echo")
	var server *tracepb.Span
	for _, sp := range calls {
		if sp.Kind == tracepb.Span_SPAN_KIND_SERVER {
			server = sp
		}
	}
	if server == nil {
		t.Fatalf("no server span \"tools/call echo\"; spans: %v", spanNames(rcv))
	}
	if got := hex.EncodeToString(server.TraceId); got != traceID {
		t.Fatalf("request span in trace %s; want the agent's %s continued", got, traceID)
	}
	if got := hex.EncodeToString(server.ParentSpanId); got != "00f067aa0ba902b7" {
		t.Fatalf("request span's parent %s; want the agent's span", got)
	}
	if rcv.attr(server, "mcp.method.name") != "tools/call" || rcv.attr(server, "gen_ai.tool.name") != "echo" {
		t.Errorf("request span attributes: method %q, tool %q", rcv.attr(server, "mcp.method.name"), rcv.attr(server, "gen_ai.tool.name"))
	}
	if s := rcv.attr(server, "mcp.session.id"); s == "" || strings.Contains(sid, s) && len(s) > 8 {
		t.Errorf("request span's session %q; want a short hash of the session id", s)
	}
	exchanges := 0
	for _, sp := range calls {
		if sp.Kind == tracepb.Span_SPAN_KIND_CLIENT && string(sp.ParentSpanId) == string(server.SpanId) {
			exchanges++
		}
	}
	if exchanges != 2 {
		t.Errorf("%d exchange spans under the request; want 2 (the dead session's, the replay)", exchanges)
	}
	heals := rcv.named("mcpheal heal")
	if len(heals) != 1 {
		t.Fatalf("%d heal spans; want 1", len(heals))
	}
	heal := heals[0]
	if string(heal.TraceId) != string(server.TraceId) || string(heal.ParentSpanId) != string(server.SpanId) {
		t.Errorf("the heal span is not a child of the request's")
	}
	if r, o := rcv.attr(heal, "mcpheal.heal.reason"), rcv.attr(heal, "mcpheal.heal.outcome"); r != "session_gone" || o != "ok" {
		t.Errorf("heal span: reason %q, outcome %q; want session_gone, ok", r, o)
	}
	under := 0
	for _, sp := range rcv.named("initialize") {
		if string(sp.ParentSpanId) == string(heal.SpanId) {
			under++
		}
	}
	if under != 1 {
		t.Errorf("%d initialize spans under the heal; want 1", under)
	}
	healed := false
	for _, line := range strings.Split(logs.String(), "\n") {
		if strings.Contains(line, `"message":"session healed"`) {
			healed = true
			if !strings.Contains(line, `"trace_id":"`+traceID+`"`) {
				t.Errorf("the heal's log line has not the trace id %s: %s", traceID, line)
			}
		}
	}
	if !healed {
		t.Errorf("no \"session healed\" log line")
	}
	for _, r := range up.Requests()[before:] {
		if r.HTTPMethod != http.MethodPost {
			continue
		}
		tp := r.Header.Get("traceparent")
		if !strings.HasPrefix(tp, "00-"+traceID+"-") {
			t.Errorf("upstream %s carried traceparent %q; want the agent's trace %s", r.RPCMethod, tp, traceID)
		}
	}
}

// TestTraceFromMeta: an MCP 2026-07-28 agent puts its trace context in the
// request's params._meta instead of headers; mcpheal continues it there.
func TestTraceFromMeta(t *testing.T) {
	t.Parallel()
	rcv := startOTLPReceiver(t)
	tp, shutdown, err := telemetry.New(context.Background(), telemetry.Config{Endpoint: rcv.url}, "test",
		func(string) (string, bool) { return "", false })
	if err != nil {
		t.Fatal(err)
	}
	up := peers.StartGoSDK(t, peers.GoSDKOpts{})
	_, url := startProxy(t, up.URL(), func(c *conf.Config) { c.Tracer = tp })
	sid := peers.RawInitialize(t, url)
	const traceID = "0af7651916cd43dd8448eb211c80319c"
	resp, body := peers.RawPost(t, url, sid, `{"jsonrpc":"2.0","id":3,"method":"tools/list","params":{"_meta":{"traceparent":"00-`+
		traceID+`-b7ad6b7169203331-01"}}}`)
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("tools/list: %d %s", resp.StatusCode, body)
	}
	_ = shutdown(context.Background())
	for _, sp := range rcv.named("tools/list") {
		if sp.Kind == tracepb.Span_SPAN_KIND_SERVER {
			if got := hex.EncodeToString(sp.TraceId); got != traceID {
				t.Fatalf("request span in trace %s; want %s from params._meta", got, traceID)
			}
			return
		}
	}
	t.Fatalf("no server span for tools/list; spans: %v", spanNames(rcv))
}

func spanNames(rcv *otlpReceiver) []string {
	rcv.mu.Lock()
	defer rcv.mu.Unlock()
	var n []string
	for _, sp := range rcv.spans {
		n = append(n, sp.Name)
	}
	return n
}

// TestTraceOfBridgeRounds: a session-era agent's call that a 2026-07-28
// server answers with an InputRequiredResult is one request span with a
// span per round beneath it, each round's upstream exchange under its
// round.
func TestTraceOfBridgeRounds(t *testing.T) {
	t.Parallel()
	rcv := startOTLPReceiver(t)
	tp, shutdown, err := telemetry.New(context.Background(), telemetry.Config{Endpoint: rcv.url}, "test",
		func(string) (string, bool) { return "", false })
	if err != nil {
		t.Fatal(err)
	}
	up := startModern(t)
	_, url := startProxy(t, up.url, func(c *conf.Config) { c.Tracer = tp })
	cs, err := legacyClient(t, url, &mcp.ClientOptions{
		CreateMessageHandler: func(context.Context, *mcp.CreateMessageRequest) (*mcp.CreateMessageResult, error) {
			return &mcp.CreateMessageResult{Model: "m", Role: "assistant", Content: &mcp.TextContent{Text: "ok"}}, nil
		},
	})
	if err != nil {
		t.Fatalf("connect through mcpheal: %v", err)
	}
	res, err := peers.GoSDKCall(t, cs, "sample", map[string]any{"text": "hi"})
	if err != nil || peers.ResultText(res) != "sampled ok state=round-1" {
		t.Fatalf("sample: %q, %v", peers.ResultText(res), err)
	}
	if err := shutdown(context.Background()); err != nil {
		t.Fatalf("flushing the spans: %v", err)
	}
	var call *tracepb.Span
	for _, sp := range rcv.named("tools/call sample") {
		if sp.Kind == tracepb.Span_SPAN_KIND_SERVER {
			call = sp
		}
	}
	if call == nil {
		t.Fatalf("no server span \"tools/call sample\"; spans: %v", spanNames(rcv))
	}
	rounds := map[string]*tracepb.Span{}
	for _, sp := range rcv.named("mcpheal bridge round") {
		if string(sp.ParentSpanId) == string(call.SpanId) {
			rounds[rcv.attr(sp, "mcpheal.bridge.round")] = sp
		}
	}
	if len(rounds) != 2 || rounds["1"] == nil || rounds["2"] == nil {
		t.Fatalf("round spans under the call: %v; want rounds 1 and 2", rounds)
	}
	for n, round := range rounds {
		under := 0
		for _, sp := range rcv.named("tools/call sample") {
			if sp.Kind == tracepb.Span_SPAN_KIND_CLIENT && string(sp.ParentSpanId) == string(round.SpanId) {
				under++
			}
		}
		if under != 1 {
			t.Errorf("round %s: %d upstream exchanges beneath it; want 1", n, under)
		}
	}
}

// TestSpanCopiesBounded: a span copies at most maxSpanText bytes of what
// the agent chose (method, id, tool name), whatever their size: a span
// lives until it is exported, and 150 requests naming a 3.9 MB tool held
// 1.2 GB behind a slow collector.
func TestSpanCopiesBounded(t *testing.T) {
	t.Parallel()
	spans := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(spans))
	up := peers.StartGoSDK(t, peers.GoSDKOpts{})
	_, url := startProxy(t, up.URL(), func(c *conf.Config) { c.Tracer = tp; c.MaxBody = 8 << 20 })
	sid := peers.RawInitialize(t, url)
	huge := strings.Repeat("é", 1<<19) // 1 MiB, two bytes a rune
	peers.RawPost(t, url, sid, `{"jsonrpc":"2.0","id":"`+huge+`","method":"tools/call","params":{"name":"`+huge+`","arguments":{}}}`)
	peers.RawPost(t, url, sid, `{"jsonrpc":"2.0","id":3,"method":"`+huge+`"}`)
	ended := spans.Ended()
	if len(ended) < 2 {
		t.Fatalf("%d spans", len(ended))
	}
	for _, sp := range ended {
		if n := len(sp.Name()); n > 2*obs.MaxSpanText+8 {
			t.Errorf("span name of %d bytes", n)
		}
		if !utf8.ValidString(sp.Name()) {
			t.Errorf("span name cut inside a rune: %q", sp.Name())
		}
		for _, kv := range sp.Attributes() {
			if n := len(kv.Value.Emit()); n > obs.MaxSpanText+8 {
				t.Errorf("span %.40q: attribute %s of %d bytes", sp.Name(), kv.Key, n)
			}
		}
	}
}

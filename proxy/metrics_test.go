package proxy

import (
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"

	"github.com/mcpheal/mcpheal/proxy/internal/conf"
	"github.com/mcpheal/mcpheal/proxy/internal/peers"
	"github.com/mcpheal/mcpheal/session"
)

// The Grafana dashboard shipped for operators (docs/observability.md "Metrics"). Its
// tests check, offline, that Grafana can load it, and that every metric its
// queries name is one a running mcpheal serves on /metrics.
const dashboardFile = "../examples/grafana/mcpheal.json"

// dashPanelTypes are Grafana's built-in panel types.
var dashPanelTypes = map[string]bool{
	"row": true, "timeseries": true, "stat": true, "gauge": true, "bargauge": true, "table": true,
	"state-timeline": true, "status-history": true, "heatmap": true, "histogram": true, "piechart": true,
	"barchart": true, "text": true, "logs": true, "nodeGraph": true, "traces": true, "flamegraph": true,
	"trend": true, "xychart": true, "candlestick": true, "canvas": true, "geomap": true, "dashlist": true,
	"alertlist": true, "annolist": true, "news": true, "datagrid": true,
}

// dashUnitTypes are the panel types whose values need a unit.
var dashUnitTypes = map[string]bool{"timeseries": true, "stat": true, "gauge": true, "bargauge": true}

// dashBuiltinVars are the variables Grafana itself defines.
var dashBuiltinVars = map[string]bool{
	"__rate_interval": true, "__interval": true, "__interval_ms": true,
	"__range": true, "__range_s": true, "__range_ms": true,
}

// dashDatasource is the datasource every panel, query and query variable
// must name: the dashboard's Prometheus datasource variable.
const dashDatasource = "${datasource}"

type dashboard struct {
	Title         string       `json:"title"`
	UID           string       `json:"uid"`
	SchemaVersion int          `json:"schemaVersion"`
	Panels        []dashPanel  `json:"panels"`
	Templating    dashTemplate `json:"templating"`
}

type dashTemplate struct {
	List []dashVariable `json:"list"`
}

type dashVariable struct {
	Name       string          `json:"name"`
	Type       string          `json:"type"`
	Datasource *dashRef        `json:"datasource"`
	Query      json.RawMessage `json:"query"` // a string, or {"query": "..."} for Prometheus
	Definition string          `json:"definition"`
}

type dashRef struct {
	Type string `json:"type"`
	UID  string `json:"uid"`
}

type dashPanel struct {
	ID          *int         `json:"id"`
	Type        string       `json:"type"`
	Title       string       `json:"title"`
	Description string       `json:"description"`
	GridPos     *dashGridPos `json:"gridPos"`
	Datasource  *dashRef     `json:"datasource"`
	Targets     []dashTarget `json:"targets"`
	FieldConfig struct {
		Defaults struct {
			Unit string `json:"unit"`
		} `json:"defaults"`
	} `json:"fieldConfig"`
	Collapsed bool        `json:"collapsed"`
	Panels    []dashPanel `json:"panels"` // a collapsed row's
}

type dashGridPos struct {
	X int `json:"x"`
	Y int `json:"y"`
	W int `json:"w"`
	H int `json:"h"`
}

type dashTarget struct {
	RefID      string   `json:"refId"`
	Expr       string   `json:"expr"`
	Datasource *dashRef `json:"datasource"`
}

// loadDashboard reads the dashboard and reports the top-level fields
// Grafana needs that it lacks.
func loadDashboard(t *testing.T, raw []byte) (d dashboard, problems []string) {
	t.Helper()
	var top map[string]json.RawMessage
	if err := json.Unmarshal(raw, &top); err != nil {
		t.Fatalf("%s is not JSON: %v", dashboardFile, err)
	}
	for _, f := range []string{"title", "uid", "schemaVersion", "panels", "templating"} {
		if len(top[f]) == 0 || string(top[f]) == "null" {
			problems = append(problems, "no top-level "+f)
		}
	}
	if err := json.Unmarshal(raw, &d); err != nil {
		t.Fatalf("%s does not have the shape of a Grafana dashboard: %v", dashboardFile, err)
	}
	return d, problems
}

// dashStructureProblems checks what Grafana needs of a dashboard's panels
// and variables, as far as it can be checked without Grafana.
func dashStructureProblems(d dashboard) []string {
	var out []string
	bad := func(format string, args ...any) { out = append(out, fmt.Sprintf(format, args...)) }
	if strings.TrimSpace(d.Title) == "" || strings.TrimSpace(d.UID) == "" || len(d.UID) > 40 {
		bad("title %q, uid %q: both needed, uid at most 40 characters", d.Title, d.UID)
	}
	if d.SchemaVersion < 36 || d.SchemaVersion > 41 {
		bad("schemaVersion %d: want the JSON model of Grafana 10 or 11 (36..41)", d.SchemaVersion)
	}
	vars := map[string]bool{}
	hasDS := false
	for _, v := range d.Templating.List {
		if v.Name == "" || vars[v.Name] {
			bad("template variable %q: empty or defined twice", v.Name)
		}
		vars[v.Name] = true
		switch v.Type {
		case "datasource":
			if v.Name == "datasource" && strings.Contains(string(v.Query), `"prometheus"`) {
				hasDS = true
			}
		case "query":
			if v.Datasource == nil || v.Datasource.UID != dashDatasource {
				bad("template variable %q: datasource %+v, want uid %s", v.Name, v.Datasource, dashDatasource)
			}
			if dashVarQuery(v) == "" {
				bad("template variable %q: no query", v.Name)
			}
		}
	}
	if !hasDS {
		bad("no Prometheus datasource variable named datasource (type datasource, query prometheus)")
	}
	for _, v := range d.Templating.List {
		for _, ref := range dashVarRefs(dashVarQuery(v)) {
			if !vars[ref] && !dashBuiltinVars[ref] {
				bad("template variable %q: query uses $%s, which is not defined", v.Name, ref)
			}
		}
	}

	ids := map[int]string{}
	var check func(p dashPanel, where string)
	check = func(p dashPanel, where string) {
		name := fmt.Sprintf("%s panel %q", where, p.Title)
		switch {
		case p.ID == nil || *p.ID <= 0:
			bad("%s: no positive id", name)
		case ids[*p.ID] != "":
			bad("%s: id %d already used by %s", name, *p.ID, ids[*p.ID])
		default:
			ids[*p.ID] = name
		}
		if !dashPanelTypes[p.Type] {
			bad("%s: type %q is not a Grafana panel type", name, p.Type)
		}
		if strings.TrimSpace(p.Title) == "" {
			bad("%s: no title", name)
		}
		if g := p.GridPos; g == nil {
			bad("%s: no gridPos", name)
		} else if g.W < 1 || g.H < 1 || g.X < 0 || g.Y < 0 || g.X+g.W > 24 {
			bad("%s: gridPos %+v outside the 24-column grid", name, *g)
		}
		if p.Type == "row" {
			if p.GridPos != nil && (p.GridPos.W != 24 || p.GridPos.H != 1 || p.GridPos.X != 0) {
				bad("%s: a row spans the grid: gridPos %+v, want x 0, w 24, h 1", name, *p.GridPos)
			}
			if len(p.Targets) > 0 {
				bad("%s: a row has no queries", name)
			}
			if !p.Collapsed && len(p.Panels) > 0 {
				bad("%s: an expanded row keeps its panels at the top level, not inside it", name)
			}
			for _, c := range p.Panels {
				if p.GridPos != nil && c.GridPos != nil && c.GridPos.Y <= p.GridPos.Y {
					bad("%s: panel %q sits above its collapsed row", name, c.Title)
				}
				check(c, fmt.Sprintf("row %q:", p.Title))
			}
			return
		}
		if len(p.Panels) > 0 {
			bad("%s: only rows hold panels", name)
		}
		if strings.TrimSpace(p.Description) == "" {
			bad("%s: no description", name)
		}
		if dashUnitTypes[p.Type] && p.FieldConfig.Defaults.Unit == "" {
			bad("%s: no unit", name)
		}
		if p.Datasource == nil || p.Datasource.Type != "prometheus" || p.Datasource.UID != dashDatasource {
			bad("%s: datasource %+v, want prometheus %s", name, p.Datasource, dashDatasource)
		}
		if len(p.Targets) == 0 {
			bad("%s: no queries", name)
		}
		refs := map[string]bool{}
		for i, tg := range p.Targets {
			if tg.RefID == "" || refs[tg.RefID] {
				bad("%s: query %d: refId %q empty or used twice", name, i, tg.RefID)
			}
			refs[tg.RefID] = true
			if strings.TrimSpace(tg.Expr) == "" {
				bad("%s: query %s: empty expr", name, tg.RefID)
			}
			if tg.Datasource != nil && tg.Datasource.UID != dashDatasource {
				bad("%s: query %s: datasource %+v, want uid %s", name, tg.RefID, *tg.Datasource, dashDatasource)
			}
			for _, ref := range dashVarRefs(tg.Expr) {
				if !vars[ref] && !dashBuiltinVars[ref] {
					bad("%s: query %s uses $%s, which is not defined", name, tg.RefID, ref)
				}
			}
		}
	}
	for _, p := range d.Panels {
		check(p, "")
	}
	out = append(out, dashOverlaps(d.Panels, "the dashboard")...)
	for _, p := range d.Panels {
		if p.Type == "row" && len(p.Panels) > 0 {
			out = append(out, dashOverlaps(p.Panels, fmt.Sprintf("row %q", p.Title))...)
		}
	}
	return out
}

// dashOverlaps reports the panels of one layer of the grid that cover the
// same cells.
func dashOverlaps(panels []dashPanel, where string) []string {
	var out []string
	for i, a := range panels {
		for _, b := range panels[i+1:] {
			g, h := a.GridPos, b.GridPos
			if g == nil || h == nil {
				continue
			}
			if g.X < h.X+h.W && h.X < g.X+g.W && g.Y < h.Y+h.H && h.Y < g.Y+g.H {
				out = append(out, fmt.Sprintf("%s: panels %q %+v and %q %+v overlap", where, a.Title, *g, b.Title, *h))
			}
		}
	}
	return out
}

var dashVarRef = regexp.MustCompile(`\$(?:\{([A-Za-z_]\w*)(?::\w+)?\}|([A-Za-z_]\w*))`)

// dashVarRefs returns the variables s uses ($name, ${name}, ${name:fmt}).
func dashVarRefs(s string) []string {
	var out []string
	for _, m := range dashVarRef.FindAllStringSubmatch(s, -1) {
		out = append(out, m[1]+m[2])
	}
	return out
}

// dashVarQuery is a query variable's PromQL, in either form Grafana saves.
func dashVarQuery(v dashVariable) string {
	var s string
	if json.Unmarshal(v.Query, &s) == nil {
		return s
	}
	var q struct {
		Query string `json:"query"`
	}
	if json.Unmarshal(v.Query, &q) == nil {
		return q.Query
	}
	return ""
}

// dashExprs is every PromQL expression of the dashboard: its panels'
// queries (those of collapsed rows too) and its query variables'.
func dashExprs(d dashboard) []string {
	var out []string
	var walk func([]dashPanel)
	walk = func(ps []dashPanel) {
		for _, p := range ps {
			for _, tg := range p.Targets {
				out = append(out, tg.Expr)
			}
			walk(p.Panels)
		}
	}
	walk(d.Panels)
	for _, v := range d.Templating.List {
		if v.Type == "query" {
			out = append(out, dashVarQuery(v))
		}
	}
	return out
}

// scrapeFamily is what the dashboard check needs of one metric family of
// a /metrics scrape.
type scrapeFamily struct {
	typ    string                     // COUNTER, GAUGE, HISTOGRAM, ...
	labels map[string]map[string]bool // label name → values seen
}

// scrapeFamilies parses a /metrics answer.
func scrapeFamilies(t *testing.T, text string) map[string]scrapeFamily {
	t.Helper()
	parser := expfmt.NewTextParser(model.UTF8Validation)
	families, err := parser.TextToMetricFamilies(strings.NewReader(text))
	if err != nil {
		t.Fatalf("metrics do not parse: %v\n%s", err, text)
	}
	out := map[string]scrapeFamily{}
	for name, f := range families {
		sf := scrapeFamily{typ: f.GetType().String(), labels: map[string]map[string]bool{}}
		for _, m := range f.GetMetric() {
			for _, l := range m.GetLabel() {
				if sf.labels[l.GetName()] == nil {
					sf.labels[l.GetName()] = map[string]bool{}
				}
				sf.labels[l.GetName()][l.GetValue()] = true
			}
		}
		if sf.typ == "HISTOGRAM" {
			sf.labels["le"] = map[string]bool{}
		}
		out[name] = sf
	}
	return out
}

var (
	// dashMetricName is a metric name of mcpheal's in PromQL.
	dashMetricName = regexp.MustCompile(`\bmcpheal_[A-Za-z0-9_:]*`)
	// dashSelector is a metric name with its label matchers.
	dashSelector = regexp.MustCompile(`\b(mcpheal_[A-Za-z0-9_:]*)\s*\{([^}]*)\}`)
	// dashMatcher is one label matcher of a selector.
	dashMatcher = regexp.MustCompile(`([A-Za-z_]\w*)\s*(=~|!~|!=|=)\s*"([^"]*)"`)
	// dashGrouping is by, without, on or ignoring with its label list.
	dashGrouping = regexp.MustCompile(`\b(?:by|without|on|ignoring)\s*\(([^)]*)\)`)
)

// dashScrapeLabels are the labels Prometheus adds to every series it
// scrapes; they are not in mcpheal's /metrics.
var dashScrapeLabels = map[string]bool{"job": true, "instance": true}

// dashFamily maps a metric name used in PromQL to the family of the scrape
// it selects: a histogram's series are its name with _bucket, _sum or
// _count (bucket tells _bucket). why says why the name selects nothing, or is
// empty.
func dashFamily(name string, fams map[string]scrapeFamily) (family string, bucket bool, why string) {
	if f, found := fams[name]; found {
		if f.typ == "HISTOGRAM" || f.typ == "SUMMARY" {
			return "", false, "is a " + strings.ToLower(f.typ) + ": its series are " + name + "_bucket, _sum and _count"
		}
		return name, false, ""
	}
	for _, suffix := range []string{"_bucket", "_sum", "_count"} {
		base, cut := strings.CutSuffix(name, suffix)
		if !cut {
			continue
		}
		f, found := fams[base]
		switch {
		case found && f.typ == "HISTOGRAM", found && f.typ == "SUMMARY" && suffix != "_bucket":
			return base, suffix == "_bucket", ""
		case found:
			return "", false, "has no " + suffix + " series: " + base + " is a " + strings.ToLower(f.typ)
		}
	}
	return "", false, "is not in mcpheal's /metrics"
}

// dashMetricProblems checks each expression's metric names, label
// matchers and grouping labels against the families of a scrape.
func dashMetricProblems(exprs []string, fams map[string]scrapeFamily) []string {
	var out []string
	for _, expr := range exprs {
		labels, unknown := map[string]bool{}, false
		for _, name := range dashMetricName.FindAllString(expr, -1) {
			fam, bucket, why := dashFamily(name, fams)
			if why != "" {
				out = append(out, fmt.Sprintf("%s %s (in %s)", name, why, expr))
				unknown = true
				continue
			}
			for l := range fams[fam].labels {
				if l != "le" || bucket {
					labels[l] = true
				}
			}
		}
		for _, sel := range dashSelector.FindAllStringSubmatch(expr, -1) {
			fam, bucket, why := dashFamily(sel[1], fams)
			if why != "" {
				continue // reported above
			}
			for _, m := range dashMatcher.FindAllStringSubmatch(sel[2], -1) {
				label, op, value := m[1], m[2], m[3]
				if dashScrapeLabels[label] {
					continue
				}
				values, has := fams[fam].labels[label]
				switch {
				case !has || (label == "le" && !bucket):
					out = append(out, fmt.Sprintf("%s has no label %s (in %s)", sel[1], label, expr))
				case op == "=" && !strings.Contains(value, "$") && !values[value] && label != "le":
					out = append(out, fmt.Sprintf("%s has no series with %s=%q (in %s)", sel[1], label, value, expr))
				}
			}
		}
		if unknown {
			continue // its labels are not known either
		}
		for _, g := range dashGrouping.FindAllStringSubmatch(expr, -1) {
			for l := range strings.SplitSeq(g[1], ",") {
				l = strings.TrimSpace(l)
				if l != "" && !dashScrapeLabels[l] && !labels[l] {
					out = append(out, fmt.Sprintf("label %s is on none of the metrics of %s", l, expr))
				}
			}
		}
	}
	return out
}

// TestGrafanaDashboard checks examples/grafana/mcpheal.json: that it is a
// dashboard Grafana loads (required fields, unique panel ids, real panel
// types, a 24-column grid without overlaps, every query on the datasource
// variable with its own refId and a non-empty expr), and that every metric
// its queries name exists, with the labels and label values they use, in
// the /metrics of a real mcpheal in front of a real MCP server, after an
// initialize, tool calls and a heal.
func TestGrafanaDashboard(t *testing.T) {
	t.Parallel()
	raw, err := os.ReadFile(dashboardFile)
	if err != nil {
		t.Fatal(err)
	}
	d, problems := loadDashboard(t, raw)
	problems = append(problems, dashStructureProblems(d)...)
	for _, p := range problems {
		t.Errorf("%s: %s", dashboardFile, p)
	}
	exprs := dashExprs(d)

	// The panels an operator needs are there.
	used := map[string]bool{}
	for _, e := range exprs {
		for _, n := range dashMetricName.FindAllString(e, -1) {
			used[n] = true
		}
	}
	for _, want := range []string{
		"mcpheal_requests_total", "mcpheal_classified_total", "mcpheal_heals_total", "mcpheal_replays_total",
		"mcpheal_heal_duration_seconds_bucket", "mcpheal_breaker_state", "mcpheal_sessions",
		"mcpheal_memory_budget_bytes", "mcpheal_store_errors_total",
	} {
		if !used[want] {
			t.Errorf("%s: no query uses %s", dashboardFile, want)
		}
	}
	if !strings.Contains(string(raw), `outcome=\"refused\"`) {
		t.Errorf("%s: no query counts the -32011 answers (mcpheal_replays_total{outcome=\"refused\"})", dashboardFile)
	}

	up := peers.StartGoSDK(t, peers.GoSDKOpts{})
	_, base, admin, _ := startRouterAdmin(t, []conf.Config{
		{Name: "gosdk", Upstream: up.URL(), Path: "/mcp", Shared: session.NewMemShared()},
	})
	scrape := func() map[string]scrapeFamily {
		code, text := get(t, admin+"/metrics")
		if code != 200 {
			t.Fatalf("/metrics: %d %q", code, text)
		}
		return scrapeFamilies(t, text)
	}

	// Before any agent came, the dashboard shows zeros rather than "No
	// data": every family it uses is there but these, which appear with
	// the first request and the first store call.
	idle := scrape()
	appearLater := map[string]bool{"mcpheal_requests_total": true, "mcpheal_store_seconds_bucket": true}
	for name := range used {
		if _, _, why := dashFamily(name, idle); why != "" && !appearLater[name] {
			t.Errorf("idle mcpheal: %s %s", name, why)
		}
	}

	sid := peers.RawInitialize(t, base+"/mcp")
	call := `{"jsonrpc":"2.0","id":5,"method":"tools/call","params":{"name":"echo","arguments":{"text":"dashboard"}}}`
	if resp, body := peers.RawPost(t, base+"/mcp", sid, call); resp.StatusCode != 200 {
		t.Fatalf("tools/call: %d %q", resp.StatusCode, body)
	}
	up.ExpireSessions()
	if resp, body := peers.RawPost(t, base+"/mcp", sid, call); resp.StatusCode != 200 {
		t.Fatalf("tools/call after the upstream expired its session: %d %q", resp.StatusCode, body)
	}
	if n := up.Inits(); n != 2 {
		t.Fatalf("the upstream saw %d initialize requests, want 2 (the agent's and the heal's)", n)
	}
	fams := scrape()
	for _, p := range dashMetricProblems(exprs, fams) {
		t.Errorf("%s: %s", dashboardFile, p)
	}

	t.Run("checks can fail", func(t *testing.T) {
		for _, c := range []struct{ expr, want string }{
			{`rate(mcpheal_made_up_total[5m])`, "mcpheal_made_up_total is not in mcpheal's /metrics"},
			{`mcpheal_heal_duration_seconds`, "is a histogram"},
			{`rate(mcpheal_sessions_bucket[5m])`, "has no _bucket series"},
			{`sum by (reason) (rate(mcpheal_replays_total[5m]))`, "label reason is on none"},
			{`mcpheal_replays_total{outcome="retried"}`, `no series with outcome="retried"`},
			{`mcpheal_memory_budget_bytes{kind="budget"}`, `no series with kind="budget"`},
			{`mcpheal_sessions{le="1"}`, "has no label le"},
		} {
			got := dashMetricProblems([]string{c.expr}, fams)
			if len(got) != 1 || !strings.Contains(got[0], c.want) {
				t.Errorf("%s: problems %q, want one saying %q", c.expr, got, c.want)
			}
		}
		ok := `histogram_quantile(0.99, sum by (upstream, le) (rate(mcpheal_heal_duration_seconds_bucket{upstream=~"$upstream"}[5m])))`
		if got := dashMetricProblems([]string{ok}, fams); len(got) > 0 {
			t.Errorf("%s: problems %q, want none", ok, got)
		}

		for _, c := range []struct {
			name, want string
			spoil      func(*dashboard)
		}{
			{"duplicate id", "already used", func(d *dashboard) { d.Panels[2].ID = d.Panels[1].ID }},
			{"overlap", "overlap", func(d *dashboard) { *d.Panels[2].GridPos = *d.Panels[1].GridPos }},
			{"too wide", "outside the 24-column grid", func(d *dashboard) { d.Panels[1].GridPos.W = 25 }},
			{"made-up type", "not a Grafana panel type", func(d *dashboard) { d.Panels[1].Type = "graphs" }},
			{"refId twice", "used twice", func(d *dashboard) {
				d.Panels[1].Targets = append(d.Panels[1].Targets, d.Panels[1].Targets[0])
			}},
			{"empty expr", "empty expr", func(d *dashboard) { d.Panels[1].Targets[0].Expr = " " }},
			{"fixed datasource", "want prometheus", func(d *dashboard) { d.Panels[1].Datasource = &dashRef{"prometheus", "P1809F7CD0C75ACF3"} }},
			{"undefined variable", "$cluster, which is not defined", func(d *dashboard) { d.Panels[1].Targets[0].Expr += ` + on() vector($cluster)` }},
			{"no datasource variable", "no Prometheus datasource variable", func(d *dashboard) {
				d.Templating.List = slices.DeleteFunc(d.Templating.List, func(v dashVariable) bool { return v.Type == "datasource" })
			}},
		} {
			var spoilt dashboard
			if err := json.Unmarshal(raw, &spoilt); err != nil {
				t.Fatal(err)
			}
			c.spoil(&spoilt)
			got := dashStructureProblems(spoilt)
			if !slices.ContainsFunc(got, func(p string) bool { return strings.Contains(p, c.want) }) {
				t.Errorf("%s: problems %q, want one saying %q", c.name, got, c.want)
			}
		}
		if _, got := loadDashboard(t, []byte(`{"title":"x","uid":"x","schemaVersion":39,"panels":[]}`)); !slices.Contains(got, "no top-level templating") {
			t.Errorf("dashboard without templating: problems %q", got)
		}
	})
}

// TestAnswersCountedOnEveryRoute: mcpheal_bytes_total{direction="out"} counts the
// answers agents get on every route (docs/observability.md), the ones a
// route writes itself included: the session pass-through's initialize and
// ping (the Go SDK server's), the bridge's initialize and ping (answered
// by mcpheal for the Go SDK server limited to 2026-07-28), the held
// route's server/discover (answered by mcpheal for the session-era Go SDK
// server). Each answer counts at least its body, and each request once in
// mcpheal_requests_total; the bridge's and the held route's own answers
// counted no bytes before exchange.Writer.
func TestAnswersCountedOnEveryRoute(t *testing.T) {
	t.Parallel()
	const ping = `{"jsonrpc":"2.0","id":2,"method":"ping"}`
	legacy := func(t *testing.T, url string) []int {
		resp, body := peers.RawPost(t, url, "", `{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-11-25","capabilities":{},"clientInfo":{"name":"bytes","version":"1"}}}`)
		sid := resp.Header.Get("Mcp-Session-Id")
		if resp.StatusCode != http.StatusOK || sid == "" {
			t.Fatalf("initialize: %d %s", resp.StatusCode, body)
		}
		return []int{len(body), len(postBody(t, url, sid, ping))}
	}
	for _, tc := range []struct {
		name    string
		up      func(t *testing.T) string
		answers func(t *testing.T, url string) []int // the bodies' lengths, one per request
	}{
		{"pass-through", func(t *testing.T) string { return peers.StartGoSDK(t, peers.GoSDKOpts{}).URL() }, legacy},
		{"bridge", func(t *testing.T) string { return startModern(t).url }, legacy},
		{"held", func(t *testing.T) string { return peers.StartGoSDK(t, peers.GoSDKOpts{}).URL() }, func(t *testing.T, url string) []int {
			status, msg := heldPost(t, url, "bytes-token", "server/discover", "", 1)
			if status != http.StatusOK || !msg.Get("result.supportedVersions").Exists() {
				t.Fatalf("server/discover: %d %s", status, msg.Raw)
			}
			return []int{len(msg.Raw)}
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			s, url := startProxy(t, tc.up(t), nil)
			before, requests := s.count.BytesOut.Load(), s.Stats().Requests
			answers := tc.answers(t, url)
			sum := 0
			for _, n := range answers {
				sum += n
			}
			if got := s.count.BytesOut.Load() - before; got < uint64(sum) {
				t.Errorf("%d bytes out counted for answers of %d bytes", got, sum)
			}
			if got := s.Stats().Requests - requests; got != uint64(len(answers)) {
				t.Errorf("%d requests counted for %d", got, len(answers))
			}
		})
	}
}

// postBody POSTs body on session sid and returns the answer's body.
func postBody(t *testing.T, url, sid, body string) []byte {
	t.Helper()
	resp, b := peers.RawPost(t, url, sid, body)
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("%s: %d %s", body, resp.StatusCode, b)
	}
	return b
}

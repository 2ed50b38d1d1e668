package proxy

import (
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"regexp"
	"runtime"
	"strings"
	"testing"

	"github.com/mcpheal/mcpheal/proxy/internal/exchange"
)

// stages is the order of proxy's packages, from the front door down
// (doc.go "The house"): a package may import only packages of a later
// stage, never one of its own stage or an earlier one. Nothing below calls
// back up; an outcome travels up as a value.
var stages = [][]string{
	{"proxy"},                      // the front door: Server, Router, guard, route selection
	{"route/held", "route/bridge"}, // the routes that translate between eras
	{"route/stream"},               // agents' GET streams (the held route's too)
	{"exchange"},                   // the one loop: send, judge, decide, act; the answer writer
	{"heal"},                       // sessions, their heals, keepalive, the fleet
	{"era"},                        // the upstream's protocol era
	{"link"},                       // mcpheal's side of the upstream: requests, breaker, outages
	{"obs"},                        // counters and traces
	{"wire"},                       // bytes: JSON-RPC, headers, SSE events, the memory budget
	{"conf"},                       // the configuration
}

// testOnly are the packages of proxy/internal that tests import and no
// product package may: the real peers and the keyed scripted fake.
var testOnly = map[string]bool{"peers": true}

// TestStageDirection: every import between proxy's packages runs down the
// stages, and every package of proxy/ has its stage. A new upward import (a
// stage reaching back to one that calls it) fails here, as does a product
// package importing a test-only one.
func TestStageDirection(t *testing.T) {
	t.Parallel()
	goTool, err := exec.LookPath("go")
	if err != nil {
		goTool = filepath.Join(runtime.GOROOT(), "bin", "go")
	}
	out, err := exec.Command(goTool, "list", "-f", "{{.ImportPath}} {{join .Imports \" \"}}", "./...").CombinedOutput()
	if err != nil {
		t.Fatalf("go list: %v\n%s", err, out)
	}
	const module = "github.com/mcpheal/mcpheal/proxy"
	rank := map[string]int{}
	for i, st := range stages {
		for _, p := range st {
			rank[p] = i
		}
	}
	stageOf := func(path string) (string, bool) {
		switch {
		case path == module:
			return "proxy", true
		case strings.HasPrefix(path, module+"/internal/"):
			return strings.TrimPrefix(path, module+"/internal/"), true
		}
		return "", false // doctor, telemetry, interop: apart from the stages
	}
	seen := 0
	for _, line := range strings.Split(strings.TrimSpace(string(out)), "\n") {
		fs := strings.Fields(line)
		from, ok := stageOf(fs[0])
		for _, imp := range fs[1:] {
			if to, _ := stageOf(imp); testOnly[to] {
				t.Errorf("%s imports %s: a package for tests only", fs[0], imp)
			}
		}
		if !ok || testOnly[from] {
			continue
		}
		rf, known := rank[from]
		if !known {
			t.Errorf("package %s has no stage in stages", fs[0])
			continue
		}
		seen++
		for _, imp := range fs[1:] {
			to, ok := stageOf(imp)
			if !ok {
				continue
			}
			if rt, known := rank[to]; !known || rt <= rf {
				t.Errorf("%s imports %s: against the stages (a package imports only later stages)", from, to)
			}
		}
	}
	if seen < len(rank) {
		t.Errorf("go list saw %d of proxy's %d staged packages", seen, len(rank))
	}
}

// writesAnswer matches what writes or counts an agent's answer other than
// through exchange.Writer: the answer's head or body set on the request's
// context, the exchange's and wire's own writers, the request counters.
var writesAnswer = regexp.MustCompile(`(?i)\bctx\.(Set(StatusCode|Body\w*|ContentType\w*)|Response\.(Header\.Set\w*|SetBody\w*))\(|` +
	`exchange\.WriteFailure\(|wire\.(WriteError|AppendError)\(ctx|Count\.(Request\(|BytesOut)`)

// TestRoutesAnswerThroughWriter: the routes (held, bridge, the streams)
// hand every answer to exchange.Writer, which writes it and counts its
// request once; none writes or counts one itself.
func TestRoutesAnswerThroughWriter(t *testing.T) {
	t.Parallel()
	routeLinesMatching(t, writesAnswer, "writes or counts an answer itself")
}

// reachesLink matches a route reaching the upstream link through a
// stage it was given (a heal.Sessions, a heal.Healer, an era.State hold
// it) rather than through its own narrow sender.
var reachesLink = regexp.MustCompile(`\.Link\b`)

// TestRoutesSendThroughTheirUpstream: a route sends upstream only through
// the attempts of the exchange and its own Upstream (the few link methods
// it names); none reaches the link itself through a stage.
func TestRoutesSendThroughTheirUpstream(t *testing.T) {
	t.Parallel()
	routeLinesMatching(t, reachesLink, "reaches the link past its Upstream")
}

// ground is what an exchange.Env gives whoever holds it: the ground every
// stage stands on, no stage.
var ground = map[string]string{"Cfg": "*conf.Config", "Log": "*zerolog.Logger", "Count": "*obs.Counters",
	"Mem": "*wire.Budget", "Bg": "*wire.BgGroup", "Done": "<-chan struct {}"}

// TestEnvGivesOnlyTheGround: the routes start their attempts with an
// exchange.Env, and reach through its fields and methods the ground and no
// stage (the link, the sessions, the healer, the era, the answer logs:
// exchange.Stages are the exchange's own); a route is given the stages it
// uses as its own fields, so the compiler keeps it from the others.
func TestEnvGivesOnlyTheGround(t *testing.T) {
	t.Parallel()
	env := reflect.TypeFor[exchange.Env]()
	seen := 0
	for f := range env.Fields() {
		if !f.IsExported() {
			continue
		}
		seen++
		if want, ok := ground[f.Name]; !ok || f.Type.String() != want {
			t.Errorf("exchange.Env.%s (%s) is not the ground %v: a route holding an Env reaches it", f.Name, f.Type, ground)
		}
	}
	if seen != len(ground) {
		t.Errorf("exchange.Env exports %d fields, want the %d of the ground", seen, len(ground))
	}
	// Its methods: the answer writer, which stands on the ground alone.
	for m := range reflect.TypeFor[*exchange.Env]().Methods() {
		if m.Name != "Writer" {
			t.Errorf("exchange.Env.%s: a method of the Env a route may call, beside Writer", m.Name)
		}
	}
}

// routeLinesMatching fails the test for each line of code (comments
// aside) of a route's non-test files that re matches.
func routeLinesMatching(t *testing.T, re *regexp.Regexp, what string) {
	t.Helper()
	files, err := filepath.Glob("internal/route/*/*.go")
	if err != nil || len(files) == 0 {
		t.Fatalf("no route files (%v)", err)
	}
	for _, f := range files {
		if strings.HasSuffix(f, "_test.go") {
			continue
		}
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		for i, line := range strings.Split(string(b), "\n") {
			if code, _, _ := strings.Cut(line, "//"); re.MatchString(code) {
				t.Errorf("%s:%d %s: %s", f, i+1, what, strings.TrimSpace(line))
			}
		}
	}
}

package main

import (
	"bufio"
	"context"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"time"

	"github.com/mcpheal/mcpheal/bench"
)

// attackSpec is one vegeta run against one session.
type attackSpec struct {
	label    string // file name stem
	sess     bench.Session
	rate     int // requests per second; 0 is the closed model
	workers  int // closed model: concurrent workers
	duration time.Duration
	timeout  time.Duration // of one request; 0: 30 s
}

// hit is one vegeta result, as `vegeta encode -to json` writes it.
type hit struct {
	Code      int           `json:"code"`
	Timestamp time.Time     `json:"timestamp"`
	Latency   time.Duration `json:"latency"`
	Error     string        `json:"error"`
	Body      []byte        `json:"body"`
}

// writeTargets writes n JSON targets with ids first, first+1, … on one
// session, so that every request of the run carries a unique id.
func writeTargets(path string, s bench.Session, first uint64, n int) error {
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	w := bufio.NewWriterSize(f, 1<<20)
	hdr, err := json.Marshal(s.Header())
	if err != nil {
		return err
	}
	prefix := `{"method":"POST","url":` + strconv.Quote(s.URL) + `,"header":` + string(hdr) + `,"body":"`
	var body, enc []byte
	for i := range n {
		body = bench.AppendToolCallBody(body[:0], first+uint64(i), s.ToolName())
		enc = base64.StdEncoding.AppendEncode(enc[:0], body)
		_, _ = w.WriteString(prefix)
		_, _ = w.Write(enc)
		_, _ = w.WriteString("\"}\n")
	}
	if err := w.Flush(); err != nil {
		return err
	}
	return f.Close()
}

// runVegeta attacks with spec's targets file and returns the path of the
// JSON-encoded results and the CPU time vegeta used. ctx bounds it
// (duration plus a minute). Open-model runs cap vegeta at maxWorkers
// workers, so that a target that falls behind cannot make it open
// connections without bound; the achieved-rate check then flags the run.
func (h *harness) runVegeta(ctx context.Context, spec attackSpec, targets string, lazy bool) (string, time.Duration, error) {
	bin := filepath.Join(h.dir, spec.label+".bin")
	timeout := spec.timeout
	if timeout <= 0 {
		timeout = 30 * time.Second
	}
	args := []string{h.vegeta, "attack", "-format=json", "-targets=" + targets, "-output=" + bin,
		"-duration=" + spec.duration.String(), "-timeout=" + timeout.String(), "-http2=false", "-name=" + spec.label}
	if spec.rate > 0 {
		args = append(args, "-rate="+strconv.Itoa(spec.rate)+"/1s", "-max-workers="+strconv.Itoa(maxWorkers))
	} else {
		w := strconv.Itoa(spec.workers)
		args = append(args, "-rate=0", "-workers="+w, "-max-workers="+w)
	}
	if lazy {
		args = append(args, "-lazy")
	}
	ctx, cancel := context.WithTimeout(ctx, spec.duration+time.Minute)
	defer cancel()
	cpu, err := h.runTool(ctx, "vegeta-attack", args...)
	if err != nil {
		return "", 0, err
	}
	out := filepath.Join(h.dir, spec.label+".json")
	if _, err := h.runTool(ctx, "vegeta-encode", h.vegeta, "encode", "-to=json", "-output="+out, bin); err != nil {
		return "", 0, err
	}
	_ = os.Remove(bin)
	return out, cpu, nil
}

// helperEnv is the environment of the processes that are not measured
// (vegeta, the upstream): a less eager GC leaves more of the two cores to
// the proxies. The Go SDK server spends about a third of its CPU in GC at
// the default GOGC=100, and 25 % less CPU per request at 400.
var helperEnv = []string{"GOGC=400"}

// maxWorkers bounds vegeta's workers (and so its connections) in the open
// model; at the rates measured, a keeping-up target needs a few dozen.
const maxWorkers = 512

// runTool runs a short-lived tool to its end, its stderr in the harness
// log, and returns the CPU time (user+system) it used.
func (h *harness) runTool(ctx context.Context, name string, argv ...string) (time.Duration, error) {
	c, err := startChild(ctx, name, filepath.Join(h.dir, "tools.log"), false, helperEnv, argv...)
	if err != nil {
		return 0, err
	}
	select {
	case <-c.done:
	case <-ctx.Done():
		c.kill()
		return 0, fmt.Errorf("%s: %w", name, ctx.Err())
	}
	if c.err != nil {
		return 0, fmt.Errorf("%s: %w (see %s)", name, c.err, filepath.Join(h.dir, "tools.log"))
	}
	st := c.cmd.ProcessState
	return st.UserTime() + st.SystemTime(), nil
}

// readHits decodes a results file and checks every answer: HTTP 200, no
// transport error, and the echo of a request of this run whose id was not
// answered before. fn sees each hit and whether it passed.
func readHits(path string, first, last uint64, fn func(h *hit, err error)) error {
	f, err := os.Open(path)
	if err != nil {
		return err
	}
	defer f.Close()
	seen := make(map[uint64]bool, last-first+1)
	dec := json.NewDecoder(bufio.NewReaderSize(f, 1<<20))
	for dec.More() {
		var h hit
		if err := dec.Decode(&h); err != nil {
			return fmt.Errorf("%s: %w", path, err)
		}
		fn(&h, checkHit(&h, first, last, seen))
	}
	return nil
}

func checkHit(h *hit, first, last uint64, seen map[uint64]bool) error {
	if h.Error != "" {
		return fmt.Errorf("transport: %s", h.Error)
	}
	if h.Code != 200 {
		return fmt.Errorf("status %d: %.120s", h.Code, h.Body)
	}
	id, err := bench.CheckEcho(h.Body)
	switch {
	case err != nil:
		return err
	case id < first || id > last:
		return fmt.Errorf("id %d is not of this run", id)
	case seen[id]:
		return fmt.Errorf("id %d answered twice", id)
	}
	seen[id] = true
	return nil
}

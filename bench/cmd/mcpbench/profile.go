package main

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"time"

	"github.com/mcpheal/mcpheal/bench"
)

// profileResult holds the pprof captures of mcpheal under load.
type profileResult struct {
	Rate       int
	Seconds    int
	MemRate    int
	CPUFile    string
	AllocsFile string // allocations during the capture (allocs1 minus allocs0)
	CPUTop     string // go tool pprof -top
	AllocsTop  string // by allocated objects
	Run        *runResult
}

// Profile run shape: the captures start after profileDelay and last
// profileSeconds, inside one run at profileRate. The proxy samples one
// allocation per profileMemRate bytes (the default 512 KiB would catch only
// a few dozen in 10 s of a nearly allocation-free proxy).
const (
	profileRate    = 2000
	profileSeconds = 10
	profileDelay   = 3 * time.Second
	profileMemRate = 4096
)

// profileRun starts a dedicated mcpheal (so the matrix's figures are not
// touched by the finer allocation sampling), loads it at 2000 req/s, and
// captures a CPU profile and the allocations of the same 10 s.
func (h *harness) profileRun(ctx context.Context, e *env) (*profileResult, error) {
	url, stats, p, err := h.startProxy(ctx, e.dir, "http://"+e.upAddr+"/mcp", "-memprofilerate", fmt.Sprint(profileMemRate))
	if err != nil {
		return nil, err
	}
	defer p.stop(5 * time.Second)
	t := &target{name: mcpheal, pids: func() []int { return []int{p.pid()} }, stats: stats}
	if t.sess, err = bench.Initialize(ctx, e.hc, url, true); err != nil {
		return nil, err
	}
	res := &profileResult{Rate: profileRate, Seconds: profileSeconds, MemRate: profileMemRate,
		CPUFile: filepath.Join(h.dir, "mcpheal-cpu.pprof"), AllocsFile: filepath.Join(h.dir, "mcpheal-allocs.pprof")}
	base := filepath.Join(h.dir, "mcpheal-allocs-base.pprof")
	errc := make(chan error, 1)
	go func() {
		tm := time.NewTimer(profileDelay) // into the steady part of the run
		defer tm.Stop()
		select {
		case <-tm.C:
		case <-ctx.Done():
			errc <- ctx.Err()
			return
		}
		err := fetch(ctx, stats+"/debug/allocs-now", base)
		if err == nil {
			err = fetch(ctx, fmt.Sprintf("%s/debug/pprof/profile?seconds=%d", stats, profileSeconds), res.CPUFile)
		}
		if err == nil {
			err = fetch(ctx, stats+"/debug/allocs-now", res.AllocsFile)
		}
		errc <- err
	}()
	r, err := h.measure(ctx, e, t, profileRate, profileDelay+profileSeconds*time.Second+3*time.Second, -3)
	if perr := <-errc; err == nil {
		err = perr
	}
	if err != nil {
		return nil, err
	}
	res.Run = r
	h.logRun(r)
	if res.CPUTop, err = h.pprofTop(ctx, res.CPUFile); err != nil {
		return nil, err
	}
	if res.AllocsTop, err = h.pprofTop(ctx, res.AllocsFile, "-sample_index=alloc_objects", "-diff_base="+base); err != nil {
		return nil, err
	}
	h.logf("profiles: %s, %s (base %s)", res.CPUFile, res.AllocsFile, base)
	return res, nil
}

// fetch saves url's body to path.
func fetch(ctx context.Context, url, path string) error {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("%s: status %d", url, resp.StatusCode)
	}
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	if _, err := io.Copy(f, resp.Body); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}

// pprofTop returns `go tool pprof -top` of a profile.
func (h *harness) pprofTop(ctx context.Context, file string, extra ...string) (string, error) {
	args := append([]string{"tool", "pprof", "-top", "-nodecount=25"}, extra...)
	cmd := exec.CommandContext(ctx, "go", append(args, file)...)
	cmd.Dir = h.root
	out, err := cmd.Output()
	if err != nil {
		return "", fmt.Errorf("go tool pprof %s: %w", file, err)
	}
	return string(out), nil
}

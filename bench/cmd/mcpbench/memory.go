package main

import (
	"context"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"time"
)

// memStep is the proxy's memory after some sessions were opened.
type memStep struct {
	Sessions  int
	RSSKB     uint64
	HeapInuse uint64
}

// memResult is the memory-per-session run.
type memResult struct {
	Steps   []memStep
	PeakKB  uint64
	Elapsed time.Duration
}

// memStepSize is the reporting unit of the memory run.
const memStepSize = 10_000

// memoryRun opens cfg.memSessions idle sessions on a fresh mcpheal in front
// of the stub upstream (the Go SDK server would itself need gigabytes for
// them) and records the proxy's RSS every 10 000 sessions.
func (h *harness) memoryRun(ctx context.Context) (*memResult, error) {
	e := &env{variant: "stub", dir: filepath.Join(h.dir, "memory"), hc: &http.Client{Timeout: 30 * time.Second}}
	if err := os.MkdirAll(e.dir, 0o755); err != nil {
		return nil, err
	}
	defer e.stop()
	var err error
	if e.upAddr, err = freeAddr(); err != nil {
		return nil, err
	}
	if err := h.startUpstream(ctx, e); err != nil {
		return nil, err
	}
	url, stats, p, err := h.startProxy(ctx, e.dir, "http://"+e.upAddr+"/mcp")
	if err != nil {
		return nil, err
	}
	e.proxy = p
	hc := &http.Client{Timeout: 30 * time.Second, Transport: &http.Transport{MaxIdleConnsPerHost: 64}}
	defer hc.CloseIdleConnections()
	res := &memResult{}
	start := time.Now()
	for n := 0; ; n += memStepSize {
		step, err := h.memSample(ctx, e, stats, n)
		if err != nil {
			return nil, err
		}
		res.Steps = append(res.Steps, step)
		if n >= h.cfg.memSessions {
			break
		}
		if _, err := openSessions(ctx, hc, url, min(memStepSize, h.cfg.memSessions-n), 64, false); err != nil {
			return nil, err
		}
	}
	res.Elapsed = time.Since(start)
	ps, err := sampleProcs([]int{p.pid()})
	if err != nil {
		return nil, err
	}
	res.PeakKB = ps.hwmKB
	last := res.Steps[len(res.Steps)-1]
	h.logf("memory: %d idle sessions: RSS %.1f MB (from %.1f MB), peak %.1f MB, in %s",
		last.Sessions, mb(last.RSSKB), mb(res.Steps[0].RSSKB), mb(res.PeakKB), res.Elapsed.Round(time.Millisecond))
	return res, nil
}

// memSample reads the proxy's RSS and heap and checks that it holds want
// sessions.
func (h *harness) memSample(ctx context.Context, e *env, statsURL string, want int) (memStep, error) {
	st, err := e.proxyStatsOf(ctx, statsURL)
	if err != nil {
		return memStep{}, err
	}
	_, rss, err := memKB(e.proxy.pid())
	if err != nil {
		return memStep{}, err
	}
	if st.Sessions != want {
		h.fail("memory run: proxy holds %d sessions, want %d", st.Sessions, want)
	}
	return memStep{Sessions: st.Sessions, RSSKB: rss, HeapInuse: st.HeapInuse}, nil
}

// perTenK returns the RSS growth per 10 000 sessions, in MB, over the run.
func (m *memResult) perTenK() float64 {
	first, last := m.Steps[0], m.Steps[len(m.Steps)-1]
	if last.Sessions == 0 {
		return 0
	}
	return (mb(last.RSSKB) - mb(first.RSSKB)) / float64(last.Sessions) * memStepSize
}

// mb converts KiB to MB (10^6 bytes), the unit of the target.
func mb(kb uint64) float64 { return float64(kb) * 1024 / 1e6 }

// String summarises the run.
func (m *memResult) String() string {
	last := m.Steps[len(m.Steps)-1]
	return fmt.Sprintf("%d sessions in %.1f MB RSS", last.Sessions, mb(last.RSSKB))
}

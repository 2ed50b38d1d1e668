package main

import (
	"context"
	"fmt"
	"net/http"
	"sync"
	"time"

	"github.com/mcpheal/mcpheal/bench"
)

// stormResult is the expiry storm of one variant.
type stormResult struct {
	Variant      string
	Sessions     int
	CallsPerSess int
	Expired      int
	Failed       int
	Sample       string
	Healed       time.Duration // from the first call until every call was answered
	UpInits      int64         // initialize requests during the storm
	Heals        uint64
}

// stormCalls is how many calls each session sends at once into its expired
// upstream session: all but one must wait for the single re-init.
const stormCalls = 3

// stormRun opens many sessions through mcpheal, expires every upstream
// session at once, then calls on all of them together: each must heal with
// exactly one initialize however many of its calls failed.
func (h *harness) stormRun(ctx context.Context, e *env) (*stormResult, error) {
	t := e.target(mcpheal)
	hc := &http.Client{Timeout: 60 * time.Second, Transport: &http.Transport{
		MaxIdleConns: 512, MaxIdleConnsPerHost: 512, IdleConnTimeout: 30 * time.Second,
	}}
	defer hc.CloseIdleConnections()
	sess, err := openSessions(ctx, hc, t.sess.URL, h.cfg.storm, 32, true)
	if err != nil {
		return nil, err
	}
	up0, err := e.upstreamStatsOf(ctx)
	if err != nil {
		return nil, err
	}
	st0, err := e.proxyStatsOf(ctx, t.stats)
	if err != nil {
		return nil, err
	}
	var exp struct {
		Expired int `json:"expired"`
	}
	if err := getJSON(ctx, e.hc, http.MethodPost, "http://"+e.upAddr+"/admin/expire", &exp); err != nil {
		return nil, err
	}
	res := &stormResult{Variant: e.variant, Sessions: len(sess), CallsPerSess: stormCalls, Expired: exp.Expired}
	start := time.Now()
	res.Failed, res.Sample = h.callAll(ctx, hc, sess, stormCalls)
	res.Healed = time.Since(start)
	up1, err := e.upstreamStatsOf(ctx)
	if err != nil {
		return nil, err
	}
	st1, err := e.proxyStatsOf(ctx, t.stats)
	if err != nil {
		return nil, err
	}
	res.UpInits, res.Heals = up1.Initializes-up0.Initializes, st1.Heals-st0.Heals
	h.checkStorm(res)
	for _, s := range sess {
		s.Delete(ctx, hc)
	}
	return res, nil
}

// callAll sends calls echo calls on every session at once and returns how
// many failed and one failure.
func (h *harness) callAll(ctx context.Context, hc *http.Client, sess []bench.Session, calls int) (int, string) {
	var (
		mu     sync.Mutex // protects failed, sample
		failed int
		sample string
		wg     sync.WaitGroup
	)
	for _, s := range sess {
		for range calls {
			id := h.ids.Add(1)
			wg.Go(func() {
				if err := s.Call(ctx, hc, id); err != nil {
					mu.Lock()
					failed++
					sample = err.Error()
					mu.Unlock()
				}
			})
		}
	}
	wg.Wait()
	return failed, sample
}

// checkStorm logs a storm and records its correctness failures.
func (h *harness) checkStorm(res *stormResult) {
	h.logf("%s storm: %d sessions (%d expired) × %d calls healed in %s, %d failed, upstream inits %d, heals %d",
		res.Variant, res.Sessions, res.Expired, stormCalls, ms(res.Healed), res.Failed, res.UpInits, res.Heals)
	if res.Failed > 0 {
		h.fail("%s storm: %d calls failed, e.g. %s", res.Variant, res.Failed, res.Sample)
	}
	if res.UpInits != int64(res.Sessions) || res.Heals != uint64(res.Sessions) {
		h.fail("%s storm: %d upstream initializes and %d heals for %d sessions, want one each",
			res.Variant, res.UpInits, res.Heals, res.Sessions)
	}
}

// openSessions opens n sessions on url with conc at a time.
func openSessions(ctx context.Context, hc *http.Client, url string, n, conc int, full bool) ([]bench.Session, error) {
	out := make([]bench.Session, n)
	errs := make(chan error, conc)
	next := make(chan int)
	var wg sync.WaitGroup
	for range conc {
		wg.Go(func() {
			for i := range next {
				s, err := bench.Initialize(ctx, hc, url, full)
				if err != nil {
					select {
					case errs <- fmt.Errorf("session %d: %w", i, err):
					default:
					}
					continue
				}
				out[i] = s
			}
		})
	}
	for i := range n {
		next <- i
	}
	close(next)
	wg.Wait()
	select {
	case err := <-errs:
		return nil, err
	default:
		return out, nil
	}
}

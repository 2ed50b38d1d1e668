package main

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"
)

// healResult is the heal-under-load run of one variant.
type healResult struct {
	Target, Variant    string
	Rate               int
	Requests, OK       int
	Sample             string
	Down               time.Duration // from SIGTERM to the new upstream listening
	Caught             int           // requests in flight or sent during the outage (+1 s)
	BaseP50            time.Duration // latency before the restart
	ExtraP99, ExtraMax time.Duration // latency beyond the unavoidable wait, of the caught requests
	UpInits            int64         // initialize requests the restarted upstream received
	Heals              uint64        // mcpheal's successful re-inits
	Replays            uint64
}

// healRun sends a steady load through mcpheal and restarts the upstream in
// the middle of it. Every answer must still be the right echo. A request's
// extra latency is what it took beyond waiting for the upstream to listen
// again and beyond the pre-restart median.
func (h *harness) healRun(ctx context.Context, e *env, name string) (*healResult, error) {
	t := e.target(name)
	// Start from a live session: an earlier restart may have ended it.
	if err := t.sess.Call(ctx, e.hc, h.ids.Add(1)); err != nil {
		return nil, fmt.Errorf("call before the restart: %w", err)
	}
	n := int(float64(h.cfg.healRate)*h.cfg.healFor.Seconds()*1.05) + 100
	first := h.ids.Add(uint64(n)) - uint64(n) + 1
	spec := attackSpec{label: e.variant + "-heal-" + name, sess: t.sess, rate: h.cfg.healRate, duration: h.cfg.healFor}
	targets := filepath.Join(h.dir, spec.label+".targets")
	if err := writeTargets(targets, t.sess, first, n); err != nil {
		return nil, err
	}
	defer os.Remove(targets)
	st0, err := e.proxyStatsOf(ctx, t.stats)
	if err != nil {
		return nil, err
	}
	begin := time.Now()
	restarted := h.restartAfter(ctx, e, h.cfg.healAt)
	out, _, err := h.runVegeta(ctx, spec, targets, false)
	rs := <-restarted
	if err != nil {
		return nil, err
	}
	if rs.err != nil {
		return nil, fmt.Errorf("restart upstream: %w", rs.err)
	}
	defer os.Remove(out)
	res := &healResult{Target: name, Variant: e.variant, Rate: h.cfg.healRate, Down: rs.ready.Sub(rs.stopped)}
	tsv := filepath.Join(h.dir, spec.label+".tsv")
	if err := res.analyse(out, tsv, first, first+uint64(n)-1, rs.stopped, rs.ready); err != nil {
		return nil, err
	}
	st1, err := e.proxyStatsOf(ctx, t.stats)
	if err != nil {
		return nil, err
	}
	up, err := e.upstreamStatsOf(ctx)
	if err != nil {
		return nil, err
	}
	res.UpInits, res.Heals, res.Replays = up.Initializes, st1.Heals-st0.Heals, st1.Replays-st0.Replays
	h.checkHeal(res, begin)
	return res, nil
}

// restart is when the upstream was stopped and when its successor listened.
type restart struct {
	stopped, ready time.Time
	err            error
}

// restartAfter restarts the upstream after d, in the background.
func (h *harness) restartAfter(ctx context.Context, e *env, d time.Duration) <-chan restart {
	done := make(chan restart, 1)
	go func() {
		tm := time.NewTimer(d) // into the steady part of the run
		defer tm.Stop()
		select {
		case <-tm.C:
		case <-ctx.Done():
			done <- restart{err: ctx.Err()}
			return
		}
		s, r, err := h.restartUpstream(ctx, e, h.cfg.healDown)
		done <- restart{s, r, err}
	}()
	return done
}

// checkHeal logs a heal run and records its correctness failures.
func (h *harness) checkHeal(res *healResult, begin time.Time) {
	v, name := res.Variant, res.Target
	h.logf("%s %s heal: %d/%d ok, down %s, caught %d, extra p99 %s max %s, upstream inits %d, heals %d (began %s)",
		v, name, res.OK, res.Requests, ms(res.Down), res.Caught, ms(res.ExtraP99), ms(res.ExtraMax),
		res.UpInits, res.Heals, begin.Format(time.TimeOnly))
	if res.OK != res.Requests {
		h.fail("%s %s heal under load: %d of %d requests failed, e.g. %s", v, name, res.Requests-res.OK, res.Requests, res.Sample)
	}
	if res.UpInits != 1 || res.Heals != 1 {
		h.fail("%s %s heal under load: %d upstream initializes and %d heals, want 1 each", v, name, res.UpInits, res.Heals)
	}
}

// analyse checks every answer and computes the extra latency of the
// requests caught by the outage. It writes every request's start (relative
// to the stop), latency and extra latency to tsv for inspection.
func (res *healResult) analyse(path, tsv string, first, last uint64, stopped, ready time.Time) error {
	type req struct {
		start time.Time
		lat   time.Duration
	}
	var all []req
	err := readHits(path, first, last, func(hh *hit, err error) {
		res.Requests++
		all = append(all, req{hh.Timestamp, hh.Latency})
		if err == nil {
			res.OK++
		} else if res.Sample == "" {
			res.Sample = err.Error()
		}
	})
	if err != nil {
		return err
	}
	var base []time.Duration
	for _, r := range all {
		if r.start.Add(r.lat).Before(stopped) {
			base = append(base, r.lat)
		}
	}
	slices.Sort(base)
	res.BaseP50 = pct(base, 50)
	var extra []time.Duration
	var b strings.Builder
	b.WriteString("start_ms\tlatency_ms\textra_ms\n")
	for _, r := range all {
		if r.start.Add(r.lat).Before(stopped) || !r.start.Before(ready.Add(time.Second)) {
			continue
		}
		wait := max(0, ready.Sub(r.start)) // no request can be answered before the upstream is back
		x := max(0, r.lat-wait-res.BaseP50)
		extra = append(extra, x)
		fmt.Fprintf(&b, "%.3f\t%.3f\t%.3f\n", msOf(r.start.Sub(stopped)), msOf(r.lat), msOf(x))
	}
	if err := os.WriteFile(tsv, []byte(b.String()), 0o644); err != nil {
		return err
	}
	slices.Sort(extra)
	res.Caught = len(extra)
	res.ExtraP99 = pct(extra, 99)
	if len(extra) > 0 {
		res.ExtraMax = extra[len(extra)-1]
	}
	return nil
}

package main

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/tidwall/gjson"

	"github.com/mcpheal/mcpheal/bench"
)

// The attacks on the state mcpheal keeps per session and per upstream:
// a session's journal (what it restores after a heal), and a bridged
// upstream's discover answer, which every bridged initialize carries.

// Defaults these attacks rely on (proxy.Config's, docs/configuration.md "Flags").
const (
	defMaxJournal = 64 << 10
	defMaxBody    = 4 << 20
)

// goLimitHeadroom is what mcpheal adds to its memory budgets for Go's soft
// memory limit (main.go's memoryHeadroom).
const goLimitHeadroom = 256 << 20

// peakWithin checks, once the peak is known (after), that mcpheal's peak
// RSS stayed within its RSS before the attack, plus the pass's
// memory_budget, plus a headroom: the uncounted bytes the attack makes
// mcpheal hold beyond the budget (why says which), and Go's garbage. Go
// collects when its heap has doubled since the last collection, or at its
// soft memory limit (the budget + 256 MiB), so freed memory as large as
// what was live then (the budget and the uncounted bytes, at most) may wait
// uncollected, up to 256 MiB.
func (a *attackRun) peakWithin(uncounted int, why string) {
	garbage := min(a.pass.Budget+uncounted, goLimitHeadroom)
	limitKB := a.res.BeforeKB + uint64(a.pass.Budget+uncounted+garbage)>>10
	a.check(a.res.PeakKB <= limitKB, "peak RSS %.1f MB ≤ RSS before %.1f MB + memory_budget %s + headroom %s (%s: %s, and Go's uncollected garbage, min(budget + that, 256 MiB): %s) = %.1f MB",
		mb(a.res.PeakKB), mb(a.res.BeforeKB), mib(a.pass.Budget), mib(uncounted+garbage), why, mib(uncounted), mib(garbage), mb(limitKB))
}

// newcomer checks that a new agent can still initialize and make a call.
func (a *attackRun) newcomer(ctx context.Context, when string) {
	s, err := bench.Initialize(ctx, a.hc, a.url, true)
	if err == nil {
		err = s.Call(ctx, a.hc, 77)
	}
	a.check(err == nil, "a new agent %s initializes and its call is answered%s", when, errSuffix(err))
}

// subscribeBody is a resources/subscribe of a URI of size bytes, distinct
// per i.
func subscribeBody(i, size int) []byte {
	uri := hostileFloodURI + strconv.Itoa(i) + "/"
	b := make([]byte, 0, size+128)
	b = append(b, `{"jsonrpc":"2.0","id":`...)
	b = strconv.AppendInt(b, int64(1000+i), 10)
	b = append(b, `,"method":"resources/subscribe","params":{"uri":"`...)
	b = append(b, uri...)
	b = append(b, bytes.Repeat([]byte("x"), size-len(uri))...)
	return append(b, `"}}`...)
}

// floodRSSGuard stops a journal flood early when mcpheal holds this much:
// the checks have failed by then, and the machine is spared (an old build
// kept every URI).
const floodRSSGuard = 2 << 30

// 7. Journal flood: one session subscribes to 1000 distinct 1 MiB
// URIs, 4 at a time, on a session-era upstream (mcpheal journals each
// subscribe and forwards it), or bridged to a 2026-07-28 upstream (mcpheal
// journals it and answers it itself; the agent holds its GET stream open,
// so that every subscription mcpheal keeps reaches the upstream in a
// subscriptions/listen).
func (h *harness) attackJournal(bridged bool) hostileAttack {
	const n, workers, size, limit = 1000, 4, 1 << 20, 30 * time.Second
	// At most this many subscribes of size fit in max_journal: 0, and one
	// more for a journal that admits the subscribe that passes it.
	allowed := defMaxJournal/size + 1
	// What mcpheal holds beyond its budget: each subscribe in flight is
	// read whole into its own buffer, up to max_body.
	uncounted := workers * defMaxBody
	why := fmt.Sprintf("%d subscribes in flight × max_body %s", workers, mib(defMaxBody))
	name, path, where := "journal flood", hostilePath, "the upstream (session era) gets every subscribe mcpheal keeps"
	if bridged {
		name, path, where = "journal flood, bridged", hostileModernPath,
			"bridged to a 2026-07-28 upstream: mcpheal answers them itself, and the agent's GET stream (open throughout) carries what it keeps to the upstream's subscriptions/listen"
	}
	var sess bench.Session
	var stopGET func() // ends the agent's GET stream
	var getStatus atomic.Int64
	return hostileAttack{
		name: name, path: path,
		sends: fmt.Sprintf("one session: %d `resources/subscribe` of distinct %s URIs, %d at a time (for at most %s); %s", n, mib(size), workers, limit, where),
		cap:   fmt.Sprintf("max_journal %s per session (200 -32019 beyond), counted in memory_budget (-32017 when full)", mib(defMaxJournal)),
		setup: func(ctx context.Context, a *attackRun) error {
			var err error
			if sess, err = bench.Initialize(ctx, a.hc, a.url, true); err != nil || !bridged {
				return err
			}
			gctx, cancel := context.WithCancel(ctx)
			req, err := http.NewRequestWithContext(gctx, http.MethodGet, a.url, nil)
			if err != nil {
				cancel()
				return err
			}
			req.Header = sess.Header()
			req.Header.Set("Accept", "text/event-stream")
			// Its own client: the attack's gives up on an answer after 60 s.
			hc := &http.Client{Transport: &http.Transport{DisableCompression: true}}
			done := make(chan struct{})
			go func() {
				defer close(done)
				resp, err := hc.Do(req)
				if err != nil {
					return
				}
				getStatus.Store(int64(resp.StatusCode))
				_, _ = io.Copy(io.Discard, resp.Body)
				_ = resp.Body.Close()
			}()
			stopGET = func() {
				cancel()
				<-done
				hc.CloseIdleConnections()
			}
			return nil
		},
		run: func(ctx context.Context, a *attackRun) error {
			if stopGET != nil {
				defer stopGET()
			}
			var t tally
			var mu sync.Mutex
			capped, sent := 0, 0
			stopped := ""
			start := time.Now()
			parallel(n, workers, func(i int) {
				mu.Lock()
				switch {
				case stopped != "":
				case time.Since(start) > limit:
					stopped = fmt.Sprintf("; stopped at %s", limit)
				case a.rssKB() > floodRSSGuard>>10:
					stopped = fmt.Sprintf("; stopped when mcpheal's RSS passed %s", mib(floodRSSGuard))
				}
				done := stopped != ""
				mu.Unlock()
				if done {
					return
				}
				x := a.post(ctx, sess.ID, subscribeBody(i, size))
				t.add(x.key(), x.msg)
				mu.Lock()
				defer mu.Unlock()
				sent++
				if x.status == http.StatusOK && x.code == -32019 && strings.Contains(x.msg, "max_journal") {
					capped++
				}
			})
			a.got(&t, fmt.Sprintf("; %d sent in %s%s", sent, time.Since(start).Round(time.Millisecond), stopped))
			a.check(capped >= n-allowed, "%d of %d subscribes got 200 -32019 naming max_journal (at most %d of %s fit in max_journal %s)",
				capped, n, allowed, mib(size), mib(defMaxJournal))
			st, err := a.upStats(ctx)
			if err != nil {
				return err
			}
			if bridged {
				a.note("the agent's GET stream was answered %d; the upstream got %d subscriptions/listen requests", getStatus.Load(), st.Listens-a.stats.Listens)
			}
			got := st.Subscribes - a.stats.Subscribes
			a.check(got <= int64(allowed), "the upstream received %d subscriptions (at most %d)", got, allowed)
			if v, err := a.metricWhere(ctx, "mcpheal_memory_budget_bytes", `kind="used"`); err == nil {
				a.note("memory_budget used after the flood: %s (mcpheal_memory_budget_bytes)", mib(int(v)))
			}
			a.newcomer(ctx, "right after the flood")
			return nil
		},
		after: func(ctx context.Context, a *attackRun) error {
			a.peakWithin(uncounted, why)
			return nil
		},
	}
}

// metricWhere sums the samples of one metric whose labels contain label.
func (a *attackRun) metricWhere(ctx context.Context, name, label string) (float64, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, a.admin+"/metrics", nil)
	if err != nil {
		return 0, err
	}
	resp, err := a.hc.Do(req)
	if err != nil {
		return 0, err
	}
	defer resp.Body.Close()
	var sum float64
	found := false
	sc := bufio.NewScanner(resp.Body)
	for sc.Scan() {
		l := sc.Text()
		if rest, ok := strings.CutPrefix(l, name+"{"); ok && strings.Contains(rest, label) {
			f := strings.Fields(l)
			v, _ := strconv.ParseFloat(f[len(f)-1], 64)
			sum += v
			found = true
		}
	}
	if err := sc.Err(); err != nil {
		return 0, err
	}
	if !found {
		return 0, fmt.Errorf("no %s{%s}", name, label)
	}
	return sum, nil
}

// initBodyVersion is an initialize asking for protocol version v.
func initBodyVersion(name, v string) []byte {
	return []byte(`{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"` + v +
		`","capabilities":{},"clientInfo":{"name":"` + name + `","version":"1"}}}`)
}

// postInstructions posts an initialize and reads its answer: the head,
// then wait(), then the body as it comes, in which a 200's instructions are
// counted, not held (32 agents × 20 MiB). instr is -1 when a 200 carried
// none.
func (a *attackRun) postInstructions(ctx context.Context, body []byte, wait func()) (x agentAnswer, instr int) {
	req, err := a.request(ctx, "", body)
	if err != nil {
		wait()
		return agentAnswer{err: err}, -1
	}
	resp, err := a.hc.Do(req)
	wait()
	if err != nil {
		return agentAnswer{err: err}, -1
	}
	defer resp.Body.Close()
	x = agentAnswer{status: resp.StatusCode, sid: resp.Header.Get("Mcp-Session-Id")}
	if resp.StatusCode != http.StatusOK {
		raw, err := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
		x.n = int64(len(raw))
		if err != nil {
			x.err = err
		} else if ans := bench.Answer(raw); ans != nil {
			x.code, x.msg = gjson.GetBytes(ans, "error.code").Int(), gjson.GetBytes(ans, "error.message").Str
		}
		return x, -1
	}
	// mcpheal's own error comes as HTTP 200 too (-32017, -32015): a body
	// that ends within its first 4 KiB is read whole, not counted.
	br := bufio.NewReaderSize(resp.Body, 64<<10)
	if head, err := br.Peek(4 << 10); err != nil {
		x.n = int64(len(head))
		if !errors.Is(err, io.EOF) {
			x.err = err
		} else if ans := bench.Answer(head); ans != nil {
			x.code, x.msg = gjson.GetBytes(ans, "error.code").Int(), gjson.GetBytes(ans, "error.message").Str
		}
		if x.err != nil || x.code != 0 {
			return x, -1
		}
	}
	instr, x.n, x.err = countInstructions(br)
	return x, instr
}

var errNotFill = errors.New("instructions are not the upstream's (not all 'x')")

// countInstructions reads an initialize answer to its end and counts its
// instructions, which the fat upstream makes of 'x' alone: -1 when there
// are none.
func countInstructions(r *bufio.Reader) (instr int, n int64, err error) {
	marker := []byte(`"instructions":"`)
	var head []byte
	for !bytes.HasSuffix(head, marker) {
		c, err := r.ReadByte()
		if err != nil {
			if errors.Is(err, io.EOF) {
				err = nil
			}
			return -1, n, err
		}
		n++
		if head = append(head, c); len(head) > 64<<10 {
			k, err := io.Copy(io.Discard, r)
			return -1, n + k, err
		}
	}
	for {
		chunk, err := r.ReadSlice('"')
		n += int64(len(chunk))
		text := chunk
		if err == nil {
			text = chunk[:len(chunk)-1]
		}
		if len(bytes.TrimLeft(text, "x")) != 0 {
			k, _ := io.Copy(io.Discard, r)
			return instr, n + k, errNotFill
		}
		instr += len(text)
		if err == nil {
			break
		}
		if !errors.Is(err, bufio.ErrBufferFull) {
			return instr, n, err
		}
	}
	k, err := io.Copy(io.Discard, r)
	return instr, n + k, err
}

// barrier lets n parties go on once all have arrived, or after a timeout.
type barrier struct {
	left    atomic.Int64
	all     chan struct{}
	timeout time.Duration
}

func newBarrier(n int, timeout time.Duration) *barrier {
	b := &barrier{all: make(chan struct{}), timeout: timeout}
	b.left.Store(int64(n))
	return b
}

// arrive waits until every party has arrived or the timeout passes.
func (b *barrier) arrive() {
	if b.left.Add(-1) == 0 {
		close(b.all)
	}
	t := time.NewTimer(b.timeout)
	defer t.Stop()
	select {
	case <-b.all:
	case <-t.C:
	}
}

// met reports whether every party arrived.
func (b *barrier) met() bool {
	select {
	case <-b.all:
		return true
	default:
		return false
	}
}

// 8. Bridged discover: 32 concurrent session-era initializes of a
// 2026-07-28 upstream whose server/discover carries 20 MiB of
// instructions, which mcpheal puts in every initialize answer. Each agent
// reads its answer's head, and its body only once all 32 heads are in: the
// answers mcpheal admitted are then all held at once (20 MiB does not fit
// in the socket buffers), so the budget bounds how many got 200.
func (h *harness) attackDiscover() hostileAttack {
	const agents, version, wait = 32, "2025-11-25", 10 * time.Second
	size := hostileInstructions
	// What mcpheal holds beyond its budget: while it asks server/discover,
	// the upstream's answer read whole, the reply's copy of it, and the
	// copy of the result it parses (the instructions it keeps are counted).
	uncounted := 3 * size
	why := fmt.Sprintf("3 × the %s discover answer, as read, as the reply, as the parsed result", mib(size))
	return hostileAttack{
		name: "bridged discover", path: hostileFatPath,
		sends: fmt.Sprintf("%d concurrent `initialize` (protocolVersion %s), each reading its answer's body only once all %d heads are in (at most %s); the upstream speaks only 2026-07-28 and its server/discover carries %s of instructions, which mcpheal puts in every initialize answer",
			agents, version, agents, wait, mib(size)),
		cap: "memory_budget counts the discover answer once and each initialize answer built from it until written (-32017 beyond; a new session past it -32015; both in HTTP 200)",
		run: func(ctx context.Context, a *attackRun) error {
			var t tally
			var mu sync.Mutex
			ok, whole, refused := 0, 0, 0
			heads := newBarrier(agents, wait)
			parallel(agents, agents, func(i int) {
				x, instr := a.postInstructions(ctx, initBodyVersion("discover-"+strconv.Itoa(i), version), heads.arrive)
				key := x.key()
				if x.status == http.StatusOK && x.err == nil && x.code == 0 {
					switch {
					case instr < 0:
						key += ", no instructions"
					case instr != size:
						key += ", instructions " + mib(instr)
					}
				}
				t.add(key, x.msg)
				mu.Lock()
				defer mu.Unlock()
				switch {
				case x.status == http.StatusOK && x.err == nil && x.code == 0:
					ok++
					if instr == size {
						whole++
					}
				case x.status == http.StatusOK && (x.code == -32017 || x.code == -32015) && strings.Contains(x.msg, "memory_budget"):
					refused++
				}
			})
			a.got(&t, "")
			// The budget holds the discover answer and this many answers
			// (each a little more than the instructions) at once.
			held := (a.pass.Budget - size) / size
			a.check(ok+refused == agents, "every answer is the initialize's or -32017/-32015 naming memory_budget: %d + %d of %d", ok, refused, agents)
			a.check(heads.met() && ok <= held && ok > 0, "%d answers were 200 with every head in before any body was read (%v): at least 1, at most the %d that fit in memory_budget beside the discover answer",
				ok, heads.met(), held)
			a.check(whole == ok, "%d of the %d 200s carry all %s of instructions", whole, ok, mib(size))
			st, err := a.upStats(ctx)
			if err != nil {
				return err
			}
			a.note("mcpheal asked the upstream server/discover %d times", st.Discovers-a.stats.Discovers)
			if v, err := a.metricWhere(ctx, "mcpheal_memory_budget_bytes", `kind="used"`); err == nil {
				a.note("memory_budget used after the attack: %s (mcpheal_memory_budget_bytes)", mib(int(v)))
			}
			a.newcomer(ctx, "after the attack")
			return nil
		},
		after: func(ctx context.Context, a *attackRun) error {
			a.peakWithin(uncounted, why)
			return nil
		},
	}
}

package doctor

import (
	"fmt"
	"io"
	"net/http"
	"strings"

	"github.com/mcpheal/mcpheal/classify"
)

// Verdict is the doctor's conclusion about one server.
type Verdict uint8

const (
	// VerdictUnknown is the zero value: no conclusion.
	VerdictUnknown Verdict = iota
	// VerdictHealable: the server has sessions and answers an unknown id in
	// a way the proxy classifies SessionGone, so it re-creates and replays.
	VerdictHealable
	// VerdictStateless: the server mints no session id (or speaks only
	// 2026-07-28): nothing to re-create; the proxy retries transport
	// failures only.
	VerdictStateless
	// VerdictExpiryInvisible: the server accepts any well-formed session id
	// it never issued (mcp-go's default session manager), so a dead session
	// never shows. Calls keep working; per-session state may be lost
	// silently. The proxy has nothing to heal and passes it through: this
	// counts as healable.
	VerdictExpiryInvisible
	// VerdictNotHealable: the server has sessions but answers an unknown id
	// in a way the proxy does not recognise as a dead session, or accepts
	// no initialize the proxy can record.
	VerdictNotHealable
	// VerdictNeedsLogin: the server wants a login (401) that the doctor
	// was given no usable credential for, or mcpheal's own credential
	// cannot be had: nothing is known of its sessions yet, and the notes
	// say what to run (mcpheal login, for an OAuth server).
	VerdictNeedsLogin
)

// String returns the verdict's name.
func (v Verdict) String() string {
	switch v {
	case VerdictUnknown:
		return "unknown"
	case VerdictHealable:
		return "healable"
	case VerdictStateless:
		return "stateless"
	case VerdictExpiryInvisible:
		return "expiry invisible"
	case VerdictNotHealable:
		return "not healable"
	case VerdictNeedsLogin:
		return "needs a login"
	}
	return fmt.Sprintf("Verdict(%d)", uint8(v))
}

// Answer is what the server said to one probe. Body is a printable prefix.
type Answer struct {
	Status      int
	ContentType string
	Body        string
	// Err is a transport failure: no answer at all (Status 0), or an answer
	// whose body failed (cut, too large, reset); "" when it was read whole.
	Err string
}

// VersionProbe is the outcome of initialize with one protocol version.
type VersionProbe struct {
	Version string
	// Accepted: 2xx and the server agreed to exactly this version.
	Accepted bool
	// Got is the version the server answered with ("" if none).
	Got string
	Answer
}

// DiscoverProbe is the outcome of server/discover with 2026-07-28
// (SEP-2575, the session-less protocol).
type DiscoverProbe struct {
	// Supported: the server listed its versions (a result, or an
	// unsupported-version error that names them).
	Supported bool
	// Accepted: 2026-07-28 is among the supported versions.
	Accepted          bool
	SupportedVersions []string
	Answer
}

// UnknownProbe is the server's answer to a ping carrying a session id it
// never issued, shaped like its own, and the class the proxy gives it.
type UnknownProbe struct {
	Class classify.Class
	Answer
}

// ToolSummary counts tools/list entries and their replay annotations.
type ToolSummary struct {
	Listed     bool
	Count      int
	ReadOnly   int // annotations.readOnlyHint true
	Idempotent int // annotations.idempotentHint true
	Answer
}

// Report is what Run learnt about one server.
type Report struct {
	URL      string
	Server   string // serverInfo "name version", if given
	Versions []VersionProbe
	Discover DiscoverProbe
	// Bridged: the server speaks only MCP 2026-07-28 (server/discover lists
	// no session-era version), so mcpheal bridges session-era agents to it
	// (era_bridge: auto).
	Bridged bool
	// Held: the server speaks only the session era (it refuses
	// server/discover), so mcpheal holds sessions for 2026-07-28 agents
	// (era_bridge: auto or 2026-agents).
	Held bool
	// Protocol is the version the later probes used ("" if none accepted).
	Protocol string
	// Stateful: initialize answered with an Mcp-Session-Id.
	Stateful  bool
	SessionID IDShape
	Unknown   UnknownProbe
	GetStream Answer
	// Ping: Pong means ping answered {}.
	Ping   Answer
	Pong   bool
	Tools  ToolSummary
	Delete Answer
	// Auth is how the server authenticates, when it asked for a login (a
	// 401) or the doctor was given a credential; nil otherwise.
	Auth *AuthProbe
	// Credential is what became of mcpheal's own credential, when the
	// doctor was given one (Options.Credential); nil otherwise.
	Credential *CredentialUse
	// authGiven: an Authorization header was given (Options.Header).
	authGiven bool
	// Verdict is the conclusion; Notes explain it and anything odd.
	Verdict Verdict
	Notes   []string
}

// Healable reports whether the proxy can keep sessions with this server
// alive: it heals dead sessions, or the server has none to lose.
func (r *Report) Healable() bool {
	switch r.Verdict {
	case VerdictHealable, VerdictStateless, VerdictExpiryInvisible:
		return true
	}
	return false
}

// WriteTo prints the report as a short aligned text, verdict last.
func (r *Report) WriteTo(w io.Writer) (int64, error) {
	var b strings.Builder
	line := func(k, f string, a ...any) { fmt.Fprintf(&b, "  %-14s %s\n", k, fmt.Sprintf(f, a...)) }
	fmt.Fprintf(&b, "mcpheal doctor %s\n", r.URL)
	if r.Server != "" {
		line("server", "%s", r.Server)
	}
	if c := r.Credential; c != nil {
		line("credential", "mcpheal's own, %s: %s", c.From, c.describe())
	}
	for _, v := range r.Versions {
		line("initialize", "%s: %s", v.Version, v.describe())
	}
	line("discover", "2026-07-28: %s", r.Discover.describe())
	if r.Bridged {
		line("era", "2026-07-28 only: mcpheal bridges session-era agents to it (era_bridge: auto)")
	} else if r.Discover.Accepted {
		line("era", "both eras: session-era agents pass through, as 2026-07-28 ones do")
	} else if r.Held {
		line("era", "session era only: mcpheal answers server/discover and holds a session for each 2026-07-28 agent "+
			"(era_bridge: auto or 2026-agents); session-era agents pass through")
	} else {
		line("era", "session era: no bridge needed")
	}
	switch {
	case r.Protocol == "":
	case r.Stateful:
		line("sessions", "stateful (Mcp-Session-Id on initialize); probes below use %s", r.Protocol)
		line("session id", "%s", r.SessionID)
	default:
		line("sessions", "stateless (no Mcp-Session-Id); probes below use %s", r.Protocol)
	}
	if r.Protocol != "" {
		line("unknown id", "%s → %s%s", r.Unknown.Answer.describe(), r.Unknown.Class, r.classHint())
		line("GET stream", "%s", describeGet(r.GetStream))
		line("ping", "%s", yesNo(r.Pong, r.Ping))
		line("tools", "%s", r.Tools.describe())
	}
	if r.Stateful {
		line("DELETE", "%s", r.Delete.describe())
	}
	if r.Auth != nil {
		file := "FILE"
		if r.Credential != nil && r.Credential.LoginFile != "" {
			file = r.Credential.LoginFile
		}
		r.Auth.describe(line, r.URL, file)
	}
	fmt.Fprintf(&b, "verdict: %s\n", r.Verdict)
	for _, n := range r.Notes {
		fmt.Fprintf(&b, "  - %s\n", n)
	}
	n, err := io.WriteString(w, b.String())
	return int64(n), err
}

func (a Answer) describe() string {
	if a.Err != "" && a.Status == 0 {
		return "no answer: " + a.Err
	}
	if a.Status == 0 {
		return "not tried"
	}
	s := fmt.Sprintf("%d", a.Status)
	if a.ContentType != "" {
		s += " " + a.ContentType
	}
	if a.Body != "" {
		s += ": " + a.Body
	}
	if a.Err != "" { // the head came, the body failed
		s += " (" + a.Err + ")"
	}
	return s
}

func (v VersionProbe) describe() string {
	switch {
	case v.Accepted:
		return "accepted"
	case v.Err != "":
		return v.Answer.describe()
	case v.Status/100 == 2 && v.Got != "":
		return "counter-offered " + v.Got
	}
	return "refused: " + v.Answer.describe()
}

func (p DiscoverProbe) describe() string {
	switch {
	case p.Accepted:
		return fmt.Sprintf("accepted (supports %s)", strings.Join(p.SupportedVersions, ", "))
	case p.Supported:
		return fmt.Sprintf("not offered (supports %s)", strings.Join(p.SupportedVersions, ", "))
	}
	return "not supported: " + p.Answer.describe()
}

func (t ToolSummary) describe() string {
	if !t.Listed {
		return "tools/list failed: " + t.Answer.describe()
	}
	return fmt.Sprintf("%d listed; readOnlyHint %d, idempotentHint %d (mcpheal replays those after an ambiguous failure)",
		t.Count, t.ReadOnly, t.Idempotent)
}

// classHint says what the unknown-id class means for this server.
func (r *Report) classHint() string {
	switch {
	case r.Unknown.Err != "":
		return ""
	case !r.Stateful:
		return " (no sessions: nothing to heal)"
	case r.Unknown.Class == classify.SessionGone:
		return " (mcpheal heals this)"
	case r.Unknown.Class == classify.OK:
		return " (accepted: expiry invisible)"
	}
	return " (mcpheal passes it through: cannot heal)"
}

func describeGet(a Answer) string {
	switch {
	case a.Err != "":
		return "no answer: " + a.Err
	case a.Status == http.StatusOK && isEventStream(a.ContentType):
		return "supported (200 text/event-stream)"
	case a.Status == http.StatusMethodNotAllowed:
		return "not offered (405)"
	}
	return "unexpected: " + a.describe()
}

func yesNo(ok bool, a Answer) string {
	if ok {
		return "supported"
	}
	return "not supported: " + a.describe()
}

func (c *CredentialUse) describe() string {
	switch {
	case c.Err != "":
		return "cannot be had (see below): the probes went without it"
	case c.Refused:
		return "refused by the server (401), a new token included"
	}
	return "sent with every probe but the auth probe, as mcpheal sends it"
}

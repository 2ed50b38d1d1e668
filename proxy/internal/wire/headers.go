package wire

import (
	"bytes"
	mathbits "math/bits"
	"strings"
	"sync"

	"github.com/valyala/fasthttp"

	"github.com/mcpheal/mcpheal/session"
)

func SetSessionHeader(req *fasthttp.Request, up session.UpstreamID) {
	if up == "" {
		req.Header.DelBytes(HdrSessionID)
		return
	}
	req.Header.SetBytesK(HdrSessionID, string(up))
}

// Hop-by-hop headers (RFC 9110 §7.6.1) and headers the proxy owns.
var (
	ReqDropHeaders = NewNameSet(
		"Connection", "Keep-Alive", "Proxy-Connection", "Proxy-Authorization", "TE", "Trailer",
		"Transfer-Encoding", "Upgrade",
		// fasthttp has answered the agent's Expect: 100-continue itself.
		"Expect",
		// Bodies must come back uncompressed so they can be classified.
		"Accept-Encoding",
		// The proxy has checked Origin against its own names; the upstream
		// would compare it with a Host it no longer sees.
		"Origin",
	)
	// reqDropWithAuth is reqDropHeaders when mcpheal supplies the
	// upstream credential itself: the agent's Authorization stays behind.
	ReqDropWithAuth = NewNameSet(append(append([]string(nil), ReqDropHeaders.Names...), "Authorization")...)
	RespDropHeaders = NewNameSet(
		"Connection", "Keep-Alive", "Proxy-Connection", "Proxy-Authenticate", "TE", "Trailer",
		"Transfer-Encoding", "Upgrade",
		// The upstream's session id never reaches the agent (idBit).
		"Mcp-Session-Id",
	)
	// The fields fasthttp keeps out of its list of fields (a response's
	// Date is managed by fasthttp).
	requestApart  = NewNameSet("Host", "Content-Type", "Content-Length", "User-Agent")
	responseApart = NewNameSet("Content-Type", "Content-Length", "Content-Encoding", "Server", "Set-Cookie", "Date")
)

// idBit is Mcp-Session-Id's bit in respDropHeaders.
var idBit = RespDropHeaders.Bits(HdrSessionID)

// NameSet is a set of up to 32 field names, looked up ignoring case.
type NameSet struct {
	Names []string
	byLen [maxNameLen + 1]uint32 // the bits of the names of each length
}

const maxNameLen = 23

func NewNameSet(names ...string) *NameSet {
	if len(names) > 32 {
		panic("nameSet: more than 32 names")
	}
	s := &NameSet{Names: names}
	for i, n := range names {
		if len(n) > maxNameLen {
			panic("nameSet: name longer than maxNameLen: " + n)
		}
		s.byLen[len(n)] |= 1 << i
	}
	return s
}

// Bits returns 1<<i if name is names[i] (ignoring case), else 0.
func (s *NameSet) Bits(name []byte) uint32 {
	if len(name) > maxNameLen {
		return 0
	}
	for m := s.byLen[len(name)]; m != 0; m &= m - 1 {
		i := mathbits.TrailingZeros32(m)
		if strings.EqualFold(B2s(name), s.Names[i]) {
			return 1 << i
		}
	}
	return 0
}

// StripRequestHeader deletes the fields named in drop from h, a copy of an
// agent's request header as parsed, and keeps the order of those that stay
// (the order of the fields of one name is part of their meaning).
//
// fasthttp's Del copies and normalizes its name and scans every field, and
// moves the last field into the gap it leaves. So h's raw block (the fields
// as received) is scanned once, and Del runs only for the names present
// (Accept-Encoding, from almost every client). If a deletion could reorder
// the fields of a name that stays, they are written again in the order
// received instead. A header that was not parsed from the wire
// (RequestCtx.Init) has no raw block: each name is deleted.
func StripRequestHeader(h *fasthttp.RequestHeader, drop *NameSet) {
	h.ResetConnectionClose()
	raw := h.RawHeaders()
	if len(raw) == 0 {
		StripListed(h, drop)
		return
	}
	found, reorder := RawHeaderNames(raw, drop)
	switch {
	case found == 0:
	case !reorder:
		delFound(h, drop, found)
	default:
		rebuildRequestHeader(h, drop, found)
	}
}

// StripListed is stripRequestHeader for a header whose raw block is not
// its fields (none: built with Add, or not parsed; stale: changed since it
// was parsed): it reads h's own list, in order. The Cookie fields are
// fasthttp's cookie list, which Del leaves alone, so only the other fields
// are written again when a deletion could reorder them.
func StripListed(h *fasthttp.RequestHeader, drop *NameSet) {
	var found uint32
	dropped, keptAfter := false, false
	var seen [MaxNames][]byte
	n, repeats := 0, false
	for k := range h.All() {
		if requestApart.Bits(k) != 0 || string(k) == "Cookie" {
			continue
		}
		if bit := drop.Bits(k); bit != 0 {
			found |= bit
			dropped = true
			continue
		}
		keptAfter = keptAfter || dropped
		if !repeats {
			repeats = n == MaxNames || seenName(seen[:n], k)
			if !repeats {
				seen[n], n = k, n+1
			}
		}
	}
	if found == 0 {
		return
	}
	if !keptAfter || !repeats {
		delFound(h, drop, found)
		return
	}
	fc := fieldCopies.Get().(*fieldCopy)
	defer fieldCopies.Put(fc)
	fc.reset()
	for k, v := range h.All() {
		if requestApart.Bits(k) == 0 && string(k) != "Cookie" && drop.Bits(k) == 0 {
			fc.add(k, v)
		}
	}
	fc.replace(h, drop, found, false)
}

// rebuildRequestHeader deletes from h the fields named by the found bits of
// drop, and keeps the others in the order received: every field fasthttp
// keeps in its list goes, and those that stay come back as received. The
// raw block is read once: AllInOrder joins a folded value in place, in the
// block itself, so a second pass would read it garbled.
func rebuildRequestHeader(h *fasthttp.RequestHeader, drop *NameSet, found uint32) {
	fc := fieldCopies.Get().(*fieldCopy)
	defer fieldCopies.Put(fc)
	fc.reset()
	for k, v := range h.AllInOrder() {
		if requestApart.Bits(k) == 0 && found&drop.Bits(k) == 0 {
			fc.add(k, v)
		}
	}
	// Added as received: a Cookie field stays one field (fasthttp would
	// parse it into its cookie list).
	fc.replace(h, drop, found, true)
}

// fieldCopy holds the fields rebuildRequestHeader and stripListed put
// back: name and value bytes in b, each ending at the next offset in ends.
type fieldCopy struct {
	b    []byte
	ends []int
}

func (fc *fieldCopy) reset() { fc.b, fc.ends = fc.b[:0], fc.ends[:0] }

func (fc *fieldCopy) add(k, v []byte) {
	fc.b = append(fc.b, k...)
	fc.ends = append(fc.ends, len(fc.b))
	fc.b = append(fc.b, v...)
	fc.ends = append(fc.ends, len(fc.b))
}

// replace deletes from h the fields named by the found bits of drop and
// every field fc holds, then adds fc's fields back in their order; with
// asReceived, as fields only (a Cookie field stays one field).
func (fc *fieldCopy) replace(h *fasthttp.RequestHeader, drop *NameSet, found uint32, asReceived bool) {
	delFound(h, drop, found)
	for i, start := 0, 0; i < len(fc.ends); i, start = i+2, fc.ends[i+1] {
		h.DelBytes(fc.b[start:fc.ends[i]])
	}
	if asReceived && !h.DisableSpecialHeader() {
		defer h.EnableSpecialHeader()
	}
	for i, start := 0, 0; i < len(fc.ends); i, start = i+2, fc.ends[i+1] {
		h.AddBytesKV(fc.b[start:fc.ends[i]], fc.b[fc.ends[i]:fc.ends[i+1]])
	}
	if cap(fc.b) > 64<<10 {
		fc.b = nil // do not pin a large buffer in the pool
	}
}

// delFound deletes from h the fields named by the found bits of drop.
func delFound(h *fasthttp.RequestHeader, drop *NameSet, found uint32) {
	for i, name := range drop.Names {
		if found&(1<<i) != 0 {
			h.Del(name)
		}
	}
}

var fieldCopies = sync.Pool{New: func() any { return new(fieldCopy) }}

// RawHeaderNames returns a bit (1<<i) for each of drop's names that names a
// field line of raw, a header block as received (ignoring case, as HTTP
// field names are), and whether deleting them from fasthttp's list of
// fields could reorder fields of one name that stays: fasthttp's Del moves
// the last field into the gap, so that needs a field that stays after one
// that goes, and a name that stays more than once.
func RawHeaderNames(raw []byte, drop *NameSet) (found uint32, reorder bool) {
	dropped, keptAfter := false, false
	for b := raw; len(b) > 0; {
		name, rest := fieldName(b)
		b = rest
		if name == nil || requestApart.Bits(name) != 0 {
			continue
		}
		if bit := drop.Bits(name); bit != 0 {
			found |= bit
			dropped = true
		} else {
			keptAfter = keptAfter || dropped
		}
	}
	if !keptAfter {
		return found, false
	}
	var seen [MaxNames][]byte
	n := 0
	for b := raw; len(b) > 0; {
		name, rest := fieldName(b)
		b = rest
		if name == nil || drop.Bits(name) != 0 || requestApart.Bits(name) != 0 {
			continue
		}
		if n == MaxNames || seenName(seen[:n], name) {
			return found, true
		}
		seen[n], n = name, n+1
	}
	return found, false
}

// fieldName returns the name of the first line of b, a header block, and
// the lines after it; the name is nil if the line is no field line (or an
// obsolete folded continuation).
func fieldName(b []byte) (name, rest []byte) {
	line := b
	if i := bytes.IndexByte(b, '\n'); i >= 0 {
		line, rest = b[:i], b[i+1:]
	}
	colon := bytes.IndexByte(line, ':')
	if colon <= 0 || line[0] == ' ' || line[0] == '\t' {
		return nil, rest
	}
	return line[:colon], rest
}

// MaxNames is how many distinct field names rawHeaderNames and
// stripResponseHeader tell apart when they look for repeats; past it they
// assume one.
const MaxNames = 32

// seenName reports whether name is among seen (ignoring case).
func seenName(seen [][]byte, name []byte) bool {
	for _, s := range seen {
		if len(s) == len(name) && bytes.EqualFold(s, name) {
			return true
		}
	}
	return false
}

// StripResponseHeader deletes the hop-by-hop fields and the upstream's
// session ids from h, a copy of src (an upstream answer's head), keeping
// the order of the fields that stay; with keepOneID, a sole Mcp-Session-Id
// stays for its caller to overwrite in place. It reports how many
// Mcp-Session-Id fields src has. As in stripRequestHeader, one pass finds
// the names, Del runs only for those present (the TypeScript SDK's server
// sends Connection: keep-alive), and if a deletion could reorder the fields of a name that
// stays they are written again in src's order.
func StripResponseHeader(src, h *fasthttp.ResponseHeader, keepOneID bool) (sessionIDs int) {
	h.ResetConnectionClose()
	var found uint32
	dropped, keptAfter := false, false
	for k := range src.All() {
		switch bit := RespDropHeaders.Bits(k); {
		case bit == idBit:
			sessionIDs++
			found |= bit
		case bit != 0:
			found |= bit
			dropped = true
		case responseApart.Bits(k) == 0:
			keptAfter = keptAfter || dropped
		}
	}
	if keepOneID && sessionIDs == 1 {
		found &^= idBit
	} else if sessionIDs > 0 {
		keptAfter = true // where the ids were is not tracked: assume the worst
	}
	switch {
	case found == 0:
	case !keptAfter || !responseRepeats(src):
		for i, name := range RespDropHeaders.Names {
			if found&(1<<i) != 0 {
				h.Del(name)
			}
		}
	default:
		for k := range src.All() {
			if responseApart.Bits(k) == 0 {
				h.DelBytes(k)
			}
		}
		for k, v := range src.All() {
			if responseApart.Bits(k) == 0 && found&RespDropHeaders.Bits(k) == 0 {
				h.AddBytesKV(k, v)
			}
		}
	}
	return sessionIDs
}

// responseRepeats reports whether a field name that stays appears more than
// once in h.
func responseRepeats(h *fasthttp.ResponseHeader) bool {
	var seen [MaxNames][]byte
	n := 0
	for k := range h.All() {
		if RespDropHeaders.Bits(k) != 0 || responseApart.Bits(k) != 0 {
			continue // Set-Cookie among them: fasthttp keeps those apart, in order
		}
		if n == MaxNames || seenName(seen[:n], k) {
			return true
		}
		seen[n], n = k, n+1
	}
	return false
}

// HeaderValue returns the value of the named header in hdr, or "".
func HeaderValue(hdr [][2]string, name string) string {
	for _, kv := range hdr {
		if strings.EqualFold(kv[0], name) {
			return kv[1]
		}
	}
	return ""
}

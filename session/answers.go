package session

import (
	"context"
	"time"
)

// Answers is what a fleet keeps of the answers agents may resume, beside
// Shared: the streamed answer of a call, event by event, so that an
// agent's GET with Last-Event-ID is served on whichever replica it
// reaches, and a replica lost in the middle of a call leaves its answer to
// another (docs/streams.md "Across replicas"). session/redisstore
// implements it.
//
// An answer is named by its key (mcpheal's own event ids name it:
// "m<stream>"), written by one process at a time, its owner, under a
// lease the owner renews as it writes; another process may take it over
// only once that lease ran out (TakeAnswer). Everything expires the
// window after the last write.
type Answers interface {
	// WriteAnswer adds w's events to the log of answer key, starting it
	// when w.Open is set. It reports false, and writes nothing, when the
	// log is another owner's (or gone).
	WriteAnswer(ctx context.Context, key string, w *AnswerWrite) (bool, error)
	// ReadAnswer returns what the log of answer key holds after event
	// after, waiting up to wait for more when it holds nothing new yet
	// (or does not exist yet) and the answer has not ended. Found is false
	// when there is no such log. A reader (an agent's stream following
	// it) marks it read for ReaderMark.
	ReadAnswer(ctx context.Context, key string, after int, wait time.Duration, reader bool) (AnswerRead, error)
	// TakeAnswer makes owner the owner of answer key, for lease, when its
	// last owner's lease ran out: true for exactly one caller.
	TakeAnswer(ctx context.Context, key, owner string, lease time.Duration) (bool, error)
	// DropAnswer deletes the log of answer key if owner owns it: nobody
	// will resume it.
	DropAnswer(ctx context.Context, key, owner string) error
}

// AnswerInfo is what an answer's log says of it, beside its events.
type AnswerInfo struct {
	// Session is a digest of the agent session the answer belongs to:
	// only an agent of that session may read it.
	Session string
	// Request is the JSON-RPC id of the request answered, as the agent
	// sent it: for mcpheal's own error, when the rest cannot be had.
	Request string
	// Upstream is the upstream session the answer streams on, and Version
	// its protocol version: where the rest of it is asked for.
	Upstream UpstreamID
	Version  string
	// Owner is the process relaying it.
	Owner string
}

// AnswerWrite is one write to an answer's log.
type AnswerWrite struct {
	Open  *AnswerInfo // the first write: the log starts (again) with it
	Owner string
	// Events are whole SSE events as the agent gets them, numbered from
	// First; one already in the log is not added again. Last is the
	// number of the last event there is, whether Events hold it or not
	// (one larger than Max is not written).
	Events      [][]byte
	First, Last int
	// UpLastID is the upstream's id of the last event of Events, where
	// the upstream resumes the answer; empty leaves it as it was.
	UpLastID string
	// Done: the answer ended.
	Done bool
	// Max is how many bytes of events the log keeps (the last ones, at
	// least one event); Lease renews the owner's lease, Window the log's
	// life.
	Max           int
	Lease, Window time.Duration
}

// AnswerRead is what ReadAnswer found.
type AnswerRead struct {
	Found bool
	Info  AnswerInfo
	// Events are the whole events after the one asked for, numbered from
	// First; Last is the number of the last of them (after, when there
	// are none), Tail that of the last event the log holds, whatever was
	// asked. Lost: events right after the one asked for are no longer
	// kept.
	Events            [][]byte
	First, Last, Tail int
	Lost              bool
	// UpLastID is the upstream's id of event Numbered, the last its owner
	// numbered (written or not): where the upstream resumes it. Done: the
	// answer ended. OwnerLive: its owner's lease runs.
	UpLastID  string
	Numbered  int
	Done      bool
	OwnerLive bool
	// Read: a reader marked it within ReaderMark.
	Read bool
}

// ReaderMark is how long a reader's ReadAnswer marks an answer read: its
// owner keeps the call going while it is (past resume_window).
const ReaderMark = 10 * time.Second

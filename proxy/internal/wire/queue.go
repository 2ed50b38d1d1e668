package wire

import "sync"

// Queue carries whole events from a stream's reader (an upstream GET
// stream, a listen) to the writer of its agent's stream. An event is
// counted in the memory budget from when it is queued until the writer
// takes it, or the queue closes: an agent that reads slowly holds its
// queue full, and what it holds is the budget's to allow.
type Queue struct {
	C   chan []byte
	mem *Budget

	mu     sync.Mutex
	held   int64 // counted for the events in C
	closed bool
}

// NewQueue returns a queue of n events counted in mem (nil: not counted).
func NewQueue(mem *Budget, n int) *Queue {
	return &Queue{C: make(chan []byte, n), mem: mem}
}

// How Put went.
const (
	Queued     = iota
	Stopped    // quit closed, or the queue closed
	OverBudget // ev would pass the memory budget: nothing was queued
	Late       // no room now (TryPut): nothing was queued
)

// Put queues ev, counted, waiting for room until quit closes.
func (q *Queue) Put(ev []byte, quit <-chan struct{}) int {
	if r := q.charge(ev); r != Queued {
		return r
	}
	select {
	case q.C <- ev:
		return Queued
	case <-quit:
		q.Took(ev)
		return Stopped
	}
}

// TryPut queues ev, counted, if there is room now.
func (q *Queue) TryPut(ev []byte) int {
	if r := q.charge(ev); r != Queued {
		return r
	}
	select {
	case q.C <- ev:
		return Queued
	default:
		q.Took(ev)
		return Late
	}
}

// charge counts ev before it is queued.
func (q *Queue) charge(ev []byte) int {
	n := int64(len(ev))
	q.mu.Lock()
	defer q.mu.Unlock()
	switch {
	case q.closed:
		return Stopped
	case q.mem == nil:
		return Queued
	case !q.mem.Take(n):
		return OverBudget
	}
	q.held += n
	return Queued
}

// Took gives back the count of ev, received from C.
func (q *Queue) Took(ev []byte) {
	q.mu.Lock()
	if !q.closed && q.mem != nil {
		n := int64(len(ev))
		q.held -= n
		q.mem.Give(n)
	}
	q.mu.Unlock()
}

// Close gives back what is still queued, which nobody will take now;
// every later Put reports Stopped. The writer closes the queue when it
// ends.
func (q *Queue) Close() {
	q.mu.Lock()
	if !q.closed {
		q.closed = true
		if q.mem != nil {
			q.mem.Give(q.held)
		}
		q.held = 0
	}
	q.mu.Unlock()
}

package translate

import (
	"net/http"
	"time"
)

// SSE is the EventWriter of a streaming response: each event is written
// to the client as "event: NAME\ndata: JSON\n\n". Headers go out with the
// first event only, so a failure before any output can still be answered
// with a real status. An event is flushed as it is written, except that a
// Stream made by NewSSEStream flushes the events of one upstream event
// (Handle) and those of Finish together: one upstream frame costs one
// flush (one write system call) however many events it turns into. Owned
// by the turn's goroutine.
type SSE struct {
	w         http.ResponseWriter
	rc        *http.ResponseController
	buf       []byte
	started   bool
	batching  bool // inside beginBatch/endBatch
	dirty     bool // written since the last flush
	lastWrite time.Time
}

// NewSSE returns the SSE writer of the response w.
func NewSSE(w http.ResponseWriter) *SSE {
	return &SSE{w: w, rc: http.NewResponseController(w), buf: make([]byte, 0, 512)}
}

// WriteEvent implements EventWriter.
func (s *SSE) WriteEvent(name string, data []byte) error {
	if !s.started {
		h := s.w.Header()
		h["Content-Type"] = []string{"text/event-stream"}
		h["Cache-Control"] = []string{"no-cache"}
		h["Connection"] = []string{"keep-alive"}
		s.w.WriteHeader(http.StatusOK)
		s.started = true
	}
	// One Write of the framed event into net/http's buffered body writer
	// (4 KB): no system call until the flush.
	s.buf = append(s.buf[:0], "event: "...)
	s.buf = append(s.buf, name...)
	s.buf = append(s.buf, "\ndata: "...)
	s.buf = append(s.buf, data...)
	s.buf = append(s.buf, "\n\n"...)
	if _, err := s.w.Write(s.buf); err != nil {
		return err
	}
	s.lastWrite = time.Now()
	if s.batching {
		s.dirty = true
		return nil
	}
	return s.rc.Flush()
}

// Started reports whether the headers and a first event went out: after
// that the response can only end with an SSE error event.
func (s *SSE) Started() bool { return s.started }

// LastWrite is when the latest event was written (zero before any).
func (s *SSE) LastWrite() time.Time { return s.lastWrite }

// beginBatch defers flushing until endBatch.
func (s *SSE) beginBatch() { s.batching = true }

// endBatch ends a batch and flushes what it wrote.
func (s *SSE) endBatch() error {
	s.batching = false
	if !s.dirty {
		return nil
	}
	s.dirty = false
	return s.rc.Flush()
}

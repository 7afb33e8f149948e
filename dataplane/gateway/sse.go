package gateway

import (
	"net/http"
	"time"
)

// sseWriter is the streaming translate.EventWriter: each event is written
// as "event: NAME\ndata: JSON\n\n". Outside a batch each event is flushed
// at once; inside a batch (the events one upstream frame produces) the
// events are flushed together by endBatch, so one upstream frame costs one
// flush (one write system call) however many events it turns into. Headers
// go out with the first event only, so a failure before any output can
// still be answered with a real status. Owned by the turn's goroutine.
type sseWriter struct {
	w         http.ResponseWriter
	rc        *http.ResponseController
	buf       []byte
	started   bool
	batching  bool // inside beginBatch/endBatch
	dirty     bool // written since the last flush
	lastWrite time.Time
}

func newSSEWriter(w http.ResponseWriter) *sseWriter {
	return &sseWriter{w: w, rc: http.NewResponseController(w), buf: make([]byte, 0, 512)}
}

// WriteEvent implements translate.EventWriter.
func (s *sseWriter) WriteEvent(name string, data []byte) error {
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

// beginBatch defers flushing until endBatch.
func (s *sseWriter) beginBatch() { s.batching = true }

// endBatch ends a batch and flushes what it wrote.
func (s *sseWriter) endBatch() error {
	s.batching = false
	if !s.dirty {
		return nil
	}
	s.dirty = false
	return s.rc.Flush()
}

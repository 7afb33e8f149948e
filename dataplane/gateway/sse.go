package gateway

import (
	"net/http"
	"time"
)

// sseWriter is the streaming translate.EventWriter: each event is written
// as "event: NAME\ndata: JSON\n\n" and flushed at once. Headers go out with
// the first event only, so a failure before any output can still be
// answered with a real status. Owned by the turn's goroutine.
type sseWriter struct {
	w         http.ResponseWriter
	rc        *http.ResponseController
	buf       []byte
	started   bool
	lastWrite time.Time
}

func newSSEWriter(w http.ResponseWriter) *sseWriter {
	return &sseWriter{w: w, rc: http.NewResponseController(w), buf: make([]byte, 0, 512)}
}

// WriteEvent implements translate.EventWriter.
func (s *sseWriter) WriteEvent(name string, data []byte) error {
	if !s.started {
		h := s.w.Header()
		h.Set("Content-Type", "text/event-stream")
		h.Set("Cache-Control", "no-cache")
		h.Set("Connection", "keep-alive")
		s.w.WriteHeader(http.StatusOK)
		s.started = true
	}
	s.buf = append(s.buf[:0], "event: "...)
	s.buf = append(s.buf, name...)
	s.buf = append(s.buf, "\ndata: "...)
	s.buf = append(s.buf, data...)
	s.buf = append(s.buf, "\n\n"...)
	if _, err := s.w.Write(s.buf); err != nil {
		return err
	}
	s.lastWrite = time.Now()
	return s.rc.Flush()
}

package translate

import (
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
)

// flushCounter is a ResponseWriter that counts flushes and can fail them.
type flushCounter struct {
	*httptest.ResponseRecorder
	flushes  int
	flushErr error
}

func (f *flushCounter) FlushError() error {
	f.flushes++
	return f.flushErr
}

func TestSSEFlushes(t *testing.T) {
	tests := []struct {
		name        string
		batch       bool
		events      int
		wantFlushes int
	}{
		{"unbatched: one flush per event", false, 3, 3},
		{"batched: one flush per batch", true, 3, 1},
		{"empty batch: no flush", true, 0, 0},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			fw := &flushCounter{ResponseRecorder: httptest.NewRecorder()}
			s := NewSSE(fw)
			if tt.batch {
				s.beginBatch()
			}
			for range tt.events {
				if err := s.WriteEvent("ping", []byte(`{"type":"ping"}`)); err != nil {
					t.Fatalf("WriteEvent: %v", err)
				}
			}
			if tt.batch {
				if err := s.endBatch(); err != nil {
					t.Fatalf("endBatch: %v", err)
				}
			}
			if fw.flushes != tt.wantFlushes {
				t.Errorf("flushes = %d, want %d", fw.flushes, tt.wantFlushes)
			}
			want := ""
			for range tt.events {
				want += "event: ping\ndata: {\"type\":\"ping\"}\n\n"
			}
			if got := fw.Body.String(); got != want {
				t.Errorf("body = %q, want %q", got, want)
			}
			if tt.events > 0 {
				if ct := fw.Header().Get("Content-Type"); ct != "text/event-stream" {
					t.Errorf("Content-Type = %q, want text/event-stream", ct)
				}
				if fw.Code != http.StatusOK {
					t.Errorf("status = %d, want 200", fw.Code)
				}
			}
		})
	}
}

func TestSSEBatchFlushError(t *testing.T) {
	gone := errors.New("broken pipe")
	fw := &flushCounter{ResponseRecorder: httptest.NewRecorder(), flushErr: gone}
	s := NewSSE(fw)
	s.beginBatch()
	if err := s.WriteEvent("message_stop", []byte(`{"type":"message_stop"}`)); err != nil {
		t.Fatalf("WriteEvent inside a batch: %v, want nil (the flush is deferred)", err)
	}
	if err := s.endBatch(); !errors.Is(err, gone) {
		t.Fatalf("endBatch = %v, want the flush error %v", err, gone)
	}
}

// TestSSEStreamFlushesPerUpstreamEvent checks that a Stream made by
// NewSSEStream flushes the events of one upstream event together, and
// those of Finish together, and writes the events a plain Stream writes.
func TestSSEStreamFlushesPerUpstreamEvent(t *testing.T) {
	turn := &Turn{RequestedModel: "claude-opus-4-5"}
	fw := &flushCounter{ResponseRecorder: httptest.NewRecorder()}
	sse := NewSSE(fw)
	s := NewSSEStream(turn, sse, "msg_1")
	rec := &recorder{}
	ref := NewStream(turn, rec, "msg_1")
	step := func(what string, f func(*Stream) error) {
		t.Helper()
		flushes, events := fw.flushes, len(rec.events)
		if err := f(s); err != nil {
			t.Fatalf("%s: %v", what, err)
		}
		if err := f(ref); err != nil {
			t.Fatalf("%s (reference): %v", what, err)
		}
		want := 0
		if len(rec.events) > events {
			want = 1
		}
		if got := fw.flushes - flushes; got != want {
			t.Errorf("%s wrote %d events with %d flushes, want %d", what, len(rec.events)-events, got, want)
		}
	}
	for i, f := range spec16Frames {
		step(fmt.Sprintf("frame %d", i), func(s *Stream) error { _, err := s.Handle([]byte(f)); return err })
	}
	step("Finish", (*Stream).Finish)
	want := strings.Join(rec.events, "\n") + "\n"
	if got := fw.Body.String(); got != want {
		t.Errorf("SSE body = %q, want %q", got, want)
	}
	if !sse.Started() || sse.LastWrite().IsZero() {
		t.Errorf("Started() = %v, LastWrite() = %v after output", sse.Started(), sse.LastWrite())
	}
}

package gateway

import (
	"errors"
	"net/http"
	"net/http/httptest"
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

func TestSSEWriterFlushes(t *testing.T) {
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
			s := newSSEWriter(fw)
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

func TestSSEWriterBatchFlushError(t *testing.T) {
	gone := errors.New("broken pipe")
	fw := &flushCounter{ResponseRecorder: httptest.NewRecorder(), flushErr: gone}
	s := newSSEWriter(fw)
	s.beginBatch()
	if err := s.WriteEvent("message_stop", []byte(`{"type":"message_stop"}`)); err != nil {
		t.Fatalf("WriteEvent inside a batch: %v, want nil (the flush is deferred)", err)
	}
	if err := s.endBatch(); !errors.Is(err, gone) {
		t.Fatalf("endBatch = %v, want the flush error %v", err, gone)
	}
}

package codexsim

import (
	"encoding/json"
	"strings"
	"testing"

	"github.com/coder/websocket"
)

// With RecordFrames, Sockets logs each socket's frames in both directions,
// in one order across sockets, and the close status the client sent.
func TestRecordFrames(t *testing.T) {
	srv, ts := testServer(t, Config{RecordFrames: true})
	c1 := mustDial(t, ts)
	send(t, c1, create("#sim reply one", nil))
	evs1 := readResponse(t, c1)
	c2 := mustDial(t, ts)
	send(t, c2, `{"type":"nope"}`)
	readEvent(t, c2)
	if err := c1.Close(websocket.StatusGoingAway, "pool closed"); err != nil {
		t.Fatalf("close: %v", err)
	}
	_ = c2.CloseNow()
	waitFor(t, func() bool { // the server notices the closes asynchronously
		s := srv.Sockets()
		return len(s) == 2 && s[0].Closed && s[1].Closed
	})

	logs := srv.Sockets()
	if logs[0].ID != 1 || logs[1].ID != 2 || logs[0].Account != testAccount {
		t.Errorf("socket ids %d, %d account %q, want 1, 2 and %q", logs[0].ID, logs[1].ID, logs[0].Account, testAccount)
	}
	sent := logs[0].Sent()
	if len(sent) != 1 || !strings.Contains(string(sent[0]), "#sim reply one") {
		t.Errorf("socket 1 client frames %q, want the one response.create", sent)
	}
	events := logs[0].Events()
	if len(events) != len(evs1) {
		t.Fatalf("socket 1 logged %d events, the client read %d", len(events), len(evs1))
	}
	for i, b := range events {
		var e event
		if err := json.Unmarshal(b, &e); err != nil || e["type"] != evs1[i]["type"] {
			t.Errorf("logged event %d = %s, the client read type %v", i, b, evs1[i]["type"])
		}
	}
	if f := logs[0].Frames; !f[0].FromClient || f[0].Seq != 1 || f[len(f)-1].Seq != uint64(len(f)) {
		t.Errorf("socket 1 frames start %+v and end at seq %d, want the client frame first at seq 1 and %d frames in order", f[0], f[len(f)-1].Seq, len(f))
	}
	if f := logs[1].Frames; len(f) != 2 || f[0].Seq != uint64(len(logs[0].Frames))+1 || !f[0].FromClient || f[1].FromClient {
		t.Errorf("socket 2 frames %+v, want its bad frame then the error, after socket 1's frames", f)
	}
	if logs[0].CloseStatus != websocket.StatusGoingAway || logs[0].CloseReason != "pool closed" {
		t.Errorf("socket 1 close %v %q, want 1001 \"pool closed\"", logs[0].CloseStatus, logs[0].CloseReason)
	}
	if logs[1].CloseStatus != -1 {
		t.Errorf("socket 2 close %v, want -1 (closed without a close frame)", logs[1].CloseStatus)
	}
}

func TestRecordFramesOff(t *testing.T) {
	srv, ts := testServer(t, Config{})
	c := mustDial(t, ts)
	send(t, c, create("#sim reply one", nil))
	readResponse(t, c)
	if s := srv.Sockets(); len(s) != 0 {
		t.Errorf("Sockets() = %d logs without RecordFrames, want none", len(s))
	}
}

// #sim forget completes the response but the socket does not keep it: a
// create continuing it gets previous_response_not_found.
func TestForgetDirective(t *testing.T) {
	srv, ts := testServer(t, Config{})
	c := mustDial(t, ts)
	send(t, c, create("#sim reply kept", nil))
	kept := responseOf(t, last(readResponse(t, c)))["id"].(string)
	send(t, c, create("#sim reply lost\n#sim forget", map[string]any{"previous_response_id": kept}))
	evs := readResponse(t, c)
	if last(evs)["type"] != "response.completed" {
		t.Fatalf("forgetting response ended with %v, want response.completed", last(evs))
	}
	lost := responseOf(t, last(evs))["id"].(string)
	send(t, c, create("#sim reply again", map[string]any{"previous_response_id": lost}))
	if er := errorOf(t, readEvent(t, c)); er["code"] != "previous_response_not_found" {
		t.Errorf("continuing a forgotten response: %v, want previous_response_not_found", er)
	}
	send(t, c, create("#sim reply again", map[string]any{"previous_response_id": kept}))
	if evs := readResponse(t, c); last(evs)["type"] != "response.completed" {
		t.Errorf("continuing the kept response ended with %v, want response.completed", last(evs))
	}
	if st := srv.Stats(); st.PreviousResponseNotFound != 1 || st.ContinuedResponses != 2 {
		t.Errorf("stats previous_response_not_found=%d continued=%d, want 1 and 2", st.PreviousResponseNotFound, st.ContinuedResponses)
	}
}

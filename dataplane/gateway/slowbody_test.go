package gateway

import (
	"bufio"
	"bytes"
	"encoding/json"
	"io"
	"log/slog"
	"net"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"
)

// lockedBuffer is a log sink shared by the server's goroutines.
type lockedBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *lockedBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *lockedBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

// sendSlowly opens a connection to the gateway, sends a POST's headers
// announcing body, then the body: first the head bytes at once, then one
// byte every gap until the server stops reading. It returns the answer
// and whether the server closed the connection after it.
func sendSlowly(t *testing.T, url, body string, head int, gap time.Duration) (*http.Response, []byte, bool) {
	t.Helper()
	c, err := net.Dial("tcp", strings.TrimPrefix(url, "http://"))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(60 * time.Second)) // a bound, not an assertion
	stop := make(chan struct{})
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		if _, err := io.WriteString(c, "POST /v1/messages HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\nContent-Length: "+
			strconv.Itoa(len(body))+"\r\n\r\n"+body[:head]); err != nil {
			return
		}
		for i := head; i < len(body); i++ {
			select {
			case <-stop:
				return
			case <-time.After(gap):
			}
			if _, err := io.WriteString(c, body[i:i+1]); err != nil {
				return
			}
		}
	}()
	defer func() { close(stop); wg.Wait() }()
	br := bufio.NewReader(c)
	resp, err := http.ReadResponse(br, nil)
	if err != nil {
		t.Fatalf("read the answer: %v", err)
	}
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatalf("read the answer's body: %v", err)
	}
	_, err = br.ReadByte()
	return resp, b, err == io.EOF
}

// TestSlowBodyIsCut: a body trickled one byte every 2 s is cut once the
// grace period has passed and answered 408 with an Anthropic error body;
// so is a body that pauses longer than BodyIdle. The log line says why.
func TestSlowBodyIsCut(t *testing.T) {
	var logs lockedBuffer
	e := newUnitEnv(t, unitOptions{mutate: func(c *Config) {
		c.BodyGrace = 500 * time.Millisecond
		c.BodyIdle = 1500 * time.Millisecond
		c.Logger = slog.New(slog.NewTextHandler(&logs, nil))
	}})
	small := MessagesBody(false, "#sim reply never")
	// 8 KB sent at once earn 8 s at 1 KiB/s: only BodyIdle cuts the pause.
	large := MessagesBody(false, "#sim reply never\n"+strings.Repeat("x", 8<<10))
	for _, tt := range []struct {
		name string
		body string
		head int           // bytes sent at once
		gap  time.Duration // then one byte per gap
	}{
		{"trickle", small, 1, 2 * time.Second},
		{"pause", large, len(large) - 10, time.Hour},
	} {
		t.Run(tt.name, func(t *testing.T) {
			resp, b, closed := sendSlowly(t, e.url, tt.body, tt.head, tt.gap)
			if resp.StatusCode != http.StatusRequestTimeout || resp.Header.Get("Content-Type") != "application/json" {
				t.Fatalf("status %d (%s) %s; want 408 application/json", resp.StatusCode, resp.Header.Get("Content-Type"), b)
			}
			var eb ErrorBody
			if err := json.Unmarshal(b, &eb); err != nil || eb.Error.Type != "invalid_request_error" ||
				!strings.Contains(eb.Error.Message, "Request body arrived too slowly") || !strings.Contains(eb.Error.Message, "1024 bytes/s or more after the first 500ms, with no pause over 1.5s") {
				t.Errorf("body %s (%v); want an invalid_request_error saying the body was too slow and what is required", b, err)
			}
			if !closed {
				t.Error("the connection stayed open after the 408; the rest of the body would be read as a request")
			}
		})
	}
	if got := strings.Count(logs.String(), "status=408"); got != 2 {
		t.Errorf("%d log lines with status=408, want 2:\n%s", got, logs.String())
	}
	if !strings.Contains(logs.String(), `err="Request body arrived too slowly`) {
		t.Errorf("the log does not say why:\n%s", logs.String())
	}
	if st := e.sim.Stats(); st.Upgrades != 0 {
		t.Errorf("the emulator saw %d upgrades; a cut request must not reach it", st.Upgrades)
	}
}

// TestBodyDeadlineEndsWithTheBody: the read deadline covers the body only:
// a turn that lasts well past BodyGrace and BodyIdle after its body was
// read is answered in full, and the connection serves the next request.
func TestBodyDeadlineEndsWithTheBody(t *testing.T) {
	e := newUnitEnv(t, unitOptions{mutate: func(c *Config) {
		c.BodyGrace = 100 * time.Millisecond
		c.BodyIdle = 100 * time.Millisecond
	}})
	for i := range 2 { // the second request reuses the connection
		resp := e.post(t, "/v1/messages", MessagesBody(true, "#sim delay 1s\n#sim reply slow but fine"), nil)
		b := ReadAll(t, resp)
		if resp.StatusCode != http.StatusOK || !bytes.Contains(b, []byte("message_stop")) {
			t.Fatalf("request %d: status %d %s; want the whole stream", i, resp.StatusCode, b)
		}
	}
}

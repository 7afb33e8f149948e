package codexsim

import (
	"bufio"
	"encoding/binary"
	"encoding/json"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"go.uber.org/goleak"
)

// rawUpgradeNoRead opens a TCP connection to ts and upgrades it to a WebSocket
// on the ChatGPT path, reading only the 101; nothing else of the socket
// is ever read unless the caller does.
func rawUpgradeNoRead(t *testing.T, addr string) (net.Conn, *bufio.Reader) {
	t.Helper()
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Close() })
	_ = c.SetDeadline(time.Now().Add(60 * time.Second)) // a bound, not an assertion
	req := "GET " + ChatGPTPath + " HTTP/1.1\r\nHost: " + addr + "\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n" +
		"Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n" +
		"Authorization: Bearer " + testToken + "\r\nchatgpt-account-id: " + testAccount + "\r\nOpenAI-Beta: " + BetaHeaderValue + "\r\n\r\n"
	if _, err := io.WriteString(c, req); err != nil {
		t.Fatal(err)
	}
	br := bufio.NewReader(c)
	resp, err := http.ReadResponse(br, nil)
	if err != nil || resp.StatusCode != http.StatusSwitchingProtocols {
		t.Fatalf("upgrade: %v %v", resp, err)
	}
	return c, br
}

// writeTextFrame writes one masked text frame, as a client must; the
// mask key is zero, so the payload goes as it is.
func writeTextFrame(t *testing.T, c net.Conn, payload []byte) {
	t.Helper()
	hdr := []byte{0x81, 0x80 | 127}
	hdr = binary.BigEndian.AppendUint64(hdr, uint64(len(payload)))
	hdr = append(hdr, 0, 0, 0, 0)
	if _, err := c.Write(append(hdr, payload...)); err != nil {
		t.Fatalf("write frame: %v", err)
	}
}

// TestClientThatNeverReads: a 20 MB reply (one word, no spaces) to a
// client that reads nothing after the upgrade fills the socket's buffers;
// the write that then makes no progress ends after WriteTimeout, the
// emulator closes the socket, and every goroutine of the socket and of
// its response ends.
func TestClientThatNeverReads(t *testing.T) {
	srv, ts := testServer(t, Config{WriteTimeout: 500 * time.Millisecond})
	before := goleak.IgnoreCurrent()
	addr := strings.TrimPrefix(ts.URL, "http://")
	c, br := rawUpgradeNoRead(t, addr)
	frame, err := json.Marshal(create("#sim reply "+strings.Repeat("x", 20<<20), nil))
	if err != nil {
		t.Fatal(err)
	}
	writeTextFrame(t, c, frame)

	deadline := time.Now().Add(60 * time.Second) // generous: the emulator must give up on its own
	for {
		st := srv.Stats()
		if st.WriteTimeouts == 1 && st.OpenSockets == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the socket is still open (stats %+v); a client that never reads must be cut", st)
		}
		time.Sleep(10 * time.Millisecond)
	}
	// The emulator's side is gone: what the client has not read drains,
	// then the connection ends.
	n, err := io.Copy(io.Discard, br)
	if ne, ok := err.(net.Error); ok && ne.Timeout() {
		t.Fatalf("the connection is still open after %d bytes", n)
	}
	if n >= 20<<20 {
		t.Errorf("the client got %d bytes; the emulator should have stopped well before the whole reply", n)
	}
	goleak.VerifyNone(t, before)
}

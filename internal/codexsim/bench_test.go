package codexsim

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"net"
	"net/http"
	"net/http/httptest"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/coder/websocket"
)

func benchServer(b *testing.B, cfg Config) (*Server, *httptest.Server) {
	b.Helper()
	cfg.AcceptTokens = map[string]string{testToken: testAccount}
	cfg.UpgradeLimit = 1 << 30
	srv, err := New(cfg)
	if err != nil {
		b.Fatal(err)
	}
	ts := httptest.NewServer(srv.Handler())
	b.Cleanup(func() {
		_ = srv.Close()
		ts.Close()
	})
	return srv, ts
}

// BenchmarkUpgrade measures accepted upgrades per second (dial, handshake,
// close) over loopback.
func BenchmarkUpgrade(b *testing.B) {
	_, ts := benchServer(b, Config{})
	h := goodHeaders(testToken, testAccount)
	ctx := context.Background()
	b.ReportAllocs()
	start := time.Now()
	for b.Loop() {
		c, _, err := websocket.Dial(ctx, wsURL(ts, ChatGPTPath), &websocket.DialOptions{HTTPHeader: h})
		if err != nil {
			b.Fatal(err)
		}
		_ = c.CloseNow()
	}
	b.ReportMetric(float64(b.N)/time.Since(start).Seconds(), "upgrades/s")
}

// BenchmarkStreamEvents measures streamed events per second on one socket:
// each op is one response of a 200-word reply (about 210 events).
func BenchmarkStreamEvents(b *testing.B) {
	_, ts := benchServer(b, Config{})
	ctx := context.Background()
	c, _, err := websocket.Dial(ctx, wsURL(ts, ChatGPTPath), &websocket.DialOptions{HTTPHeader: goodHeaders(testToken, testAccount)})
	if err != nil {
		b.Fatal(err)
	}
	defer func() { _ = c.CloseNow() }()
	c.SetReadLimit(1 << 24)
	frame := fmt.Sprintf(`{"type":"response.create","model":"m","input":[{"role":"user","content":"#sim reply %s"}]}`,
		strings.TrimSpace(strings.Repeat("word ", 200)))
	events := 0
	b.ReportAllocs()
	start := time.Now()
	for b.Loop() {
		if err := c.Write(ctx, websocket.MessageText, []byte(frame)); err != nil {
			b.Fatal(err)
		}
		for {
			_, data, err := c.Read(ctx)
			if err != nil {
				b.Fatal(err)
			}
			events++
			if bytes.Contains(data, []byte(`"type":"response.completed"`)) {
				break
			}
		}
	}
	b.ReportMetric(float64(events)/time.Since(start).Seconds(), "events/s")
	b.ReportMetric(float64(events)/float64(b.N), "events/op")
}

// BenchmarkOpenSocketMemory measures the server's memory per idle open
// socket: heap and goroutine stacks after GC, with raw-TCP clients that hold
// almost nothing, so the figure is the emulator's own cost.
func BenchmarkOpenSocketMemory(b *testing.B) {
	const sockets = 200
	srv, ts := benchServer(b, Config{})
	addr := strings.TrimPrefix(ts.URL, "http://")
	var perSocket float64
	for b.Loop() {
		before := memInUse()
		conns := make([]net.Conn, 0, sockets)
		for range sockets {
			conns = append(conns, rawUpgrade(b, addr))
		}
		for srv.Stats().OpenSockets != sockets {
			time.Sleep(time.Millisecond)
		}
		after := memInUse()
		perSocket = float64(after-before) / sockets
		for _, c := range conns {
			c.Close()
		}
		for srv.Stats().OpenSockets != 0 {
			time.Sleep(time.Millisecond)
		}
	}
	b.ReportMetric(perSocket, "B/socket")
}

func memInUse() int64 {
	runtime.GC()
	var m runtime.MemStats
	runtime.ReadMemStats(&m)
	return int64(m.HeapInuse + m.StackInuse)
}

// rawUpgrade performs a WebSocket handshake over plain TCP and returns the
// connection without any client-side WebSocket state.
func rawUpgrade(b *testing.B, addr string) net.Conn {
	b.Helper()
	c, err := net.Dial("tcp", addr)
	if err != nil {
		b.Fatal(err)
	}
	req := "GET " + ChatGPTPath + " HTTP/1.1\r\nHost: " + addr + "\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n" +
		"Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n" +
		"Authorization: Bearer " + testToken + "\r\nchatgpt-account-id: " + testAccount + "\r\nOpenAI-Beta: " + BetaHeaderValue + "\r\n\r\n"
	if _, err := c.Write([]byte(req)); err != nil {
		b.Fatal(err)
	}
	resp, err := http.ReadResponse(bufio.NewReader(c), nil)
	if err != nil {
		b.Fatal(err)
	}
	if resp.StatusCode != http.StatusSwitchingProtocols {
		b.Fatalf("upgrade status %d", resp.StatusCode)
	}
	return c
}

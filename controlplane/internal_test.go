package controlplane

import (
	"bytes"
	"log/slog"
	"net"
	"strings"
	"testing"

	"github.com/clodex/clodex/controlplane/store"
	"github.com/clodex/clodex/internal/bearer"
)

func testServer(t *testing.T, log *slog.Logger) *Server {
	t.Helper()
	st, _ := store.Open(store.Options{})
	admin, _ := bearer.Parse("admin-secret")
	agent, _ := bearer.Parse("agent-secret")
	s, err := New(Options{Admissions: st, Policies: st, AdminToken: admin, AgentToken: agent, Logger: log})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(s.Stop) // never served: Stop releases its stream workers
	return s
}

func TestPlaintextWarningOnce(t *testing.T) {
	tests := []struct {
		addr net.Addr
		want int
	}{
		{&net.TCPAddr{IP: net.IPv4(127, 0, 0, 1), Port: 1}, 0},
		{&net.TCPAddr{IP: net.IPv6loopback, Port: 1}, 0},
		{&net.UnixAddr{Name: "/tmp/x.sock", Net: "unix"}, 0},
		{&net.TCPAddr{IP: net.IPv4(10, 0, 0, 1), Port: 1}, 1},
		{&net.TCPAddr{IP: net.IPv4zero, Port: 1}, 1},
	}
	for _, tt := range tests {
		var buf bytes.Buffer
		s := testServer(t, slog.New(slog.NewTextHandler(&buf, nil)))
		s.checkPlaintext(tt.addr)
		s.checkPlaintext(tt.addr)
		if got := strings.Count(buf.String(), "without TLS"); got != tt.want {
			t.Errorf("checkPlaintext(%v) logged %d warnings, want %d:\n%s", tt.addr, got, tt.want, buf.String())
		}
		if strings.Contains(buf.String(), "secret") {
			t.Errorf("log leaks a token: %s", buf.String())
		}
	}
}

func TestNewValidates(t *testing.T) {
	st, _ := store.Open(store.Options{})
	same, _ := bearer.Parse("same")
	_, err := New(Options{Admissions: st, Policies: st, AdminToken: same, AgentToken: same})
	if err == nil || !strings.Contains(err.Error(), "must differ") {
		t.Errorf("New(same tokens) = %v, want an error", err)
	}
	_, err = New(Options{})
	for _, want := range []string{"field Admissions is required", "field Policies is required", "field AdminToken is required", "field AgentToken is required"} {
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("New(zero) error = %v, want it to contain %q", err, want)
		}
	}
}

package gateway

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"log"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/clodex/clodex/dataplane/credentials"
	"github.com/clodex/clodex/dataplane/pool"
	"github.com/clodex/clodex/dataplane/retry"
	"github.com/clodex/clodex/dataplane/upstream"
)

// A dial that opens no socket names the upstream and the cause, over real
// sockets: nothing listening, a certificate nobody trusts, a backend that
// never answers the handshake. The failure memory then refuses the next
// dial at once.
func TestPoolDialerNamesWhyNoSocketOpened(t *testing.T) {
	closed, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	refusedAddr := closed.Addr().String()
	closed.Close()

	tlsSrv := httptest.NewUnstartedServer(http.NotFoundHandler())
	tlsSrv.Config.ErrorLog = log.New(io.Discard, "", 0) // the handshake errors are the point
	tlsSrv.StartTLS()
	defer tlsSrv.Close()
	tlsAddr := strings.TrimPrefix(tlsSrv.URL, "https://")

	silent, err := net.Listen("tcp", "127.0.0.1:0") // accepts (the kernel does), never answers
	if err != nil {
		t.Fatal(err)
	}
	defer silent.Close()

	tests := []struct {
		name, url, cause string
		timeout          time.Duration // the dial's bound
	}{
		{"nothing listens", "ws://" + refusedAddr + "/r", "connection refused", time.Minute},
		{"untrusted certificate", "wss://" + tlsAddr + "/r", "TLS certificate not trusted", time.Minute},
		{"no answer", "ws://" + silent.Addr().String() + "/r", "timed out", 300 * time.Millisecond},
	}
	creds := NoRefresh(credentials.Static{AccessToken: "tok", AccountID: "acct"})
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			clock := NewFakeClock()
			health, err := retry.NewHealth(retry.HealthConfig{Clock: clock})
			if err != nil {
				t.Fatal(err)
			}
			d := PoolDialer(upstream.DialOptions{URL: tt.url, DialTimeout: tt.timeout}, creds, health)
			_, err = d.Dial(t.Context(), pool.Partition{})
			var ue *UnreachableError
			if !errors.As(err, &ue) || ue.Cause != tt.cause || ue.Upstream != UpstreamKey(tt.url) {
				t.Fatalf("Dial = %v, want an UnreachableError for %s: %s", err, UpstreamKey(tt.url), tt.cause)
			}
			if st := health.Status(UpstreamKey(tt.url)); !st.Unreachable {
				t.Errorf("health %+v, want the upstream unreachable", st)
			}
			_, err = d.Dial(t.Context(), pool.Partition{})
			var de *retry.DownError
			if !errors.As(err, &de) || !errors.As(err, &ue) {
				t.Errorf("second Dial = %v, want a DownError carrying the cause, without a dial", err)
			}
		})
	}
}

// dialCause names the usual ways a dial fails.
func TestDialCause(t *testing.T) {
	wrap := func(err error) error { return fmt.Errorf("dial upstream wss://x: failed to WebSocket dial: %w", err) }
	tests := []struct {
		err  error
		want string
	}{
		{wrap(&net.OpError{Op: "dial", Err: &net.DNSError{Err: "no such host", Name: "chatgpt.invalid", IsNotFound: true}}), "DNS lookup failed: no such host"},
		{wrap(&net.DNSError{Err: "i/o timeout", IsTimeout: true}), "DNS lookup timed out"},
		{wrap(&net.DNSError{Err: "server misbehaving"}), "DNS lookup failed"},
		{wrap(&net.OpError{Op: "dial", Err: syscall.ECONNREFUSED}), "connection refused"},
		{wrap(&net.OpError{Op: "read", Err: syscall.ECONNRESET}), "connection reset"},
		{wrap(&net.OpError{Op: "dial", Err: syscall.EHOSTUNREACH}), "no route to host"},
		{wrap(x509.UnknownAuthorityError{}), "TLS certificate not trusted"},
		{wrap(x509.HostnameError{Host: "x"}), "TLS certificate not trusted"},
		{wrap(tls.RecordHeaderError{Msg: "first record does not look like a TLS handshake"}), "TLS handshake failed"},
		{wrap(context.DeadlineExceeded), "timed out"},
		{&upstream.UpgradeError{Status: 503}, "the WebSocket upgrade was answered with HTTP 503"},
		{errors.New("something else"), "connection failed"},
	}
	for _, tt := range tests {
		if got := dialCause(tt.err); got != tt.want {
			t.Errorf("dialCause(%v) = %q, want %q", tt.err, got, tt.want)
		}
	}
	if isUnreachable(&upstream.UpgradeError{Status: 403}) || isUnreachable(&upstream.UpgradeError{Status: 401}) || !isUnreachable(&upstream.UpgradeError{Status: 502}) {
		t.Error("isUnreachable: want only upgrade 5xx (and failures without a status)")
	}
}

func TestUpstreamKey(t *testing.T) {
	for in, want := range map[string]string{
		"wss://chatgpt.com/backend-api/codex/responses": "chatgpt.com",
		"ws://127.0.0.1:17800/x":                        "127.0.0.1:17800",
		"":                                              "chatgpt.com",
		"not a url":                                     "not a url",
	} {
		if got := UpstreamKey(in); got != want {
			t.Errorf("UpstreamKey(%q) = %q, want %q", in, got, want)
		}
	}
}

package hostcheck

import (
	"net/http"
	"net/http/httptest"
	"testing"
)

func TestCheck(t *testing.T) {
	loop, err := New("127.0.0.1:1", []string{"http://localhost:3000/"})
	if err != nil {
		t.Fatal(err)
	}
	open, err := New("0.0.0.0:1", nil)
	if err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name   string
		p      *Policy
		host   string
		origin []string // nil: no header
		want   *Refusal
	}{
		{"loopback host", loop, "127.0.0.1:9", nil, nil},
		{"localhost", loop, "LOCALHOST", nil, nil},
		{"ipv6", loop, "[::1]:9", nil, nil},
		{"rebinding name", loop, "attacker.test:17645", nil, &Refusal{"Host", "attacker.test:17645"}},
		{"allowed origin", loop, "localhost", []string{"http://LOCALHOST:3000"}, nil},
		{"foreign origin", loop, "localhost", []string{"https://evil.example"}, &Refusal{"Origin", "https://evil.example"}},
		{"empty origin header", loop, "localhost", []string{""}, &Refusal{"Origin", ""}},
		{"null origin", loop, "localhost", []string{"null"}, &Refusal{"Origin", "null"}},
		{"any host off loopback", open, "clodex.example", nil, nil},
		{"origin off loopback", open, "clodex.example", []string{"https://clodex.example"}, &Refusal{"Origin", "https://clodex.example"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r := httptest.NewRequest(http.MethodGet, "/metrics", nil)
			r.Host = tt.host
			if tt.origin != nil {
				r.Header["Origin"] = tt.origin
			}
			got := tt.p.Check(r)
			if (got == nil) != (tt.want == nil) || (got != nil && *got != *tt.want) {
				t.Errorf("Check = %+v, want %+v", got, tt.want)
			}
		})
	}
	if _, err := New("127.0.0.1:1", []string{"localhost:3000"}); err == nil {
		t.Error("New accepted an origin without a scheme")
	}
}

func TestLoopbackAddr(t *testing.T) {
	for addr, want := range map[string]bool{
		"127.0.0.1:1": true, "[::1]:1": true, "localhost:1": true, "127.1.2.3:1": true,
		"0.0.0.0:1": false, ":1": false, "[::]:1": false, "10.0.0.1:1": false, "example.com:1": false,
	} {
		if got := LoopbackAddr(addr); got != want {
			t.Errorf("LoopbackAddr(%q) = %v, want %v", addr, got, want)
		}
	}
}

package simauth

import (
	"strings"
	"testing"
	"time"
)

func TestNewConfigErrors(t *testing.T) {
	tests := []struct {
		name     string
		cfg      Config
		wantErrs []string // substrings; empty means valid
	}{
		{name: "zero value", cfg: Config{}},
		{name: "short TTLs", cfg: Config{TokenTTL: time.Second, RefreshTTL: time.Second}},
		{name: "negative token TTL", cfg: Config{TokenTTL: -time.Second}, wantErrs: []string{"TokenTTL -1s is invalid; want 0 (default) or at least 1s"}},
		{name: "sub-second refresh TTL", cfg: Config{RefreshTTL: time.Millisecond}, wantErrs: []string{"RefreshTTL 1ms is invalid"}},
		{name: "empty accept token", cfg: Config{Accept: map[string]string{"": "acct"}}, wantErrs: []string{"field Accept has an empty token"}},
		{name: "empty accept account", cfg: Config{Accept: map[string]string{"secret-tok": ""}}, wantErrs: []string{"empty account id"}},
		{name: "bad device account", cfg: Config{DeviceAccountID: "a b"}, wantErrs: []string{"DeviceAccountID"}},
		{
			name:     "every problem at once",
			cfg:      Config{TokenTTL: -1, RefreshTTL: -1, DeviceAccountID: "/"},
			wantErrs: []string{"TokenTTL", "RefreshTTL", "DeviceAccountID"},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			a, err := New(tt.cfg)
			if len(tt.wantErrs) == 0 {
				if err != nil || a == nil {
					t.Fatalf("New = %v, %v; want an Authority", a, err)
				}
				return
			}
			if err == nil {
				t.Fatal("New = nil error, want an error")
			}
			for _, s := range tt.wantErrs {
				if !strings.Contains(err.Error(), s) {
					t.Errorf("error %q does not contain %q", err, s)
				}
			}
			if strings.Contains(err.Error(), "secret-tok") {
				t.Errorf("error %q contains a configured token", err)
			}
		})
	}
}

func TestNewDoesNotMutateConfig(t *testing.T) {
	accept := map[string]string{"tok": "acct"}
	cfg := Config{Accept: accept}
	a, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	accept["tok"] = "changed"
	accept["new"] = "acct-new"
	if got, err := a.Validate("tok"); err != nil || got != "acct" {
		t.Errorf("Validate(tok) after caller changed its map = %q, %v; want acct", got, err)
	}
	if _, err := a.Validate("new"); err == nil {
		t.Error("token added to the caller's map after New was accepted")
	}
	if cfg.TokenTTL != 0 || cfg.Clock != nil || cfg.Logger != nil {
		t.Errorf("New filled defaults into the caller's Config: %+v", cfg)
	}
}

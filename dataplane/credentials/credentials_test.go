package credentials

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/clodex/clodex/internal/codexauth"
)

const tokenMarker = "SECRET-TOKEN-MATERIAL"

// jwt builds an unsigned JWT with the given claims; the signature segment
// carries tokenMarker so tests can check that no error or log leaks it.
func jwt(t *testing.T, claims any) string {
	t.Helper()
	payload, err := json.Marshal(claims)
	if err != nil {
		t.Fatal(err)
	}
	enc := base64.RawURLEncoding.EncodeToString
	return enc([]byte(`{"alg":"RS256","typ":"JWT"}`)) + "." + enc(payload) + "." + tokenMarker
}

func writeFile(t *testing.T, content string) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), "auth.json")
	if err := os.WriteFile(p, []byte(content), 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

func TestLoadFile(t *testing.T) {
	access := jwt(t, map[string]any{"https://api.openai.com/auth": map[string]any{"chatgpt_account_id": "acct-claim"}, "exp": 1900000000})
	p := writeFile(t, `{"auth_mode":"chatgpt","OPENAI_API_KEY":null,"tokens":{"id_token":"x.y.z","access_token":"`+access+`","refresh_token":"rt-`+tokenMarker+`","account_id":"acct-stored"},"last_refresh":"2026-11-01T00:00:00Z"}`)
	src, err := LoadFile(p)
	if err != nil {
		t.Fatalf("LoadFile: %v", err)
	}
	c, err := src.Credential(t.Context())
	if err != nil {
		t.Fatalf("Credential: %v", err)
	}
	if c.AccessToken.Reveal() != access || c.AccountID != "acct-claim" || !c.Expiry.Equal(time.Unix(1900000000, 0)) {
		t.Errorf("codexauth.Credential = account %q expiry %v token match %v; want acct-claim, 1900000000, true", c.AccountID, c.Expiry, c.AccessToken.Reveal() == access)
	}
}

func TestLoadFileFallsBackToStoredAccount(t *testing.T) {
	p := writeFile(t, `{"auth_mode":"chatgpt","tokens":{"access_token":"opaque-`+tokenMarker+`","account_id":"acct-stored"}}`)
	src, err := LoadFile(p)
	if err != nil {
		t.Fatalf("LoadFile: %v", err)
	}
	c, _ := src.Credential(t.Context())
	if c.AccountID != "acct-stored" {
		t.Errorf("AccountID = %q, want acct-stored", c.AccountID)
	}
}

func TestLoadFileErrors(t *testing.T) {
	tests := []struct {
		name    string
		content string
		want    string
	}{
		{"not json", `{"auth_mode":`, "not valid JSON"},
		{"array", `[]`, "wrong type"},
		{"api key mode", `{"auth_mode":"apikey","OPENAI_API_KEY":"sk-` + tokenMarker + `"}`, `auth_mode is "apikey"`},
		{"no tokens", `{"auth_mode":"chatgpt"}`, `no "tokens" object`},
		{"empty access token", `{"auth_mode":"chatgpt","tokens":{"access_token":"","refresh_token":"` + tokenMarker + `"}}`, "tokens.access_token is missing"},
		{"access token wrong type", `{"auth_mode":"chatgpt","tokens":{"access_token":7}}`, "access_token"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			p := writeFile(t, tt.content)
			_, err := LoadFile(p)
			if err == nil {
				t.Fatal("LoadFile: no error")
			}
			msg := err.Error()
			if !strings.Contains(msg, tt.want) || !strings.Contains(msg, p) || strings.Contains(msg, tokenMarker) {
				t.Errorf("LoadFile error = %q; want it to name the file, mention %q, and not leak a token", msg, tt.want)
			}
		})
	}
	t.Run("missing file", func(t *testing.T) {
		p := filepath.Join(t.TempDir(), "nope.json")
		_, err := LoadFile(p)
		if err == nil || !strings.Contains(err.Error(), p) || !strings.Contains(err.Error(), "does not exist") {
			t.Errorf("LoadFile(missing) = %v, want an error naming %s", err, p)
		}
	})
}

func TestStatic(t *testing.T) {
	want := codexauth.Credential{AccessToken: "tok", AccountID: "acct"}
	got, err := Static(want).Credential(t.Context())
	if err != nil || got != want {
		t.Errorf("Static.Credential = %+v, %v; want %+v", got, err, want)
	}
	ctx, cancel := context.WithCancel(t.Context())
	cancel()
	if _, err := Static(want).Credential(ctx); !errors.Is(err, context.Canceled) {
		t.Errorf("Static.Credential(cancelled) = %v, want context.Canceled", err)
	}
}

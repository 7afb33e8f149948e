package codexauth

import (
	"bytes"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"log/slog"
	"strings"
	"testing"
	"time"
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

func TestSecretRedacts(t *testing.T) {
	s := Secret(tokenMarker)
	outputs := []string{
		fmt.Sprint(s), fmt.Sprintf("%s", s), fmt.Sprintf("%v", s), fmt.Sprintf("%+v", s),
		fmt.Sprintf("%#v", s), fmt.Sprintf("%q", s), fmt.Sprintf("%x", s), s.String(),
		fmt.Sprintf("%v", Credential{AccessToken: s, AccountID: "acct"}),
		fmt.Sprintf("%+v", Credential{AccessToken: s, AccountID: "acct"}),
	}
	var buf bytes.Buffer
	logger := slog.New(slog.NewJSONHandler(&buf, nil))
	logger.Info("x", "token", s)
	logger.Info("y", "tokens", AuthTokens{AccessToken: s})
	outputs = append(outputs, buf.String())
	for _, out := range outputs {
		if strings.Contains(out, tokenMarker) {
			t.Errorf("output %q leaks the secret", out)
		}
	}
	if got := s.Reveal(); got != tokenMarker {
		t.Errorf("Reveal() = %q, want %q", got, tokenMarker)
	}
	if !strings.Contains(fmt.Sprint(s), "redacted") {
		t.Errorf("Sprint(secret) = %q, want a redaction marker", fmt.Sprint(s))
	}
}

func TestParseClaims(t *testing.T) {
	tests := []struct {
		name       string
		claims     any
		wantID     string
		wantExpiry time.Time
	}{
		{"top level wins", map[string]any{
			"chatgpt_account_id":          "acct-top",
			"https://api.openai.com/auth": map[string]any{"chatgpt_account_id": "acct-auth"},
			"organizations":               []any{map[string]any{"id": "org-1"}},
			"exp":                         1900000000,
		}, "acct-top", time.Unix(1900000000, 0).UTC()},
		{"auth namespace second", map[string]any{
			"https://api.openai.com/auth": map[string]any{"chatgpt_account_id": "acct-auth"},
			"organizations":               []any{map[string]any{"id": "org-1"}},
		}, "acct-auth", time.Time{}},
		{"organizations third", map[string]any{
			"organizations": []any{map[string]any{"id": "org-1"}, map[string]any{"id": "org-2"}},
		}, "org-1", time.Time{}},
		{"none", map[string]any{"sub": "user"}, "", time.Time{}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c, err := ParseClaims(Secret(jwt(t, tt.claims)))
			if err != nil {
				t.Fatalf("ParseClaims: %v", err)
			}
			if c.AccountID != tt.wantID || !c.Expiry.Equal(tt.wantExpiry) {
				t.Errorf("ParseClaims = %+v, want account %q expiry %v", c, tt.wantID, tt.wantExpiry)
			}
		})
	}
}

func TestParseClaimsBad(t *testing.T) {
	tests := []struct {
		name  string
		token string
		want  string
	}{
		{"opaque", "sk-" + tokenMarker, "not a JWT"},
		{"bad base64", "a.!!!" + tokenMarker + ".c", "base64"},
		{"not json", "a." + base64.RawURLEncoding.EncodeToString([]byte("nope")) + "." + tokenMarker, "JSON"},
		{"wrong type", "a." + base64.RawURLEncoding.EncodeToString([]byte(`{"chatgpt_account_id":5}`)) + "." + tokenMarker, "JSON"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := ParseClaims(Secret(tt.token))
			if err == nil {
				t.Fatal("ParseClaims: no error")
			}
			if !strings.Contains(err.Error(), tt.want) || strings.Contains(err.Error(), tokenMarker) {
				t.Errorf("ParseClaims error = %q, want it to mention %q and not leak the token", err, tt.want)
			}
		})
	}
}

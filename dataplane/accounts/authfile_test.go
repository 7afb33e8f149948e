package accounts

import (
	"encoding/base64"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/clodex/clodex/internal/account"
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

func TestFileCredential(t *testing.T) {
	access := jwt(t, map[string]any{"https://api.openai.com/auth": map[string]any{"chatgpt_account_id": "acct-claim"}, "exp": 1900000000})
	p := writeFile(t, `{"auth_mode":"chatgpt","OPENAI_API_KEY":null,"tokens":{"id_token":"x.y.z","access_token":"`+access+`","refresh_token":"rt-`+tokenMarker+`","account_id":"acct-stored"},"last_refresh":"2026-11-01T00:00:00Z"}`)
	src, err := NewFileSource(FileConfig{Path: p})
	if err != nil {
		t.Fatalf("NewFileSource: %v", err)
	}
	c, err := src.Credential(t.Context())
	if err != nil {
		t.Fatalf("Credential: %v", err)
	}
	if c.AccessToken.Reveal() != access || c.AccountID != "acct-claim" || !c.Expiry.Equal(time.Unix(1900000000, 0)) {
		t.Errorf("codexauth.Credential = account %q expiry %v token match %v; want acct-claim, 1900000000, true", c.AccountID, c.Expiry, c.AccessToken.Reveal() == access)
	}
}

func TestFileFallsBackToStoredAccount(t *testing.T) {
	p := writeFile(t, `{"auth_mode":"chatgpt","tokens":{"access_token":"opaque-`+tokenMarker+`","account_id":"acct-stored"}}`)
	src, err := NewFileSource(FileConfig{Path: p})
	if err != nil {
		t.Fatalf("NewFileSource: %v", err)
	}
	c, _ := src.Credential(t.Context())
	if c.AccountID != "acct-stored" {
		t.Errorf("AccountID = %q, want acct-stored", c.AccountID)
	}
}

func TestFileErrors(t *testing.T) {
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
			_, err := NewFileSource(FileConfig{Path: p})
			if err == nil {
				t.Fatal("NewFileSource: no error")
			}
			msg := err.Error()
			if !strings.Contains(msg, tt.want) || !strings.Contains(msg, p) || strings.Contains(msg, tokenMarker) {
				t.Errorf("NewFileSource error = %q; want it to name the file, mention %q, and not leak a token", msg, tt.want)
			}
		})
	}
	t.Run("missing file", func(t *testing.T) {
		p := filepath.Join(t.TempDir(), "nope.json")
		_, err := NewFileSource(FileConfig{Path: p})
		if err == nil || !strings.Contains(err.Error(), p) || !strings.Contains(err.Error(), "does not exist") {
			t.Errorf("NewFileSource(missing) = %v, want an error naming %s", err, p)
		}
	})
}

// Several auth.json files are served each as its own account, in flag
// order; two files of one account, or a file without an account id among
// several, are refused naming the files.
func TestOpenFiles(t *testing.T) {
	file := func(id string) string {
		return writeFile(t, `{"auth_mode":"chatgpt","tokens":{"access_token":"`+jwt(t, map[string]any{"chatgpt_account_id": id, "exp": 1900000000})+`"}}`)
	}
	a, b := file("acct-a"), file("acct-b")
	fs, err := OpenFiles(t.Context(), []FileConfig{{Path: a}, {Path: b}})
	if err != nil {
		t.Fatalf("OpenFiles: %v", err)
	}
	keys, err := fs.Accounts(t.Context())
	if err != nil || len(keys) != 2 || keys[0] != account.Key("acct-a") || keys[1] != account.Key("acct-b") {
		t.Fatalf("Accounts = %v, %v; want the keys of acct-a and acct-b, in order", keys, err)
	}
	c, err := fs.Credential(t.Context(), keys[1])
	if err != nil || c.AccountID != "acct-b" {
		t.Fatalf("Credential(b) = %v, %v; want acct-b's", c.AccountID, err)
	}
	if _, err := fs.Credential(t.Context(), account.Key("acct-c")); err == nil || !strings.Contains(err.Error(), "not served") {
		t.Errorf("Credential(an account no file holds) = %v; want an error saying so", err)
	}

	dup := file("acct-a")
	if _, err := OpenFiles(t.Context(), []FileConfig{{Path: a}, {Path: dup}}); err == nil || !strings.Contains(err.Error(), a) || !strings.Contains(err.Error(), dup) || !strings.Contains(err.Error(), "same account") {
		t.Errorf("OpenFiles(the same account twice) = %v; want an error naming both files", err)
	}
	anon := writeFile(t, `{"auth_mode":"chatgpt","tokens":{"access_token":"opaque-`+tokenMarker+`"}}`)
	if _, err := OpenFiles(t.Context(), []FileConfig{{Path: a}, {Path: anon}}); err == nil || !strings.Contains(err.Error(), anon) || !strings.Contains(err.Error(), "no account id") {
		t.Errorf("OpenFiles(a file without an account id among several) = %v; want an error naming it", err)
	}
	if fs, err := OpenFiles(t.Context(), []FileConfig{{Path: anon}}); err != nil {
		t.Errorf("OpenFiles(one file without an account id) = %v; want it served", err)
	} else if keys, _ := fs.Accounts(t.Context()); len(keys) != 1 || keys[0] != account.Key("") {
		t.Errorf("Accounts = %v; want the one key of the unnamed account", keys)
	}
}

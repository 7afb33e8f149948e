package codexauth

import (
	"encoding/base64"
	"strings"
	"testing"
)

// FuzzParseAuthFile reads arbitrary auth.json documents: a document is
// accepted with a usable credential or refused with an error naming the
// file, never a crash; the error never carries a token (the seeds' tokens
// hold the marker SECRETMARK, which the fuzzer keeps in most inputs).
func FuzzParseAuthFile(f *testing.F) {
	jwt := func(payload string) string {
		enc := base64.RawURLEncoding.EncodeToString
		return enc([]byte(`{"alg":"RS256"}`)) + "." + enc([]byte(payload)) + ".SECRETMARKsig"
	}
	f.Add([]byte(`{"auth_mode":"chatgpt","OPENAI_API_KEY":null,"tokens":{"id_token":"` + jwt(`{"email":"a@b"}`) +
		`","access_token":"` + jwt(`{"exp":1893456000,"https://api.openai.com/auth":{"chatgpt_account_id":"acct-SECRETMARK"}}`) +
		`","refresh_token":"rt-SECRETMARK","account_id":"acct-1"},"last_refresh":"2026-11-30T00:00:00Z"}`))
	f.Add([]byte(`{"tokens":{"access_token":"` + jwt(`{"chatgpt_account_id":"a","exp":1e400}`) + `"}}`))
	f.Add([]byte(`{"tokens":{"access_token":"` + jwt(`{"organizations":[{"id":"org"}],"exp":"soon"}`) + `"}}`))
	f.Add([]byte(`{"tokens":{"access_token":"opaque-SECRETMARK"}}`))
	f.Add([]byte(`{"auth_mode":"apikey","OPENAI_API_KEY":"sk-SECRETMARK"}`))
	f.Add([]byte(`{"tokens":{"access_token":5}}`))
	f.Add([]byte(`{"tokens":null}`))
	f.Add([]byte(`[`))
	f.Fuzz(func(t *testing.T, data []byte) {
		af, err := ParseAuthFile("auth.json", data)
		if err != nil {
			msg := err.Error()
			if !strings.HasPrefix(msg, "codex auth file auth.json: ") {
				t.Fatalf("error %q does not name the file", msg)
			}
			if strings.Contains(msg, "SECRETMARK") {
				t.Fatalf("error %q carries a token", msg)
			}
			return
		}
		c := af.Credential()
		if strings.TrimSpace(c.AccessToken.Reveal()) == "" {
			t.Fatal("accepted an auth.json without an access token")
		}
		if _, err := ParseClaims(c.AccessToken); err != nil && strings.Contains(err.Error(), "SECRETMARK") {
			t.Fatalf("ParseClaims error %q carries the token", err)
		}
	})
}

package simauth

import (
	"encoding/json"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestWriteAuthFile(t *testing.T) {
	e := newEnv(t, Config{})
	dir := filepath.Join(t.TempDir(), "codex-home", "nested")
	path := filepath.Join(dir, "auth.json")
	if err := e.a.WriteAuthFile(path, "acct-file"); err != nil {
		t.Fatalf("WriteAuthFile: %v", err)
	}

	st, err := os.Stat(path)
	if err != nil {
		t.Fatal(err)
	}
	if got := st.Mode().Perm(); got != 0o600 {
		t.Errorf("file mode = %o, want 600", got)
	}
	for _, d := range []string{dir, filepath.Dir(dir)} {
		st, err := os.Stat(d)
		if err != nil {
			t.Fatal(err)
		}
		if got := st.Mode().Perm(); got != 0o700 {
			t.Errorf("created directory %s mode = %o, want 700", d, got)
		}
	}
	assertOnlyFile(t, dir, "auth.json")

	raw, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var top map[string]json.RawMessage
	if err := json.Unmarshal(raw, &top); err != nil {
		t.Fatalf("auth.json is not JSON: %v", err)
	}
	if got := string(top["OPENAI_API_KEY"]); got != "null" {
		t.Errorf("OPENAI_API_KEY = %s, want null", got)
	}
	var f struct {
		AuthMode string `json:"auth_mode"`
		Tokens   struct {
			IDToken      string `json:"id_token"`
			AccessToken  string `json:"access_token"`
			RefreshToken string `json:"refresh_token"`
			AccountID    string `json:"account_id"`
		} `json:"tokens"`
		LastRefresh string `json:"last_refresh"`
	}
	if err := json.Unmarshal(raw, &f); err != nil {
		t.Fatal(err)
	}
	if f.AuthMode != "chatgpt" {
		t.Errorf("auth_mode = %q, want chatgpt", f.AuthMode)
	}
	if f.Tokens.AccountID != "acct-file" {
		t.Errorf("tokens.account_id = %q, want acct-file", f.Tokens.AccountID)
	}
	if f.LastRefresh != "2026-11-30T12:00:00Z" {
		t.Errorf("last_refresh = %q, want the clock's time 2026-11-30T12:00:00Z", f.LastRefresh)
	}
	if acct, err := e.a.Validate(f.Tokens.AccessToken); err != nil || acct != "acct-file" {
		t.Errorf("Validate(access_token) = %q, %v; want acct-file", acct, err)
	}
	idc := jwtPart(t, f.Tokens.IDToken, 1)
	if auth, _ := idc["https://api.openai.com/auth"].(map[string]any); auth["chatgpt_account_id"] != "acct-file" {
		t.Errorf("id_token auth claim = %v, want account acct-file", idc["https://api.openai.com/auth"])
	}
	if r := e.refresh(t, f.Tokens.RefreshToken); r.status != http.StatusOK {
		t.Errorf("refresh with the file's token: status %d; body %s", r.status, r.raw)
	}
}

func TestWriteAuthFileReplacesExisting(t *testing.T) {
	a, err := New(Config{})
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	path := filepath.Join(dir, "auth.json")
	if err := os.WriteFile(path, []byte(`{"old":true}`), 0o644); err != nil {
		t.Fatal(err)
	}
	// A reader holding the old file keeps seeing the old content: the new
	// file is renamed over it, not rewritten in place.
	old, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer old.Close()

	if err := a.WriteAuthFile(path, "acct-new"); err != nil {
		t.Fatalf("WriteAuthFile: %v", err)
	}
	st, err := os.Stat(path)
	if err != nil {
		t.Fatal(err)
	}
	if got := st.Mode().Perm(); got != 0o600 {
		t.Errorf("mode after replacing a 0644 file = %o, want 600", got)
	}
	b := make([]byte, 64)
	n, _ := old.Read(b)
	if got := string(b[:n]); got != `{"old":true}` {
		t.Errorf("old handle reads %q, want the old content (atomic rename)", got)
	}
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(data), `"account_id": "acct-new"`) {
		t.Errorf("new file lacks account acct-new:\n%s", data)
	}
	assertOnlyFile(t, dir, "auth.json")
}

func TestWriteAuthFileErrors(t *testing.T) {
	a, err := New(Config{})
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	blocker := filepath.Join(dir, "file")
	if err := os.WriteFile(blocker, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name, path, account, wantInErr string
	}{
		{"parent is a file", filepath.Join(blocker, "auth.json"), "acct-x", "create directory"},
		{"path is a directory", dir, "acct-x", "rename "},
		{"bad account", filepath.Join(dir, "auth.json"), "bad account", "account id"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := a.WriteAuthFile(tt.path, tt.account)
			if err == nil || !strings.Contains(err.Error(), tt.wantInErr) {
				t.Fatalf("WriteAuthFile = %v, want an error containing %q", err, tt.wantInErr)
			}
			if !strings.HasPrefix(err.Error(), "write auth file: ") {
				t.Errorf("error %q does not name the operation", err)
			}
		})
	}
	// Failed writes leave no temporary files behind.
	assertOnlyFile(t, dir, "file")
}

// assertOnlyFile checks that dir holds exactly the named entry.
func assertOnlyFile(t *testing.T, dir, name string) {
	t.Helper()
	ents, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, e := range ents {
		names = append(names, e.Name())
	}
	if len(names) != 1 || names[0] != name {
		t.Errorf("directory holds %v, want only %s", names, name)
	}
}

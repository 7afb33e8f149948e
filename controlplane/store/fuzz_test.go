package store

import (
	"os"
	"path/filepath"
	"testing"
)

// FuzzLoadPolicyFile: any file content either loads into policies that
// validate, or is an error; nothing panics.
func FuzzLoadPolicyFile(f *testing.F) {
	f.Add(`{"format":1,"version":1,"accounts":{"acct_0123456789abcdef":{"version":1,"rate_per_minute":60,"burst":10,"idle_timeout_ms":120000,"total_timeout_ms":600000,"max_retries":5}}}`)
	f.Add(`{"format":1,"version":0,"accounts":{}}`)
	f.Add(`{"format":1,"version":3,"accounts":{"k":{"version":2,"rate_per_minute":0,"burst":1,"idle_timeout_ms":10000,"total_timeout_ms":10000,"max_retries":0}}}`)
	f.Add(`{"format":1,"accounts":null}`)
	f.Add(`[]`)
	dir := f.TempDir()
	f.Fuzz(func(t *testing.T, content string) {
		path := filepath.Join(dir, PolicyFile)
		if err := os.WriteFile(path, []byte(content), 0o600); err != nil {
			t.Fatal(err)
		}
		pf, err := parsePolicyFile(path, []byte(content))
		if err != nil {
			return
		}
		for key, sp := range pf.Accounts {
			if err := ValidateKey(key); err != nil {
				t.Errorf("loaded a bad key %q: %v", key, err)
			}
			p := sp.policy()
			if err := p.Validate(); err != nil {
				t.Errorf("loaded an invalid policy for %s: %v", key, err)
			}
			if p.Budget.IdleTimeout.Milliseconds() != sp.IdleTimeoutMs || p.Budget.MaxRetries != sp.MaxRetries {
				t.Errorf("loaded %+v as %+v: the budget was adjusted", sp, p.Budget)
			}
			if sp.Version < 1 || sp.Version > pf.Version {
				t.Errorf("loaded version %d outside 1..%d", sp.Version, pf.Version)
			}
		}
	})
}

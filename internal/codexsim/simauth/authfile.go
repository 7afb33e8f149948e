package simauth

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"time"
)

// authFile is Codex CLI's auth.json in ChatGPT sign-in mode.
type authFile struct {
	AuthMode     string         `json:"auth_mode"`
	OpenAIAPIKey *string        `json:"OPENAI_API_KEY"`
	Tokens       authFileTokens `json:"tokens"`
	LastRefresh  string         `json:"last_refresh"`
}

type authFileTokens struct {
	IDToken      string `json:"id_token"`
	AccessToken  string `json:"access_token"`
	RefreshToken string `json:"refresh_token"`
	AccountID    string `json:"account_id"`
}

// WriteAuthFile issues a new token family for accountID and writes it to
// path as a Codex CLI auth.json (auth_mode "chatgpt", OPENAI_API_KEY null,
// last_refresh now). Missing parent directories are created with mode 0700;
// the file is written to a temporary file in the same directory with mode
// 0600, synced and renamed over path, so readers never see a partial file.
func (a *Authority) WriteAuthFile(path, accountID string) error {
	t, err := a.Issue(accountID)
	if err != nil {
		return fmt.Errorf("write auth file: %w", err)
	}
	data, err := json.MarshalIndent(authFile{
		AuthMode: "chatgpt",
		Tokens: authFileTokens{
			IDToken:      t.IDToken,
			AccessToken:  t.AccessToken,
			RefreshToken: t.RefreshToken,
			AccountID:    t.AccountID,
		},
		LastRefresh: a.clock().UTC().Format(time.RFC3339),
	}, "", "  ")
	if err != nil {
		return fmt.Errorf("write auth file: encode: %w", err)
	}
	if err := writeFileAtomic(path, append(data, '\n')); err != nil {
		return fmt.Errorf("write auth file: %w", err)
	}
	a.logger.Info("auth file written", "path", path, "account_id", accountID)
	return nil
}

// writeFileAtomic replaces path with data, mode 0600.
func writeFileAtomic(path string, data []byte) (err error) {
	dir := filepath.Dir(path)
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return fmt.Errorf("create directory: %w", err)
	}
	f, err := os.CreateTemp(dir, "."+filepath.Base(path)+".tmp-*")
	if err != nil {
		return fmt.Errorf("create temporary file: %w", err)
	}
	tmp := f.Name()
	defer func() {
		if err != nil {
			_ = f.Close()
			_ = os.Remove(tmp)
		}
	}()
	if err := f.Chmod(0o600); err != nil {
		return fmt.Errorf("chmod temporary file: %w", err)
	}
	if _, err := f.Write(data); err != nil {
		return fmt.Errorf("write temporary file: %w", err)
	}
	if err := f.Sync(); err != nil {
		return fmt.Errorf("sync temporary file: %w", err)
	}
	if err := f.Close(); err != nil {
		return fmt.Errorf("close temporary file: %w", err)
	}
	if err := os.Rename(tmp, path); err != nil {
		return fmt.Errorf("rename into place: %w", err)
	}
	if d, err := os.Open(dir); err == nil {
		_ = d.Sync() // make the rename durable; best effort
		_ = d.Close()
	}
	return nil
}

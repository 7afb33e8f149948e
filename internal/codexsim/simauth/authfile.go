package simauth

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"time"

	"github.com/clodex/clodex/internal/atomicfile"
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
// the file is replaced atomically (see atomicfile.WriteFile) with mode
// 0600, so readers never see a partial file.
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
	if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
		return fmt.Errorf("write auth file: create directory: %w", err)
	}
	if err := atomicfile.WriteFile(path, append(data, '\n'), 0o600); err != nil {
		return fmt.Errorf("write auth file: %w", err)
	}
	a.logger.Info("auth file written", "path", path, "account_id", accountID)
	return nil
}

package upstream

import (
	"log/slog"
	"strings"
	"testing"

	"github.com/clodex/clodex/internal/account"
	"github.com/clodex/clodex/internal/codexauth"
)

// The debug line of a new socket names the account by its key, never by
// the raw ChatGPT account id.
func TestDialLogsTheAccountKey(t *testing.T) {
	_, ts := newEchoServer(t, func([]byte) [][]byte { return nil })
	var logs strings.Builder
	const raw = "0f5e1c2a-raw-chatgpt-account-id"
	conn, err := Dial(t.Context(), DialOptions{
		URL:        wsURL(ts),
		Credential: codexauth.Credential{AccessToken: "tok", AccountID: raw},
		Logger:     slog.New(slog.NewTextHandler(&logs, &slog.HandlerOptions{Level: slog.LevelDebug})),
	})
	if err != nil {
		t.Fatalf("Dial: %v", err)
	}
	_ = conn.CloseNow()
	out := logs.String()
	if !strings.Contains(out, "upstream socket open") || !strings.Contains(out, "account="+account.Key(raw)) || strings.Contains(out, raw) {
		t.Errorf("debug log of a new socket:\n%s\nwant account=%s and no raw account id", out, account.Key(raw))
	}
}

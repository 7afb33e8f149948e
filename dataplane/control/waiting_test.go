package control_test

import (
	"context"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/clodex/clodex/controlplane/controlplanetest"
	"github.com/clodex/clodex/dataplane/control"
	"github.com/clodex/clodex/internal/account"
)

// While the broker does not answer, a data plane holding a valid token
// says its turns go on with it, not that turns are answered 503: they are
// not, until the token expires.
func TestBrokerAwayWithATokenHeld(t *testing.T) {
	i := startIdP(t)
	cp := controlplanetest.Start(t, &controlplanetest.Options{Broker: true, TokenEndpoint: i.endpoint})
	i.login(t, adminClient(cp), "acct-a")
	var logs syncBuffer
	clk := newFakeClock()
	c := newClient(t, control.Config{Target: cp.Addr, Token: cp.AgentToken, Broker: true,
		Logger: slog.New(slog.NewTextHandler(&logs, nil))}, clk, &noticeLog{})
	key := account.Key("acct-a")
	held, err := c.Credential(t.Context(), key)
	if err != nil {
		t.Fatal(err)
	}
	runClient(t, c, nil)

	cp.Kill()
	clk.Advance(31 * time.Second) // the next poll of the broker's accounts is due
	deadline := time.Now().Add(waitTimeout)
	for !strings.Contains(logs.String(), "credential broker does not answer") {
		if time.Now().After(deadline) {
			t.Fatalf("no line about the broker being away:\n%s", logs.String())
		}
		time.Sleep(20 * time.Millisecond)
	}
	out := logs.String()
	if strings.Contains(out, "turns are answered 503 with retry-after until") || !strings.Contains(out, "turns go on with the access tokens this data plane holds") ||
		!strings.Contains(out, "tokens_held=1") || !strings.Contains(out, "first_expiry="+held.Expiry.UTC().Format(time.RFC3339)) {
		t.Errorf("the log while the broker is away, a valid token held:\n%s\nwant it to say turns go on with the held token (1, expiring %v), not that they are answered 503", out, held.Expiry)
	}
	ctx, cancel := context.WithTimeout(t.Context(), 5*time.Second)
	defer cancel()
	if got, err := c.Credential(ctx, key); err != nil || got.AccessToken != held.AccessToken {
		t.Errorf("Credential while the broker is away = %v; want the held token", err)
	}
}

// syncBuffer is a strings.Builder safe for the client's concurrent logging.
type syncBuffer struct {
	mu  sync.Mutex
	buf strings.Builder
}

func (b *syncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *syncBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

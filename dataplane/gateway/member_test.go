package gateway

import (
	"bytes"
	"context"
	"crypto/sha256"
	"log/slog"
	"net/http"
	"strings"
	"sync"
	"testing"

	"github.com/clodex/clodex/dataplane/accounts"
	"github.com/clodex/clodex/dataplane/pool"
	"github.com/clodex/clodex/internal/account"
	"github.com/clodex/clodex/internal/codexauth"
)

// seenRouter records the member and the requested account of every turn
// it routes.
type seenRouter struct {
	Router
	mu      sync.Mutex
	members []string
	asked   []string
}

func (r *seenRouter) Route(ctx context.Context, h accounts.Heads, part pool.Partition, items [][]byte) (string, error) {
	r.mu.Lock()
	r.members = append(r.members, memberOf(ctx))
	r.asked = append(r.asked, accounts.AccountFrom(ctx))
	r.mu.Unlock()
	return r.Router.Route(ctx, h, part, items)
}

func (r *seenRouter) Rejected(ctx context.Context, key string, tok codexauth.Secret) (codexauth.Credential, error) {
	return r.Router.Rejected(ctx, key, tok)
}

// With member keys the gateway serves only a key of the pushed list, on
// x-api-key or Authorization: Bearer, and the turn's member is the key's
// (memberOf); a missing, unknown or removed key is a 401
// authentication_error with x-should-retry: false, and before the list
// arrived a 503 to retry. X-Clodex-Account reaches the router as the
// account key asked for. No key reaches the log.
func TestMemberKeys(t *testing.T) {
	ms := accounts.NewMembers()
	var rr *seenRouter
	var logs syncBuf
	e := newUnitEnv(t, unitOptions{mutate: func(c *Config) {
		c.Members = ms
		rr = &seenRouter{Router: c.Router}
		c.Router = rr
		c.Logger = slog.New(slog.NewTextHandler(&logs, nil))
	}})
	body := MessagesBody(false, "#sim reply hi")
	const aliceKey, bobKey = "clx_alice-secret-key", "clx_bob-secret-key"

	resp := e.post(t, "/v1/messages", body, map[string]string{"X-Api-Key": aliceKey})
	if eb := ReadError(t, resp); resp.StatusCode != http.StatusServiceUnavailable || resp.Header.Get("X-Should-Retry") != "true" ||
		resp.Header.Get("Retry-After") == "" || !strings.Contains(eb.Error.Message, "has not received the member list") {
		t.Errorf("before the member list = %d %+v (retry-after %q); want 503 to retry", resp.StatusCode, eb.Error, resp.Header.Get("Retry-After"))
	}

	ms.Set([]accounts.MemberKey{
		{Member: accounts.Member{Name: "alice"}, Digest: sha256.Sum256([]byte(aliceKey))},
		{Member: accounts.Member{Name: "bob"}, Digest: sha256.Sum256([]byte(bobKey))},
	})
	for _, hdr := range []map[string]string{
		{"X-Api-Key": aliceKey},
		{"Authorization": "Bearer " + bobKey, accounts.HeaderAccount: simAccount},
	} {
		if resp := e.post(t, "/v1/messages", body, hdr); resp.StatusCode != http.StatusOK {
			t.Fatalf("a member's turn (%v) = %d %s", hdr, resp.StatusCode, ReadAll(t, resp))
		} else {
			ReadAll(t, resp)
		}
	}
	rr.mu.Lock()
	members, asked := rr.members, rr.asked
	rr.mu.Unlock()
	if len(members) != 2 || members[0] != "alice" || members[1] != "bob" || asked[0] != "" || asked[1] != account.Key(simAccount) {
		t.Errorf("routed members %q, accounts asked %q; want alice then bob asking for the account's key", members, asked)
	}

	for _, tt := range []struct {
		name string
		hdr  map[string]string
		msg  string
	}{
		{"no key", nil, "this data plane serves member keys: send your member key"},
		{"unknown key", map[string]string{"X-Api-Key": "clx_guessed"}, "invalid member key: it is not the key of a member of this team"},
		{"bearer of an unknown key", map[string]string{"Authorization": "Bearer " + aliceKey + "x"}, "invalid member key"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			resp := e.post(t, "/v1/messages", body, tt.hdr)
			eb := ReadError(t, resp)
			if resp.StatusCode != http.StatusUnauthorized || eb.Error.Type != "authentication_error" || !strings.Contains(eb.Error.Message, tt.msg) ||
				resp.Header.Get("X-Should-Retry") != "false" || resp.Header.Get("Retry-After") != "" {
				t.Errorf("= %d %+v (x-should-retry %q); want 401 authentication_error %q, x-should-retry false", resp.StatusCode, eb.Error, resp.Header.Get("X-Should-Retry"), tt.msg)
			}
		})
	}
	// An account the data plane does not serve: 403, not worth a retry.
	resp = e.post(t, "/v1/messages", body, map[string]string{"X-Api-Key": aliceKey, accounts.HeaderAccount: "acct_0000000000000001"})
	if eb := ReadError(t, resp); resp.StatusCode != http.StatusForbidden || eb.Error.Type != "permission_error" ||
		!strings.Contains(eb.Error.Message, "Account acct_0000000000000001, which this request asks for (X-Clodex-Account), is not served by this data plane") ||
		resp.Header.Get("X-Should-Retry") != "false" {
		t.Errorf("asking for an account not served = %d %+v (x-should-retry %q); want 403 permission_error naming it, x-should-retry false",
			resp.StatusCode, eb.Error, resp.Header.Get("X-Should-Retry"))
	}
	// Removed: the next push leaves alice out.
	ms.Set([]accounts.MemberKey{{Member: accounts.Member{Name: "bob"}, Digest: sha256.Sum256([]byte(bobKey))}})
	if resp := e.post(t, "/v1/models", "", map[string]string{"X-Api-Key": aliceKey}); resp.StatusCode != http.StatusUnauthorized {
		t.Errorf("alice's key after her removal = %d, want 401", resp.StatusCode)
	}
	if out := logs.String(); strings.Contains(out, "secret-key") || !strings.Contains(out, "member=alice") || !strings.Contains(out, "unknown member key") {
		t.Errorf("log: want the member named and the refusal said, and no key:\n%s", out)
	}
}

type syncBuf struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuf) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuf) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

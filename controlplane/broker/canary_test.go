package broker_test

import (
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/clodex/clodex/controlplane/broker"
	"github.com/clodex/clodex/controlplane/store/redisstore"
	"github.com/clodex/clodex/controlplane/store/redistest"
	"github.com/clodex/clodex/internal/account"
)

// A replica started with another credential key is refused, naming the
// key file, on the data dir and over Redis; the right key passes, and the
// canary outlives a store that lost its data (the replicas put it back).
func TestKeyCanaryRefusesAnotherKey(t *testing.T) {
	rs := redistest.Start(t)
	r, err := redisstore.Open(t.Context(), redisstore.Options{URL: rs.URL, Prefix: "canary:", Timeout: 2 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	for name, cs := range map[string]broker.CanaryStore{"data dir": openLogins(t, t.TempDir()), "redis": r} {
		right, wrong := newKey(t), newKey(t)
		if err := broker.CheckKey(t.Context(), cs, wrong, "/etc/clodex/credential.key", true); err != nil {
			t.Errorf("%s: read-only check of a store without a canary = %v; want nil (nothing to compare)", name, err)
		}
		if err := broker.CheckKey(t.Context(), cs, right, "/etc/clodex/credential.key", false); err != nil {
			t.Fatalf("%s: first check = %v", name, err)
		}
		if err := broker.CheckKey(t.Context(), cs, right, "/etc/clodex/credential.key", false); err != nil {
			t.Errorf("%s: the same key again = %v", name, err)
		}
		err := broker.CheckKey(t.Context(), cs, wrong, "/etc/clodex/other.key", false)
		if !errors.Is(err, broker.ErrWrongKey) || !strings.Contains(err.Error(), "/etc/clodex/other.key") || !strings.Contains(err.Error(), cs.KeyCanaryPlace()) {
			t.Errorf("%s: another key = %v; want ErrWrongKey naming the key file and the canary", name, err)
		}
	}
}

// Rotating the key re-seals every sign-in without a refresh: the new key
// opens them and hands out the same tokens, the old key is refused, and
// the identity provider saw no refresh.
func TestRotateKeyResealsWithoutRefresh(t *testing.T) {
	p := startIDP(t, time.Hour)
	dir := t.TempDir()
	logins := openLogins(t, dir)
	oldKey, newKeyV := newKey(t), newKey(t)
	b := newBroker(t, p, logins, oldKey)
	if err := broker.CheckKey(t.Context(), logins, oldKey, "old.key", false); err != nil {
		t.Fatal(err)
	}
	issued := importIssued(t, b, p, "acct-a")
	importIssued(t, b, p, "acct-b")
	n, err := broker.RotateKey(t.Context(), logins, oldKey, newKeyV, "old.key")
	if err != nil || n != 2 {
		t.Fatalf("RotateKey = %d, %v; want 2 sign-ins re-sealed", n, err)
	}
	if n, err := broker.RotateKey(t.Context(), logins, oldKey, newKeyV, "old.key"); err != nil || n != 0 {
		t.Errorf("RotateKey again = %d, %v; want nothing left to re-seal", n, err)
	}
	if err := broker.CheckKey(t.Context(), logins, oldKey, "old.key", false); !errors.Is(err, broker.ErrWrongKey) {
		t.Errorf("the old key after the rotation = %v; want ErrWrongKey", err)
	}
	nb := newBroker(t, p, logins, newKeyV)
	tok, err := nb.Token(t.Context(), account.Key("acct-a"), "")
	if err != nil || tok.Access.Reveal() != issued.AccessToken {
		t.Errorf("Token under the new key = %v; want the same access token as before", err)
	}
	if st := p.a.Stats(); st.TokenRefreshes != 0 {
		t.Errorf("identity provider saw %d refreshes; want none", st.TokenRefreshes)
	}
}

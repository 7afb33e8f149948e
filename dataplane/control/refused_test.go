package control_test

import (
	"context"
	"crypto/sha256"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/clodex/clodex/controlplane/controlplanetest"
	"github.com/clodex/clodex/dataplane/control"
	"github.com/clodex/clodex/internal/account"
	controlplanev1 "github.com/clodex/clodex/proto/gen/go/clodex/controlplane/v1"
)

// Accepted tells a starting data plane apart its three cases: the token
// accepted, refused, or the control plane not reached at all.
func TestAcceptedAnswers(t *testing.T) {
	srv := controlplanetest.Start(t, nil)
	clk := newFakeClock()
	for _, tt := range []struct {
		name   string
		target string
		token  string
		check  func(error) bool
		want   string
	}{
		{"the fleet's token", srv.Addr, srv.AgentToken.Reveal(), func(err error) bool { return err == nil }, "nil"},
		{"a wrong token", srv.Addr, "not-the-agent-token", func(err error) bool {
			var r *control.AgentRefusedError
			return errors.As(err, &r) && !r.Revoked && r.Target == srv.Addr
		}, "an *AgentRefusedError"},
		{"nothing listening", closedAddr(t), "any-token", func(err error) bool {
			var r *control.AgentRefusedError
			return err != nil && !errors.As(err, &r) && strings.Contains(err.Error(), "cannot be reached: Unavailable")
		}, "cannot be reached"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			rec := newRecorder()
			c := run(t, control.Config{Target: tt.target, Token: tok(t, tt.token), AgentID: "a-1", Clock: clk.Now, Logger: rec.logger()}, rec)
			ctx, cancel := context.WithTimeout(t.Context(), waitTimeout)
			defer cancel()
			if err := c.Accepted(ctx); !tt.check(err) {
				t.Errorf("Accepted = %v, want %s", err, tt.want)
			}
		})
	}
}

// A credential revoked while the client runs refuses it at once: Admit
// and the broker's tokens answer the revocation, naming the credential;
// the client serves again once the control plane accepts its token again
// (the credential created anew with the same token).
func TestRevocationRefusesTheClient(t *testing.T) {
	srv := controlplanetest.Start(t, &controlplanetest.Options{Broker: true})
	key := account.Key("acct-a")
	scoped := tok(t, "scoped-token-of-dp-1")
	sum := sha256.Sum256([]byte(scoped.Reveal()))
	admin := adminClient(srv)
	// A scoped credential needs the broker to hold a sign-in for its
	// accounts.
	startIdP(t).login(t, admin, "acct-a")
	create := func() {
		if _, err := admin.CreateAgentCredential(t.Context(), &controlplanev1.CreateAgentCredentialRequest{Name: "dp-1", Accounts: []string{key}, TokenSha256: sum[:]}); err != nil {
			t.Fatal(err)
		}
	}
	create()
	clk := newFakeClock()
	rec := newRecorder()
	var notes noticeLog
	c := run(t, control.Config{Target: srv.Addr, Token: scoped, AgentID: "dp-1-host", Accounts: []string{key}, Broker: true,
		Clock: clk.Now, Logger: rec.logger(), Notify: notes.Notify}, rec)
	ctx, cancel := context.WithTimeout(t.Context(), waitTimeout)
	defer cancel()
	if err := c.Accepted(ctx); err != nil {
		t.Fatalf("Accepted = %v, want nil", err)
	}
	if err := c.Refused(); err != nil {
		t.Fatalf("Refused() = %v before the revocation", err)
	}

	removed := time.Now()
	if _, err := admin.RemoveAgentCredential(t.Context(), &controlplanev1.RemoveAgentCredentialRequest{Name: "dp-1"}); err != nil {
		t.Fatal(err)
	}
	eventually(t, "the client refused", func() bool { return c.Refused() != nil })
	t.Logf("the client was refused %v after the removal was sent", time.Since(removed).Round(time.Millisecond))
	var refused *control.AgentRefusedError
	if !errors.As(c.Refused(), &refused) || !refused.Revoked || refused.Credential != "dp-1" {
		t.Fatalf("Refused() = %#v, want the revocation of dp-1", c.Refused())
	}
	if err := c.Admit(t.Context(), key); !errors.As(err, &refused) {
		t.Errorf("Admit = %v, want the refusal", err)
	}
	if _, err := c.Credential(t.Context(), key); !errors.As(err, &refused) {
		t.Errorf("Credential = %v, want the refusal (no cached token)", err)
	}
	if msgs := notes.Msgs(); len(msgs) == 0 || !strings.Contains(msgs[len(msgs)-1], `agent credential "dp-1" was revoked`) {
		t.Errorf("notices = %q, want one saying dp-1 was revoked", msgs)
	}

	create()
	eventually(t, "the client accepted again", func() bool { return c.Refused() == nil })
	if err := c.Admit(t.Context(), key); err != nil {
		t.Errorf("Admit after the credential was created again = %v, want admitted", err)
	}
}

// A token created moments after its data plane first presented it (on
// another replica, before this one read it) is accepted, not refused: the
// first refusal of a token the control plane does not know is asked once
// more before the start is told. A revoked one is not asked again.
func TestTokenCreatedMomentsLaterIsAccepted(t *testing.T) {
	srv := controlplanetest.Start(t, &controlplanetest.Options{Broker: true})
	key := account.Key("acct-a")
	admin := adminClient(srv)
	startIdP(t).login(t, admin, "acct-a")
	scoped := tok(t, "scoped-token-of-dp-2")
	sum := sha256.Sum256([]byte(scoped.Reveal()))
	rec := newRecorder()
	c := run(t, control.Config{Target: srv.Addr, Token: scoped, AgentID: "dp-2-host", Accounts: []string{key}, Broker: true, Logger: rec.logger()}, rec)
	eventually(t, "the first agent stream sent", func() bool { return rec.connected() >= 1 })
	time.Sleep(100 * time.Millisecond) // its refusal arrives
	if _, err := admin.CreateAgentCredential(t.Context(), &controlplanev1.CreateAgentCredentialRequest{Name: "dp-2", Accounts: []string{key}, TokenSha256: sum[:]}); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(t.Context(), waitTimeout)
	defer cancel()
	if err := c.Accepted(ctx); err != nil {
		t.Fatalf("Accepted = %v, want the token created after its first stream accepted", err)
	}
	if n := rec.connected(); n < 2 {
		t.Errorf("agent streams sent = %d, want the refused one and the one accepted", n)
	}
	if err := c.Refused(); err != nil {
		t.Errorf("Refused() = %v, want nil", err)
	}
}

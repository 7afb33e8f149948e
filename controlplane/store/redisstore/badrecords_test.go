package redisstore

import (
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/clodex/clodex/controlplane/store"
	"github.com/clodex/clodex/controlplane/store/redistest"
	"github.com/clodex/clodex/internal/pacing"
)

// A garbage value in each kind of record affects only that record: the
// breaker stays closed, every other account is served centrally, and the
// record's own account is served from the last good copy (or repaired
// from it), never silently from the defaults.
func TestGarbageRecordAffectsOnlyItself(t *testing.T) {
	rs := redistest.Start(t)
	raw := rawClient(t, rs)
	ctx := t.Context()
	clk := &fixedClock{t: t0}
	a := openReplica(t, rs, "bad:", "cp-a", &Options{Now: clk.Now})
	const other = "acct_00000000000000b2"
	setRate(t, a.Store, key, 600)
	setRate(t, a.Store, other, 60)
	putLogin(t, a.Store, key, "sealed-1")
	if err := a.PutAgentCred(ctx, store.AgentCred{Name: "team-a", Digest: digest, Accounts: []string{key}, Created: t0}); err != nil {
		t.Fatal(err)
	}
	if _, _, err := a.PutQuota(ctx, store.Quota{Key: key, PlanType: "pro", ReportedAt: t0}); err != nil {
		t.Fatal(err)
	}
	if _, _, err := a.PutQuota(ctx, store.Quota{Key: other, PlanType: "plus", ReportedAt: t0}); err != nil {
		t.Fatal(err)
	}
	mustAdmit(t, a.Store, key, t0)

	t.Run("Policy", func(t *testing.T) {
		if err := raw.HSet(ctx, "bad:policies", key, "not a policy").Err(); err != nil {
			t.Fatal(err)
		}
		adm, err := a.Admit(ctx, key, t0)
		if err != nil || !isLocalReservation(adm.Decision.ID|localBit) || adm.PolicyVersion == 0 {
			t.Errorf("Admit with its policy unreadable = %+v, %v; want a decision under the last good policy", adm, err)
		}
		if o := mustAdmit(t, a.Store, other, t0); o.Decision.ID == 0 || isLocalReservation(o.Decision.ID) {
			t.Errorf("Admit of another account = %+v; want a central decision", o)
		}
		if a.breaker.isOpen() {
			t.Fatal("a garbage policy opened the breaker")
		}
		acct, err := a.Account(ctx, key, t0)
		if err != nil || acct.Unreadable == "" || !strings.Contains(acct.Unreadable, "bad:policies field "+key) || acct.Policy.RatePerMinute != 600 {
			t.Errorf("Account = %+v, %v; want unreadable, naming the record, with the last good rate 600", acct, err)
		}
		list, err := a.Accounts(ctx, t0)
		if err != nil || len(list) != 2 || list[0].Key != other || list[0].Unreadable != "" || list[1].Unreadable == "" {
			t.Errorf("Accounts = %+v, %v; want both, only %s unreadable", list, err, key)
		}
		// Setting the policy again replaces the record.
		if got := setRate(t, a.Store, key, 500); got.Policy.RatePerMinute != 500 || got.Unreadable != "" {
			t.Errorf("set-rate over the unreadable record = %+v; want 500", got)
		}
		if acct, err := a.Account(ctx, key, t0); err != nil || acct.Unreadable != "" {
			t.Errorf("Account after set-rate = %+v, %v; want readable", acct, err)
		}
	})

	t.Run("PolicyWithoutCopy", func(t *testing.T) {
		b := openReplica(t, rs, "bad:", "cp-b", &Options{Now: clk.Now})
		const third = "acct_00000000000000c3"
		if err := raw.HSet(ctx, "bad:policies", third, "garbage").Err(); err != nil {
			t.Fatal(err)
		}
		_, err := b.Admit(ctx, third, t0)
		var bad *store.BadRecordError
		if !errors.As(err, &bad) || !strings.Contains(err.Error(), "bad:policies field "+third) {
			t.Errorf("Admit with an unreadable policy and no copy = %v; want a BadRecordError naming the record", err)
		}
		if err := raw.HDel(ctx, "bad:policies", third).Err(); err != nil {
			t.Fatal(err)
		}
	})

	t.Run("AccountState", func(t *testing.T) {
		if err := raw.HSet(ctx, "bad:a:"+other, "S", "garbage").Err(); err != nil {
			t.Fatal(err)
		}
		adm := mustAdmit(t, a.Store, other, t0)
		if adm.Decision.Kind != pacing.KindAdmit || isLocalReservation(adm.Decision.ID) {
			t.Errorf("Admit over a garbage bucket state = %+v; want a central admission of a bucket started over", adm)
		}
	})

	t.Run("SignIn", func(t *testing.T) {
		if err := raw.HSet(ctx, "bad:login:"+key, "data", "{garbage").Err(); err != nil {
			t.Fatal(err)
		}
		l, err := a.Login(ctx, key)
		if err != nil || string(l.Sealed) != "sealed-1" {
			t.Errorf("Login with its data unreadable = %q, %v; want this replica's copy", l.Sealed, err)
		}
		if d := raw.HGet(ctx, "bad:login:"+key, "data").Val(); !strings.Contains(d, `"account_id"`) {
			t.Errorf("login data after the read = %q; want it repaired", d)
		}
		// Unreadable without a copy of its generation: listed as such.
		b := openReplica(t, rs, "bad:", "cp-c", &Options{Now: clk.Now})
		if err := raw.HSet(ctx, "bad:login:"+key, "gen", "x", "data", "{").Err(); err != nil {
			t.Fatal(err)
		}
		ls, err := b.Logins(ctx)
		if err != nil || len(ls) != 1 || ls[0].Unreadable == "" {
			t.Errorf("Logins with one unreadable = %+v, %v; want it listed as unreadable", ls, err)
		}
		if _, err := b.Login(ctx, key); !strings.Contains(fmtErr(err), "bad:login:"+key) {
			t.Errorf("Login = %v; want an error naming the record", err)
		}
	})

	t.Run("AgentCredential", func(t *testing.T) {
		if err := raw.HSet(ctx, "bad:agentcreds", "team-a", "{garbage").Err(); err != nil {
			t.Fatal(err)
		}
		cs, err := a.AgentCreds(ctx)
		if err != nil || len(cs) != 1 || len(cs[0].Accounts) != 1 {
			t.Errorf("AgentCreds with one unreadable = %+v, %v; want this replica's copy", cs, err)
		}
		if d := raw.HGet(ctx, "bad:agentcreds", "team-a").Val(); !strings.Contains(d, "sha256") {
			t.Errorf("credential after the read = %q; want it repaired", d)
		}
	})

	t.Run("Quota", func(t *testing.T) {
		if err := raw.HSet(ctx, "bad:quotas", key, "{garbage").Err(); err != nil {
			t.Fatal(err)
		}
		qs, err := a.Quotas(ctx, "")
		if err != nil || len(qs) != 1 || qs[0].Key != other {
			t.Errorf("Quotas with one unreadable = %+v, %v; want the other account's", qs, err)
		}
		if _, next, err := a.PutQuota(ctx, store.Quota{Key: key, PlanType: "pro", ReportedAt: t0.Add(time.Second)}); err != nil || next.PlanType != "pro" {
			t.Errorf("PutQuota over an unreadable one = %+v, %v; want it replaced", next, err)
		}
	})

	t.Run("Counters", func(t *testing.T) {
		if err := raw.Set(ctx, "bad:version", "garbage", 0).Err(); err != nil {
			t.Fatal(err)
		}
		if err := raw.Set(ctx, "bad:fence:"+key, "garbage", 0).Err(); err != nil {
			t.Fatal(err)
		}
		if got := setRate(t, a.Store, other, 30); got.PolicyVersion <= 2 {
			t.Errorf("set-rate over an unreadable version = %+v; want a version past the last", got)
		}
		lease, err := a.AcquireLease(ctx, key, time.Minute)
		if err != nil {
			t.Fatalf("AcquireLease over an unreadable fencing counter: %v", err)
		}
		_ = lease.Release()
	})

	if a.breaker.isOpen() || a.Info().Degraded {
		t.Error("garbage records opened the breaker")
	}
	if n := strings.Count(a.log.String(), "a record in redis is unreadable"); n < 5 {
		t.Errorf("logged %d unreadable records; want each one named:\n%s", n, a.log.String())
	}
}

func fmtErr(err error) string {
	if err == nil {
		return ""
	}
	return err.Error()
}

// fixedClock is a clock tests set.
type fixedClock struct{ t time.Time }

func (c *fixedClock) Now() time.Time { return c.t }

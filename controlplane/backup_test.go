package controlplane_test

import (
	"bytes"
	"errors"
	"io"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/clodex/clodex/controlplane/controlplanetest"
	"github.com/clodex/clodex/controlplane/store/redistest"
	"github.com/clodex/clodex/internal/codexsim/simauth"
	controlplanev1 "github.com/clodex/clodex/proto/gen/go/clodex/controlplane/v1"
)

func backupOf(t *testing.T, admin controlplanev1.AdminServiceClient) ([]byte, *controlplanev1.BackupSummary) {
	t.Helper()
	st, err := admin.Backup(t.Context(), &controlplanev1.BackupRequest{})
	if err != nil {
		t.Fatal(err)
	}
	var buf bytes.Buffer
	var sum *controlplanev1.BackupSummary
	for {
		resp, err := st.Recv()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			t.Fatalf("Backup: %v", err)
		}
		if resp.GetSummary() != nil {
			sum = resp.GetSummary()
		}
		buf.Write(resp.GetData())
	}
	return buf.Bytes(), sum
}

func restoreTo(t *testing.T, admin controlplanev1.AdminServiceClient, data []byte, force bool) (*controlplanev1.RestoreResponse, error) {
	t.Helper()
	st, err := admin.Restore(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	for i := 0; i == 0 || i < len(data); i += 100 << 10 {
		if err := st.Send(&controlplanev1.RestoreRequest{Data: data[i:min(i+100<<10, len(data))], Force: force && i == 0}); err != nil {
			break
		}
	}
	return st.CloseAndRecv()
}

// Backup and Restore over the admin API, on replicas over Redis with the
// credential broker: the file is sealed (no account id or token in
// clear), a restore into a store that lost everything puts it back, a
// restore keeps newer records unless forced, and a file that is not a
// backup is refused naming why.
func TestBackupAndRestore(t *testing.T) {
	rs := redistest.Start(t)
	a := controlplanetest.Start(t, &controlplanetest.Options{RedisURL: rs.URL, Replica: "cp-a", Broker: true})
	admin := controlplanev1.NewAdminServiceClient(a.Dial(a.AdminToken, nil))
	ctx := t.Context()
	if _, err := admin.SetRate(ctx, &controlplanev1.SetRateRequest{Key: key, RatePerMinute: 600}); err != nil {
		t.Fatal(err)
	}
	// A scoped credential needs the broker to hold the account's sign-in.
	idp, err := simauth.New(simauth.Config{})
	if err != nil {
		t.Fatal(err)
	}
	toks, err := idp.Issue("chatgpt-account-1")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := admin.ImportLogin(ctx, &controlplanev1.ImportLoginRequest{AccessToken: toks.AccessToken, RefreshToken: toks.RefreshToken,
		IdToken: toks.IDToken, AccountId: "chatgpt-account-1"}); err != nil {
		t.Fatal(err)
	}
	if _, err := admin.CreateAgentCredential(ctx, &controlplanev1.CreateAgentCredentialRequest{Name: "team-a", Accounts: []string{key},
		TokenSha256: bytes.Repeat([]byte{9}, 32)}); err != nil {
		t.Fatal(err)
	}
	data, sum := backupOf(t, admin)
	if sum == nil || !sum.GetSealed() || sum.GetPolicies() != 1 || sum.GetLogins() != 1 || sum.GetAgentCredentials() != 1 || sum.GetKind() != "redis" {
		t.Errorf("backup summary = %v; want sealed, 1 policy, 1 sign-in and 1 agent credential", sum)
	}
	if bytes.Contains(data, []byte(key)) || bytes.Contains(data, []byte("team-a")) || bytes.Contains(data, []byte(toks.RefreshToken)) {
		t.Error("the sealed backup holds an account key, a credential name or a refresh token in clear")
	}

	opt, _ := redis.ParseURL(rs.URL)
	raw := redis.NewClient(opt)
	defer raw.Close()
	// Everything lost, the replica stopped: only the backup holds it.
	a.Stop()
	if err := raw.FlushAll(ctx).Err(); err != nil {
		t.Fatal(err)
	}
	b := controlplanetest.Start(t, &controlplanetest.Options{RedisURL: rs.URL, Replica: "cp-b", Broker: true, Tokens: a})
	// b has another key: the file does not open there.
	bAdmin := controlplanev1.NewAdminServiceClient(b.Dial(b.AdminToken, nil))
	if _, err := restoreTo(t, bAdmin, data, false); status.Code(err) != codes.InvalidArgument || !strings.Contains(err.Error(), "does not open with this credential key") {
		t.Errorf("Restore of a backup sealed with another key = %v; want InvalidArgument saying so", err)
	}
	b.Stop()
	c := startWithKey(t, rs.URL, a)
	cAdmin := controlplanev1.NewAdminServiceClient(c.Dial(c.AdminToken, nil))
	resp, err := restoreTo(t, cAdmin, data, false)
	if err != nil || resp.GetPolicies().GetRestored() != 1 || resp.GetLogins().GetRestored() != 1 || resp.GetAgentCredentials().GetRestored() != 1 {
		t.Fatalf("Restore into an empty store = %v, %v; want 1 policy, 1 sign-in and 1 credential restored", resp, err)
	}
	got, err := cAdmin.GetAccount(ctx, &controlplanev1.GetAccountRequest{Key: key})
	if err != nil || got.GetAccount().GetRatePerMinute() != 600 || !strings.Contains(got.GetStore().GetRestored(), "from a backup") {
		t.Errorf("GetAccount after the restore = %v, %v; want rate 600 and the restore named", got, err)
	}
	// A newer change is kept by a second restore, replaced by a forced one.
	if _, err := cAdmin.SetRate(ctx, &controlplanev1.SetRateRequest{Key: key, RatePerMinute: 300}); err != nil {
		t.Fatal(err)
	}
	if resp, err := restoreTo(t, cAdmin, data, false); err != nil || resp.GetPolicies().GetKept() != 1 {
		t.Errorf("Restore over a newer policy = %v, %v; want it kept", resp, err)
	}
	if resp, err := restoreTo(t, cAdmin, data, true); err != nil || resp.GetPolicies().GetRestored() != 1 {
		t.Errorf("forced Restore = %v, %v; want the policy restored", resp, err)
	}
	if got, _ := cAdmin.GetAccount(ctx, &controlplanev1.GetAccountRequest{Key: key}); got.GetAccount().GetRatePerMinute() != 600 {
		t.Errorf("rate after a forced restore = %d; want 600", got.GetAccount().GetRatePerMinute())
	}
	if _, err := restoreTo(t, cAdmin, []byte("hello"), false); status.Code(err) != codes.InvalidArgument || !strings.Contains(err.Error(), "not a clodex backup file") {
		t.Errorf("Restore of garbage = %v; want InvalidArgument naming it", err)
	}
}

// startWithKey starts a replica over url with like's tokens and
// credential key.
func startWithKey(t *testing.T, url string, like *controlplanetest.Server) *controlplanetest.Server {
	t.Helper()
	return controlplanetest.Start(t, &controlplanetest.Options{RedisURL: url, Replica: "cp-c", Broker: true, Tokens: like, CredentialKey: &like.CredentialKey})
}

// A FLUSHALL under a running replica shows in GetAccount's store: the
// loss (when, and what was found) and the write-back.
func TestStoreInfoSaysWhatWasLost(t *testing.T) {
	rs := redistest.Start(t)
	a := controlplanetest.Start(t, &controlplanetest.Options{RedisURL: rs.URL, Replica: "cp-a"})
	admin := controlplanev1.NewAdminServiceClient(a.Dial(a.AdminToken, nil))
	ctx := t.Context()
	if _, err := admin.SetRate(ctx, &controlplanev1.SetRateRequest{Key: key, RatePerMinute: 600}); err != nil {
		t.Fatal(err)
	}
	opt, _ := redis.ParseURL(rs.URL)
	raw := redis.NewClient(opt)
	defer raw.Close()
	if err := raw.FlushAll(ctx).Err(); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	var got *controlplanev1.GetAccountResponse
	for {
		var err error
		got, err = admin.GetAccount(ctx, &controlplanev1.GetAccountRequest{Key: key})
		if err != nil {
			t.Fatal(err)
		}
		if got.GetStore().GetRestoredUnixMs() != 0 {
			break
		}
		if time.Since(start) > 30*time.Second {
			t.Fatalf("no restore after 30s: %v", got.GetStore())
		}
		time.Sleep(50 * time.Millisecond)
	}
	st := got.GetStore()
	if st.GetLostUnixMs() == 0 || !strings.Contains(st.GetLoss(), "epoch") || st.GetHealing() || got.GetAccount().GetRatePerMinute() != 600 {
		t.Errorf("store after a FLUSHALL = %v, account %v; want the loss and the restore, rate 600", st, got.GetAccount())
	}
	if len(st.GetWarnings()) == 0 || !strings.Contains(st.GetWarnings()[0], "appendonly") {
		t.Errorf("store warnings = %q; want the Redis without persistence named", st.GetWarnings())
	}
}

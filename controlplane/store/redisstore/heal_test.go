package redisstore

import (
	"bytes"
	"context"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/clodex/clodex/controlplane/broker"
	"github.com/clodex/clodex/controlplane/store"
	"github.com/clodex/clodex/controlplane/store/redistest"
	"github.com/clodex/clodex/internal/pacing"
)

// logBuf is a slog destination tests read while the store writes.
type logBuf struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *logBuf) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *logBuf) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// replica is one store with its Run loop, its log and its prefix's
// raw view of Redis.
type replica struct {
	*Store
	log  *logBuf
	stop func()
}

// openReplica opens a replica of the store at srv under prefix (with
// Redis's own clock, the default tick of 1 s and the default deadline),
// and starts its Run loop unless run is false (startRun starts it).
func openReplica(t *testing.T, srv *redistest.Server, prefix, id string, opts *Options) *replica {
	t.Helper()
	lb := &logBuf{}
	o := Options{}
	if opts != nil {
		o = *opts
	}
	o.URL, o.Prefix, o.Replica = srv.URL, prefix, id
	o.Logger = slog.New(slog.NewTextHandler(lb, &slog.HandlerOptions{Level: slog.LevelDebug}))
	if o.Timeout == 0 {
		o.Timeout = 2 * time.Second // a loaded test machine; the deadline is not what is tested
	}
	r, err := Open(t.Context(), o)
	if err != nil {
		t.Fatalf("Open %s: %v", id, err)
	}
	rep := &replica{Store: r, log: lb, stop: func() {}}
	t.Cleanup(func() {
		rep.stop()
		_ = r.Close()
		if t.Failed() {
			t.Logf("---- %s log ----\n%s", id, lb.String())
		}
	})
	return rep
}

// startRun starts the replica's Run loop; stop ends it and waits.
func (rep *replica) startRun(t *testing.T) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		_ = rep.Run(ctx)
	}()
	rep.stop = func() { cancel(); <-done }
}

func rawClient(t *testing.T, srv *redistest.Server) *redis.Client {
	t.Helper()
	opt, err := redis.ParseURL(srv.URL)
	if err != nil {
		t.Fatal(err)
	}
	c := redis.NewClient(opt)
	t.Cleanup(func() { _ = c.Close() })
	return c
}

// waitFor polls cond every 20 ms until it holds, failing after bound.
func waitFor(t *testing.T, bound time.Duration, what string, cond func() bool) time.Duration {
	t.Helper()
	start := time.Now()
	for !cond() {
		if time.Since(start) > bound {
			t.Fatalf("%s: not within %v", what, bound)
		}
		time.Sleep(20 * time.Millisecond)
	}
	return time.Since(start)
}

func setRate(t *testing.T, s *Store, key string, rate int) store.Account {
	t.Helper()
	a, err := s.UpdatePolicy(t.Context(), key, s.Now(), func(p pacing.Policy) (pacing.Policy, error) {
		p.RatePerMinute = rate
		return p, nil
	})
	if err != nil {
		t.Fatalf("UpdatePolicy(%s, %d): %v", key, rate, err)
	}
	return a
}

func putLogin(t *testing.T, s *Store, key string, sealed string) store.Login {
	t.Helper()
	lease, err := s.AcquireLease(t.Context(), key, 45*time.Second)
	if err != nil {
		t.Fatalf("AcquireLease(%s): %v", key, err)
	}
	defer func() { _ = lease.Release() }()
	var gen int64
	if cur, err := s.Login(t.Context(), key); err == nil {
		gen = cur.Generation
	}
	l, err := s.PutLogin(t.Context(), store.Login{Key: key, AccountID: "id-" + key, Sealed: []byte(sealed), Refreshed: time.Now().UTC(), Generation: gen}, lease)
	if err != nil {
		t.Fatalf("PutLogin(%s): %v", key, err)
	}
	return l
}

var digest = bytes.Repeat([]byte{7}, 32)

// FLUSHALL under two running replicas: each notices within a tick or two,
// logs one ERROR naming the loss, and the policies, sign-ins and agent
// credentials they hold are back in Redis, each at its own version; a
// change made after the loss is newer than any of them.
func TestLossIsHealedFromTheReplicas(t *testing.T) {
	rs := redistest.Start(t)
	raw := rawClient(t, rs)
	a := openReplica(t, rs, "heal:", "cp-a", nil)
	b := openReplica(t, rs, "heal:", "cp-b", nil)
	ctx := t.Context()
	pol := setRate(t, a.Store, key, 600)
	l := putLogin(t, a.Store, key, "sealed-1")
	l2 := putLogin(t, b.Store, key, "sealed-2") // a refresh: generation 2
	if err := b.PutAgentCred(ctx, store.AgentCred{Name: "team-a", Digest: digest, Accounts: []string{key}, Created: time.Now().UTC()}); err != nil {
		t.Fatal(err)
	}
	a.startRun(t)
	b.startRun(t)
	// Each replica reads the others' writes within a tick (the broker
	// and the server list sign-ins and credentials every second).
	if _, err := a.Logins(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := a.AgentCreds(ctx); err != nil {
		t.Fatal(err)
	}
	oldEpoch := a.Info().Epoch
	if oldEpoch == "" || oldEpoch != b.Info().Epoch {
		t.Fatalf("epochs %q and %q; want one store epoch both serve under", oldEpoch, b.Info().Epoch)
	}

	lost := time.Now()
	if err := raw.FlushAll(ctx).Err(); err != nil {
		t.Fatal(err)
	}
	took := waitFor(t, 30*time.Second, "both replicas notice the loss and the state is back", func() bool {
		ia, ib := a.Info(), b.Info()
		return !ia.LostAt.IsZero() && !ib.LostAt.IsZero() && !ia.Healing && !ib.Healing &&
			raw.HExists(ctx, "heal:policies", key).Val() && raw.Exists(ctx, "heal:login:"+key).Val() == 1 &&
			raw.HExists(ctx, "heal:agentcreds", "team-a").Val()
	})
	ia, ib := a.Info(), b.Info()
	t.Logf("FLUSHALL to the state back in redis: %v; noticed after %v (cp-a) and %v (cp-b); cp-a: %s; cp-b: %s",
		took.Round(time.Millisecond), ia.LostAt.Sub(lost).Round(time.Millisecond), ib.LostAt.Sub(lost).Round(time.Millisecond), ia.Restored, ib.Restored)
	for _, rep := range []*replica{a, b} {
		if n := strings.Count(rep.log.String(), "level=ERROR msg=\"redis lost data"); n != 1 {
			t.Errorf("%s logged %d ERROR lines about the loss; want 1:\n%s", rep.replica, n, rep.log.String())
		}
		if !strings.Contains(rep.Info().Loss, "epoch "+oldEpoch) {
			t.Errorf("%s Info().Loss = %q; want it to name the lost epoch %s", rep.replica, rep.Info().Loss, oldEpoch)
		}
	}
	if ia.Epoch == oldEpoch || ia.Epoch != ib.Epoch {
		t.Errorf("epochs after the loss: %q and %q; want one new epoch (not %q)", ia.Epoch, ib.Epoch, oldEpoch)
	}

	got, err := b.Account(ctx, key, b.Now())
	if err != nil || got.Policy.RatePerMinute != 600 || !got.Custom || got.PolicyVersion != pol.PolicyVersion {
		t.Errorf("Account after the loss = %+v, %v; want rate 600, custom, version %d", got, err, pol.PolicyVersion)
	}
	gl, err := a.Login(ctx, key)
	if err != nil || gl.Generation != l2.Generation || string(gl.Sealed) != "sealed-2" {
		t.Errorf("Login after the loss = gen %d %q, %v; want the newest, generation %d (the first was %d)", gl.Generation, gl.Sealed, err, l2.Generation, l.Generation)
	}
	cs, err := a.AgentCreds(ctx)
	if err != nil || len(cs) != 1 || cs[0].Name != "team-a" {
		t.Errorf("AgentCreds after the loss = %+v, %v; want team-a", cs, err)
	}
	// A change after the loss is newer than every copy a replica holds.
	next := setRate(t, a.Store, key, 300)
	if next.PolicyVersion <= pol.PolicyVersion+VersionGap-1 {
		t.Errorf("version of a change after the loss = %d; want past %d + %d", next.PolicyVersion, pol.PolicyVersion, VersionGap)
	}
}

// A replica that missed the newest change (its copy is older) writes its
// copy back first: the newer copy wins, and a change made after the loss
// wins over both.
func TestLossWriteBackKeepsTheNewest(t *testing.T) {
	rs := redistest.Start(t)
	raw := rawClient(t, rs)
	ctx := t.Context()
	a := openReplica(t, rs, "newest:", "cp-a", nil)
	setRate(t, a.Store, key, 100)
	const other = "acct_00000000000000b2"
	setRate(t, a.Store, other, 100)
	b := openReplica(t, rs, "newest:", "cp-b", nil) // reads both at v1, v2
	setRate(t, b.Store, key, 200)                   // a misses it: its Run is not running
	if err := raw.FlushAll(ctx).Err(); err != nil {
		t.Fatal(err)
	}
	// a notices first and writes back key at 100 (v1); then a change
	// through a: other at 300.
	a.startRun(t)
	waitFor(t, 30*time.Second, "cp-a writes back", func() bool { return !a.Info().RestoredAt.IsZero() })
	setRate(t, a.Store, other, 300)
	// b writes back key at 200 (v3, newer than a's v1) and other at 100
	// (v2, older than the change after the loss).
	b.startRun(t)
	waitFor(t, 30*time.Second, "cp-b writes back", func() bool { return !b.Info().RestoredAt.IsZero() })
	for k, want := range map[string]int{key: 200, other: 300} {
		rec, err := raw.HGet(ctx, "newest:policies", k).Result()
		sp, derr := decodeRecord(rec)
		if err != nil || derr != nil || sp.policy.RatePerMinute != want {
			t.Errorf("policy of %s after both write-backs = %q (%v, %v); want rate %d", k, rec, err, derr, want)
		}
	}
}

// A refresh lease held across a loss stays its holder's: the holder puts
// it back, nobody else takes it meanwhile (no lease is handed out while
// replicas write back), and the holder's fenced write succeeds; the next
// lease has a larger fencing token.
func TestLossKeepsTheRefreshLease(t *testing.T) {
	rs := redistest.Start(t)
	raw := rawClient(t, rs)
	ctx := t.Context()
	quick := &Options{HealQuiet: time.Second}
	a := openReplica(t, rs, "lease:", "cp-a", quick)
	b := openReplica(t, rs, "lease:", "cp-b", quick)
	putLogin(t, a.Store, key, "sealed-1")
	lease, err := a.AcquireLease(ctx, key, 45*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	cur, err := a.Login(ctx, key)
	if err != nil {
		t.Fatal(err)
	}
	if err := raw.FlushAll(ctx).Err(); err != nil {
		t.Fatal(err)
	}
	// b wants the lease now: it must not get it while a holds it.
	bctx, cancel := context.WithTimeout(ctx, 500*time.Millisecond)
	_, berr := b.AcquireLease(bctx, key, 45*time.Second)
	cancel()
	if berr == nil {
		t.Fatal("cp-b took the refresh lease cp-a holds across the loss")
	}
	t.Logf("cp-b's lease request while cp-a holds it across the loss: %v", berr)
	// a's write under its lease (a refresh finishing) succeeds.
	cur.Sealed = []byte("sealed-2")
	if _, err := a.PutLogin(ctx, cur, lease); err != nil {
		t.Fatalf("PutLogin under the lease held across the loss: %v", err)
	}
	if err := lease.Release(); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 30*time.Second, "the quiet mark ends", func() bool { return raw.Exists(ctx, "lease:healing").Val() == 0 })
	next, err := b.AcquireLease(ctx, key, 45*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = next.Release() }()
	if next.Fence <= lease.Fence {
		t.Errorf("fencing token after the loss = %d; want past %d, the one taken before", next.Fence, lease.Fence)
	}
	gl, err := b.Login(ctx, key)
	if err != nil || string(gl.Sealed) != "sealed-2" {
		t.Errorf("Login = %q, %v; want the write made under the lease", gl.Sealed, err)
	}
}

// Redis a moment behind (its version gone back, a sign-in older than a
// replica's): the replica writes its copies back under the same epoch.
func TestRecentWritesLostAreWrittenBack(t *testing.T) {
	rs := redistest.Start(t)
	raw := rawClient(t, rs)
	ctx := t.Context()
	a := openReplica(t, rs, "behind:", "cp-a", nil)
	setRate(t, a.Store, key, 100)
	pol := setRate(t, a.Store, key, 200)
	putLogin(t, a.Store, key, "sealed-1")
	l2 := putLogin(t, a.Store, key, "sealed-2")
	epoch := a.Info().Epoch
	// What an AOF a second old holds: the first policy and sign-in.
	if err := raw.Set(ctx, "behind:version", 1, 0).Err(); err != nil {
		t.Fatal(err)
	}
	if err := raw.HSet(ctx, "behind:policies", key, "1 100 10 120000 600000 5 4833 1").Err(); err != nil {
		t.Fatal(err)
	}
	if err := raw.HSet(ctx, "behind:login:"+key, "gen", 1).Err(); err != nil {
		t.Fatal(err)
	}
	gl, err := a.Login(ctx, key)
	if err != nil || gl.Generation != l2.Generation || string(gl.Sealed) != "sealed-2" {
		t.Errorf("Login with redis a generation behind = %d %q, %v; want this replica's generation %d", gl.Generation, gl.Sealed, err, l2.Generation)
	}
	if g := raw.HGet(ctx, "behind:login:"+key, "gen").Val(); g != "2" {
		t.Errorf("generation in redis after the read = %s; want 2, written back", g)
	}
	a.startRun(t)
	waitFor(t, 30*time.Second, "the policy is written back", func() bool {
		sp, err := decodeRecord(raw.HGet(ctx, "behind:policies", key).Val())
		return err == nil && sp.version == pol.PolicyVersion && sp.policy.RatePerMinute == 200
	})
	if a.Info().Epoch != epoch {
		t.Errorf("epoch = %s; want the same %s (the store only lost recent writes)", a.Info().Epoch, epoch)
	}
	if !strings.Contains(a.log.String(), "went back from") {
		t.Errorf("log does not say the version went back:\n%s", a.log.String())
	}
}

// Every replica restarted against an empty Redis: a replica with a backup
// restores it, says so and from which file; a replica without one starts
// a new store and says that, never silently.
func TestEmptyStoreRestoredFromBackup(t *testing.T) {
	rs := redistest.Start(t)
	raw := rawClient(t, rs)
	ctx := t.Context()
	key1, _, err := broker.GenerateKey()
	if err != nil {
		t.Fatal(err)
	}
	dir, err := store.OpenBackupDir(store.BackupOptions{Dir: t.TempDir(), Replica: "cp-a", Sealer: key1.BackupSealer()})
	if err != nil {
		t.Fatal(err)
	}
	a := openReplica(t, rs, "empty:", "cp-a", nil)
	pol := setRate(t, a.Store, key, 600)
	l := putLogin(t, a.Store, key, "sealed-1")
	if err := a.PutAgentCred(ctx, store.AgentCred{Name: "team-a", Digest: digest, Accounts: []string{key}, Created: t0}); err != nil {
		t.Fatal(err)
	}
	snap, err := a.BackupState(ctx)
	if err != nil {
		t.Fatal(err)
	}
	path, err := dir.Write(snap)
	if err != nil || path == "" {
		t.Fatalf("write backup: %q, %v", path, err)
	}
	a.stop()
	_ = a.Close()
	if err := raw.FlushAll(ctx).Err(); err != nil {
		t.Fatal(err)
	}

	b := openReplica(t, rs, "empty:", "cp-b", &Options{Backup: dir.Newest})
	if got, err := b.Account(ctx, key, b.Now()); err != nil || got.Policy.RatePerMinute != 600 || got.PolicyVersion != pol.PolicyVersion {
		t.Errorf("Account after the restore = %+v, %v; want rate 600 at version %d", got, err, pol.PolicyVersion)
	}
	if got, err := b.Login(ctx, key); err != nil || got.Generation != l.Generation || string(got.Sealed) != "sealed-1" {
		t.Errorf("Login after the restore = %+v, %v; want generation %d", got, err, l.Generation)
	}
	if cs, err := b.AgentCreds(ctx); err != nil || len(cs) != 1 {
		t.Errorf("AgentCreds after the restore = %+v, %v; want team-a", cs, err)
	}
	if i := b.Info(); !strings.Contains(i.Restored, path) || !strings.Contains(b.log.String(), "restored the durable state from this replica's newest backup") {
		t.Errorf("Info().Restored = %q; want it (and the log) to name %s:\n%s", i.Restored, path, b.log.String())
	}
	// No lease is handed out while replicas starting beside it may put
	// newer copies back.
	if n := raw.PTTL(ctx, "empty:healing").Val(); n <= 0 {
		t.Errorf("healing mark lifetime = %v after a restore from a backup; want the restore's quiet time", n)
	}

	c := openReplica(t, rs, "fresh:", "cp-c", nil)
	if !strings.Contains(c.log.String(), "there is no backup: starting a new, empty store") {
		t.Errorf("a new store without a backup logs nothing about it:\n%s", c.log.String())
	}
}

// Every durable change this replica makes or reads moves Changes and
// signals Changed (a backup writer's cue); the copy holds it.
func TestDurableChangesWakeTheBackupWriter(t *testing.T) {
	rs := redistest.Start(t)
	a := openReplica(t, rs, "changes:", "cp-a", nil)
	drain := func() {
		select {
		case <-a.Changed():
		default:
		}
	}
	for name, change := range map[string]func(){
		"policy":  func() { setRate(t, a.Store, key, 600) },
		"sign-in": func() { putLogin(t, a.Store, key, "sealed-1") },
		"agent credential": func() {
			if err := a.PutAgentCred(t.Context(), store.AgentCred{Name: "team-a", Digest: digest, Accounts: []string{key}}); err != nil {
				t.Fatal(err)
			}
		},
	} {
		drain()
		before := a.Changes()
		change()
		select {
		case <-a.Changed():
		default:
			t.Errorf("%s: no change signalled", name)
		}
		if a.Changes() == before {
			t.Errorf("%s: Changes did not move", name)
		}
	}
	s, err := a.BackupState(t.Context())
	if err != nil || len(s.Policies) != 1 || len(s.Logins) != 1 || len(s.AgentCreds) != 1 || s.Epoch == "" {
		t.Errorf("BackupState = %+v, %v; want the policy, sign-in and credential under the epoch", s, err)
	}
}

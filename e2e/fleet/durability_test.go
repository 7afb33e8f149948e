package fleet

import (
	"context"
	"crypto/sha256"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/clodex/clodex/bench/fleet/cluster"
	"github.com/clodex/clodex/internal/account"
	"github.com/clodex/clodex/internal/atomicfile"
	controlplanev1 "github.com/clodex/clodex/proto/gen/go/clodex/controlplane/v1"
)

// TestDurability runs two clodex-controlplane replicas (the credential
// broker, each with a --backup-dir) over one redis-server with an AOF, two
// data planes without auth.json and clodex-sim issuing 60 s tokens, and
// under a fleet load makes Redis lose its data in every way the issue
// names, checking each time that no turn fails and that nothing durable
// (the account's policy, its sign-in, a scoped agent credential) is lost
// or silently replaced by a default:
//
//  1. FLUSHALL mid-load;
//  2. Redis killed with SIGKILL right after a policy change and restarted
//     with its AOF (the change may not have reached the disk);
//  3. Redis restarted without persistence (empty);
//  4. a garbage value in each kind of record;
//  5. every replica restarted against an empty Redis, restoring from its
//     backups;
//  6. a replica with another credential key, refused;
//  7. every replica restarted against an empty Redis without a backup:
//     a new store, said so.
//
// It logs the seconds from each loss to the state back in Redis, the
// turns that failed and the emulator's refresh_token_reused count.
func TestDurability(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and runs the real binaries; skipped with -short")
	}
	if _, err := exec.LookPath("redis-server"); err != nil {
		if os.Getenv("CI") == "true" {
			t.Fatalf("redis-server is not installed (CI=true requires it; apt-get install redis-server): %v", err)
		}
		t.Skipf("redis-server is not installed: %v", err)
	}
	ctx, cancel := context.WithTimeout(t.Context(), testBound+time.Minute)
	defer cancel()
	bins := buildBinaries(t, ctx)
	f, err := cluster.Start(ctx, cluster.Options{
		Bins:              bins,
		Dir:               t.TempDir(),
		Mode:              cluster.Central,
		Replicas:          2,
		DataPlanes:        2,
		Rate:              rate,
		Burst:             burst,
		UpgradeLimit:      100000,
		UpgradeWindow:     10 * time.Second,
		ControlPlaneAdmin: true,
		Broker:            true,
		TokenTTL:          time.Minute,
		RedisAOF:          true,
		Backups:           true,
	})
	if err != nil {
		t.Fatalf("start fleet: %v", err)
	}
	t.Cleanup(func() {
		f.Close()
		if t.Failed() {
			for _, l := range f.Logs() {
				b, _ := os.ReadFile(l)
				t.Logf("---- %s ----\n%s", filepath.Base(l), lastLines(string(b), 40))
			}
		}
	})
	client := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 16}}
	t.Cleanup(client.CloseIdleConnections)
	opt, err := redis.ParseURL(f.RedisURL())
	if err != nil {
		t.Fatal(err)
	}
	raw := redis.NewClient(opt)
	t.Cleanup(func() { _ = raw.Close() })
	d := &durability{harness: harness{t: t, f: f, client: client}, raw: raw, bins: bins}
	d.waitAgents(ctx, 2)
	for i := range f.DataPlanes {
		d.mustTurn(ctx, i)
	}
	d.scoped = filepath.Join(t.TempDir(), "team-a.token")
	if out, err := f.ControlPlane.Ctl(ctx, "agent", "create", "team-a", "--accounts", cluster.Account, "--out", d.scoped); err != nil {
		t.Fatalf("clodexctl agent create: %v\n%s", err, out)
	}
	d.intact(ctx, rate)

	t.Run("FlushAllUnderLoad", func(t *testing.T) {
		d.t = t
		// A refresh forced right after the loss: the broker takes the
		// refresh lease in a store that lost it, once for the fleet.
		refreshed := make(chan error, 1)
		res, took := d.underLoad(ctx, "FLUSHALL", func() error {
			if err := raw.FlushAll(ctx).Err(); err != nil {
				return err
			}
			go func() { refreshed <- d.forceRefresh(ctx, f.ControlPlanes[1]) }()
			return nil
		})
		if err := <-refreshed; err != nil {
			t.Errorf("a refresh forced after the FLUSHALL: %v", err)
		}
		d.flushTurns = res
		d.figures = append(d.figures, fmt.Sprintf("FLUSHALL: state back in redis %.2fs after it; turns %d ok, %d failed", took.Seconds(), res.OK, res.Failed))
		d.intact(ctx, rate)
		d.loggedOnce("redis lost data; writing the durable state back", 2)
	})

	t.Run("RedisKilledAndRestartedWithItsAOF", func(t *testing.T) {
		d.t = t
		res, took := d.underLoad(ctx, "kill -9 and a restart with the AOF", func() error {
			if _, err := f.ControlPlane.SetRate(ctx, rate-1, burst); err != nil {
				return err
			}
			if err := d.forceRefresh(ctx, f.ControlPlane); err != nil {
				return err
			}
			f.RedisKill() // within the AOF's second: the change and the refresh may be lost
			return f.RedisRestart(ctx, true)
		})
		d.figures = append(d.figures, fmt.Sprintf("kill -9 + restart with the AOF: state back %.2fs after the kill; turns %d ok, %d failed", took.Seconds(), res.OK, res.Failed))
		d.intact(ctx, rate-1)
		if _, err := f.ControlPlane.SetRate(ctx, rate, burst); err != nil {
			t.Fatal(err)
		}
	})

	t.Run("RedisRestartedWithoutPersistence", func(t *testing.T) {
		d.t = t
		res, took := d.underLoad(ctx, "a restart without persistence", func() error { return f.RedisRestart(ctx, false) })
		d.figures = append(d.figures, fmt.Sprintf("restart without persistence: state back %.2fs after it; turns %d ok, %d failed", took.Seconds(), res.OK, res.Failed))
		d.intact(ctx, rate)
	})

	t.Run("GarbageRecords", func(t *testing.T) {
		d.t = t
		key := account.Key(cluster.Account)
		garbage := map[string][2]string{ // key -> field, value
			"clodex:policies":     {key, "not a policy"},
			"clodex:login:" + key: {"data", "{not json"},
			"clodex:agentcreds":   {"team-a", "{not json"},
			"clodex:quotas":       {key, "{not json"},
			"clodex:a:" + key:     {"s", "not a state"},
		}
		opened := make([]string, len(f.ControlPlanes))
		for i, cp := range f.ControlPlanes {
			opened[i] = d.metric(ctx, cp, "clodex_controlplane_redis_breaker_opened_total")
		}
		res, _ := d.underLoad(ctx, "garbage in every kind of record", func() error {
			for k, fv := range garbage {
				if err := raw.HSet(ctx, k, fv[0], fv[1]).Err(); err != nil {
					return err
				}
			}
			return nil
		})
		d.figures = append(d.figures, fmt.Sprintf("garbage in each record: turns %d ok, %d failed", res.OK, res.Failed))
		// The policy stays unreadable (an operator sets it again), shown
		// with its key and the last good rate; the rest was repaired.
		out, err := f.ControlPlane.Ctl(ctx, "get", cluster.Account)
		if err != nil || !strings.Contains(string(out), "UNREADABLE") || !strings.Contains(string(out), "clodex:policies field "+key) || !strings.Contains(string(out), fmt.Sprintf("%d/min", rate)) {
			t.Errorf("get with a garbage policy = %v\n%s; want it unreadable, named, at the last good %d/min", err, out, rate)
		}
		if out, err := f.ControlPlane.Ctl(ctx, "quota"); err != nil {
			t.Errorf("quota with a garbage report: %v\n%s", err, out)
		}
		for i, cp := range f.ControlPlanes {
			if m := d.metric(ctx, cp, "clodex_controlplane_redis_breaker_opened_total"); m != opened[i] {
				t.Errorf("replica %d: breaker opened %s times before the garbage, %s after; want no more", i, opened[i], m)
			}
		}
		if _, err := f.ControlPlane.SetRate(ctx, rate, burst); err != nil {
			t.Fatal(err)
		}
		d.intact(ctx, rate)
	})

	t.Run("EveryReplicaRestartedAgainstAnEmptyRedis", func(t *testing.T) {
		d.t = t
		res, took := d.underLoad(ctx, "every replica restarted against an empty Redis", func() error {
			for _, cp := range f.ControlPlanes {
				cp.Kill()
			}
			if err := raw.FlushAll(ctx).Err(); err != nil {
				return err
			}
			for _, cp := range f.ControlPlanes {
				if err := cp.Restart(ctx); err != nil {
					return err
				}
			}
			return nil
		})
		d.figures = append(d.figures, fmt.Sprintf("every replica restarted against an empty Redis, with backups: state back %.2fs after the FLUSHALL; turns %d ok, %d failed", took.Seconds(), res.OK, res.Failed))
		d.intact(ctx, rate)
		if !d.logged("restored the durable state from this replica's newest backup") {
			t.Error("no replica logged that it restored the store from its backup")
		}
	})

	t.Run("AnotherCredentialKey", func(t *testing.T) {
		d.t = t
		other := filepath.Join(t.TempDir(), "other.key")
		if err := atomicfile.WriteFile(other, []byte(base64.StdEncoding.EncodeToString([]byte(strings.Repeat("k", 32)))+"\n"), 0o600); err != nil {
			t.Fatal(err)
		}
		for _, mode := range [][]string{{"--check-config"}, {"--listen", "127.0.0.1:0"}} {
			args := append(mode, "--redis", f.RedisURL(), "--replica", "cp-other", "--credential-key-file", other,
				"--admin-token-file", f.ControlPlane.AdminTokenFile(), "--agent-token-file", f.ControlPlane.AgentTokenFile())
			cctx, cancel := context.WithTimeout(ctx, 30*time.Second)
			out, err := exec.CommandContext(cctx, bins.ControlPlane, args...).CombinedOutput()
			cancel()
			if err == nil || !strings.Contains(string(out), "--credential-key-file "+other) || !strings.Contains(string(out), "sealed with another key") {
				t.Errorf("clodex-controlplane %s with another key = %v\n%s; want it refused naming %s", mode[0], err, out, other)
			}
		}
		d.intact(ctx, rate)
	})

	t.Run("EveryReplicaRestartedWithoutABackup", func(t *testing.T) {
		d.t = t
		for _, cp := range f.ControlPlanes {
			cp.Kill()
			if err := os.RemoveAll(cp.BackupDir()); err != nil {
				t.Fatal(err)
			}
		}
		if err := raw.FlushAll(ctx).Err(); err != nil {
			t.Fatal(err)
		}
		for _, cp := range f.ControlPlanes {
			if err := cp.Restart(ctx); err != nil {
				t.Fatal(err)
			}
		}
		if !d.logged("there is no backup: starting a new, empty store") {
			t.Error("no replica said it started a new, empty store")
		}
	})

	st, err := f.Sim.Stats(ctx, client)
	if err != nil {
		t.Fatal(err)
	}
	if st.RefreshReuseDetected != 0 {
		t.Errorf("emulator refresh_reuse_detected = %d; want 0 (a refresh token was presented twice)", st.RefreshReuseDetected)
	}
	// Each refresh was made by one replica: the replicas' logs count the
	// emulator's refreshes exactly.
	logged := 0
	for _, l := range f.Logs() {
		if strings.HasPrefix(filepath.Base(l), "cp-") {
			b, _ := os.ReadFile(l)
			logged += strings.Count(string(b), "access token refreshed")
		}
	}
	if int64(logged) != st.TokenRefreshes {
		t.Errorf("the replicas logged %d refreshes; the emulator counted %d", logged, st.TokenRefreshes)
	}
	t.Logf("durability: %s; emulator: %d token refreshes, refresh_token_reused %d", strings.Join(d.figures, "; "), st.TokenRefreshes, st.RefreshReuseDetected)
}

// durability is TestDurability's harness.
type durability struct {
	harness
	raw        *redis.Client
	bins       cluster.Binaries
	scoped     string // the scoped agent credential's token file
	figures    []string
	flushTurns cluster.LoadResult
}

// underLoad runs a fleet load for 6 s with fault 2 s in, fails on any turn
// that failed, and returns the load and how long after the fault began
// the durable state was back in Redis.
func (d *durability) underLoad(ctx context.Context, what string, fault func() error) (cluster.LoadResult, time.Duration) {
	d.t.Helper()
	bases := make([]string, len(d.f.DataPlanes))
	for i, dp := range d.f.DataPlanes {
		bases[i] = dp.BaseURL
	}
	type faulted struct {
		took time.Duration
		err  error
	}
	done := make(chan faulted, 1)
	go func() {
		if err := sleepUntil(ctx, time.Now().Add(2*time.Second)); err != nil {
			done <- faulted{err: err}
			return
		}
		start := time.Now()
		if err := fault(); err != nil {
			done <- faulted{err: err}
			return
		}
		done <- faulted{took: d.waitBack(ctx, start), err: ctx.Err()}
	}()
	res, err := cluster.RunLoad(ctx, cluster.LoadConfig{
		BaseURLs: bases, Agents: 2, Duration: 6 * time.Second, Drain: 30 * time.Second,
		Retry: cluster.Retry{MaxRetries: 10}, Client: d.client,
	})
	fr := <-done
	if err != nil {
		d.t.Fatalf("load: %v", err)
	}
	if fr.err != nil {
		d.t.Fatalf("%s: %v", what, fr.err)
	}
	d.t.Logf("%s under load: %d turns ok, %d failed, %d unfinished, %d 429s retried; the durable state back in redis %v after it began",
		what, res.OK, res.Failed, res.Unfinished, res.Retries, fr.took.Round(time.Millisecond))
	if res.Failed != 0 || res.Unfinished != 0 || res.OK == 0 {
		d.t.Errorf("%s: %d turns failed %v, %d unfinished, %d ok; want none failed", what, res.Failed, res.Reasons, res.Unfinished, res.OK)
	}
	return res, fr.took
}

// waitBack polls Redis until the store's epoch, the account's policy and
// sign-in and the scoped credential are there, and returns how long after
// start that was (bounded by 60 s).
func (d *durability) waitBack(ctx context.Context, start time.Time) time.Duration {
	key := account.Key(cluster.Account)
	for time.Since(start) < time.Minute && ctx.Err() == nil {
		if d.raw.Exists(ctx, "clodex:epoch").Val() == 1 && d.raw.HExists(ctx, "clodex:policies", key).Val() &&
			d.raw.HExists(ctx, "clodex:login:"+key, "data").Val() && d.raw.HExists(ctx, "clodex:agentcreds", "team-a").Val() {
			return time.Since(start)
		}
		time.Sleep(20 * time.Millisecond)
	}
	d.t.Errorf("the durable state was not back in redis within a minute")
	return time.Since(start)
}

// intact checks, through every replica, that nothing durable was lost or
// replaced by a default: the account's policy at rate, custom; its
// sign-in, refreshable; the scoped agent credential, listed and honoured.
func (d *durability) intact(ctx context.Context, rate int) {
	d.t.Helper()
	for i, cp := range d.f.ControlPlanes {
		var v struct {
			Rate       int    `json:"rate_per_minute"`
			Custom     bool   `json:"custom"`
			Unreadable string `json:"unreadable"`
		}
		if out, err := cp.Ctl(ctx, "get", cluster.Account, "-o", "json"); err != nil || json.Unmarshal(out, &v) != nil || v.Rate != rate || !v.Custom || v.Unreadable != "" {
			d.t.Errorf("replica %d: get = %+v (%v); want the custom rate %d", i, v, err, rate)
		}
		var logins []struct {
			Key   string `json:"key"`
			State string `json:"state"`
		}
		if out, err := cp.Ctl(ctx, "account", "list", "-o", "json"); err != nil || json.Unmarshal(out, &logins) != nil || len(logins) != 1 || logins[0].State != "ok" {
			d.t.Errorf("replica %d: account list = %+v (%v); want the account's sign-in, ok", i, logins, err)
		}
		if out, err := cp.Ctl(ctx, "agent", "list"); err != nil || !strings.Contains(string(out), "team-a") || strings.Contains(string(out), "UNREADABLE") {
			d.t.Errorf("replica %d: agent list = %v\n%s; want team-a", i, err, out)
		}
		// A replica learns a credential another one created within a
		// second (it reloads them every fleet tick).
		creds := credentialClient(d.t, cp.Addr, d.scoped)
		var err error
		for deadline := time.Now().Add(5 * time.Second); ; {
			cctx, cancel := context.WithTimeout(ctx, 15*time.Second)
			_, err = creds.GetToken(cctx, &controlplanev1.GetTokenRequest{Account: account.Key(cluster.Account)})
			cancel()
			if status.Code(err) != codes.Unauthenticated || time.Now().After(deadline) {
				break
			}
			time.Sleep(100 * time.Millisecond)
		}
		if err != nil {
			d.t.Errorf("replica %d: GetToken with the scoped credential: %v", i, err)
		}
	}
}

// loggedOnce checks that every replica's current log holds what exactly
// once at most, and that n logs hold it.
func (d *durability) loggedOnce(what string, n int) {
	d.t.Helper()
	found := 0
	for _, l := range d.f.Logs() {
		if !strings.HasPrefix(filepath.Base(l), "cp-") {
			continue
		}
		b, _ := os.ReadFile(l)
		switch c := strings.Count(string(b), what); {
		case c > 1:
			d.t.Errorf("%s logs %q %d times; want once", filepath.Base(l), what, c)
		case c == 1:
			found++
		}
	}
	if found != n {
		d.t.Errorf("%d replica logs hold %q; want %d", found, what, n)
	}
}

// logged reports whether a replica's log holds what.
func (d *durability) logged(what string) bool {
	for _, l := range d.f.Logs() {
		if b, _ := os.ReadFile(l); strings.HasPrefix(filepath.Base(l), "cp-") && strings.Contains(string(b), what) {
			return true
		}
	}
	return false
}

// forceRefresh asks cp for the account's token as a data plane does after
// an upstream 401 (the current token's digest as rejected): the broker
// refreshes once, under the account's lease.
func (d *durability) forceRefresh(ctx context.Context, cp *cluster.ControlPlane) error {
	c := credentialClient(d.t, cp.Addr, cp.AgentTokenFile())
	key := account.Key(cluster.Account)
	cctx, cancel := context.WithTimeout(ctx, 20*time.Second)
	defer cancel()
	cur, err := c.GetToken(cctx, &controlplanev1.GetTokenRequest{Account: key})
	if err != nil {
		return fmt.Errorf("get the current token: %w", err)
	}
	sum := sha256.Sum256([]byte(cur.GetAccessToken()))
	next, err := c.GetToken(cctx, &controlplanev1.GetTokenRequest{Account: key, RejectedSha256: sum[:]})
	if err != nil {
		return fmt.Errorf("force a refresh: %w", err)
	}
	if next.GetAccessToken() == cur.GetAccessToken() {
		return errors.New("force a refresh: the same token came back")
	}
	return nil
}

// metric returns the value of an unlabelled metric on cp's /metrics.
func (d *durability) metric(ctx context.Context, cp *cluster.ControlPlane, name string) string {
	d.t.Helper()
	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+cp.AdminAddr+"/metrics", nil)
	resp, err := d.client.Do(req)
	if err != nil {
		d.t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	for _, line := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(line, name+" "); ok {
			return v
		}
	}
	return "absent"
}

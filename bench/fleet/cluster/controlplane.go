package cluster

import (
	"context"
	"crypto/rand"
	"encoding/base64"
	"encoding/hex"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"time"

	"github.com/clodex/clodex/internal/atomicfile"
)

// ControlPlane is a clodex-controlplane that can be killed and restarted
// on the same address with the same data directory.
type ControlPlane struct {
	f          *Fleet
	p          *proc
	restarts   int
	replica    string // the replica id over Redis; "" on the memory store
	Addr       string // gRPC host:port
	AdminAddr  string // host:port of /metrics, "" when off
	adminToken string // path
	agentToken string // path
	dataDir    string
	backupDir  string // "" without Options.Backups
}

var redisReady = regexp.MustCompile(`Ready to accept connections`)

// startRedis runs redis-server on a free loopback port for the replicas
// to share: without persistence, or with an AOF (Options.RedisAOF).
func (f *Fleet) startRedis(ctx context.Context) error {
	addr, err := freeAddr()
	if err != nil {
		return err
	}
	f.redisAddr, f.redisURL = addr, "redis://"+addr
	f.redisDir = filepath.Join(f.opts.Dir, "redis")
	return f.runRedis(ctx, f.opts.RedisAOF)
}

// runRedis starts redis-server on the fleet's Redis address, keeping its
// data in an AOF when persist is set.
func (f *Fleet) runRedis(ctx context.Context, persist bool) error {
	o := f.opts
	bin := o.Bins.RedisServer
	if bin == "" {
		var err error
		if bin, err = exec.LookPath("redis-server"); err != nil {
			return fmt.Errorf("start redis-server for %d control-plane replicas: %w (apt-get install redis-server)", o.Replicas, err)
		}
	}
	_, port, _ := net.SplitHostPort(f.redisAddr)
	if err := os.MkdirAll(f.redisDir, 0o700); err != nil {
		return fmt.Errorf("start redis-server: %w", err)
	}
	args := []string{"--port", port, "--bind", "127.0.0.1", "--save", "", "--appendonly", "no", "--dir", f.redisDir}
	if persist {
		args = []string{"--port", port, "--bind", "127.0.0.1", "--save", "", "--appendonly", "yes", "--appendfsync", "everysec", "--dir", f.redisDir}
	}
	var p *proc
	var err error
	for range 50 { // the port of a killed server is normally free at once
		p, _, err = startProc(ctx, "redis-server", bin, args, f.env, filepath.Join(o.Dir, fmt.Sprintf("redis.%d.log", f.redisRuns)), redisReady, o.ReadyTimeout)
		if err == nil || ctx.Err() != nil {
			break
		}
		if err := sleep(ctx, 100*time.Millisecond); err != nil {
			return err
		}
	}
	if err != nil {
		return err
	}
	f.redisRuns++
	f.redis = p
	f.log.Info("redis-server ready", "addr", f.redisAddr, "persist", persist)
	return nil
}

// RedisKill kills the replicas' redis-server with SIGKILL (as kill -9
// does) and waits for it.
func (f *Fleet) RedisKill() {
	if f.redis != nil {
		f.redis.kill()
	}
}

// RedisRestart kills the replicas' redis-server and starts a new one on
// the same address: with persist, with its AOF (what it had written to
// disk comes back); without, empty (a Redis restarted without
// persistence) and keeping nothing from then on.
func (f *Fleet) RedisRestart(ctx context.Context, persist bool) error {
	f.RedisKill()
	if !persist {
		if err := os.RemoveAll(f.redisDir); err != nil {
			return fmt.Errorf("restart redis-server: %w", err)
		}
	}
	return f.runRedis(ctx, persist)
}

// startControlPlane starts control plane i: the only one, on the memory
// store, or replica i over the fleet's Redis. Replicas share the tokens.
func (f *Fleet) startControlPlane(ctx context.Context, i int) error {
	o := f.opts
	addr, err := freeAddr()
	if err != nil {
		return err
	}
	cp := &ControlPlane{
		f:          f,
		Addr:       addr,
		adminToken: filepath.Join(o.Dir, "admin.token"),
		agentToken: filepath.Join(o.Dir, "agent.token"),
		dataDir:    filepath.Join(o.Dir, "controlplane"),
	}
	if f.redisURL != "" {
		cp.replica = fmt.Sprintf("cp-%d", i)
	}
	if o.Backups {
		cp.backupDir = filepath.Join(o.Dir, fmt.Sprintf("backups-%d", i))
	}
	if o.ControlPlaneAdmin {
		if cp.AdminAddr, err = freeAddr(); err != nil {
			return err
		}
	}
	if i == 0 {
		for _, path := range []string{cp.adminToken, cp.agentToken} {
			if err := atomicfile.WriteFile(path, []byte(randomToken()+"\n"), 0o600); err != nil {
				return fmt.Errorf("start control plane: %w", err)
			}
		}
		if o.Broker {
			key := make([]byte, 32)
			_, _ = rand.Read(key)
			f.CredentialKey = filepath.Join(o.Dir, "credential.key")
			if err := atomicfile.WriteFile(f.CredentialKey, []byte(base64.StdEncoding.EncodeToString(key)+"\n"), 0o600); err != nil {
				return fmt.Errorf("start control plane: %w", err)
			}
		}
		f.ControlPlane = cp
	}
	f.ControlPlanes = append(f.ControlPlanes, cp)
	return cp.start(ctx)
}

// controlPlaneAddrs is the data planes' --control-plane value: every
// replica's address.
func (f *Fleet) controlPlaneAddrs() string {
	addrs := make([]string, len(f.ControlPlanes))
	for i, cp := range f.ControlPlanes {
		addrs[i] = cp.Addr
	}
	return strings.Join(addrs, ",")
}

// start runs the control plane process and waits until it answers an
// admin call.
func (cp *ControlPlane) start(ctx context.Context) error {
	o := cp.f.opts
	args := []string{
		"--listen", cp.Addr,
		"--admin-token-file", cp.adminToken,
		"--agent-token-file", cp.agentToken,
		"--log-level", "info",
	}
	name := "controlplane"
	if cp.replica != "" {
		args = append(args, "--redis", cp.f.redisURL, "--replica", cp.replica)
		name = cp.replica
	} else {
		args = append(args, "--data-dir", cp.dataDir)
	}
	if cp.AdminAddr != "" {
		args = append(args, "--admin-listen", cp.AdminAddr)
	}
	if cp.backupDir != "" {
		args = append(args, "--backup-dir", cp.backupDir)
	}
	if o.Broker {
		args = append(args, "--credential-key-file", cp.f.CredentialKey, "--token-endpoint", cp.f.Sim.URL+"/oauth/token")
	}
	logPath := filepath.Join(o.Dir, fmt.Sprintf("%s.%d.log", name, cp.restarts))
	p, _, err := startProc(ctx, "clodex-controlplane", o.Bins.ControlPlane, args, cp.f.env, logPath, nil, 0)
	if err != nil {
		return err
	}
	cp.p = p
	// Ready when an admin RPC answers (accounts needs no stored account).
	deadline := time.Now().Add(o.ReadyTimeout)
	for {
		_, err := cp.Ctl(ctx, "accounts")
		if err == nil {
			break
		}
		if p.exited() {
			return fmt.Errorf("start clodex-controlplane: exited (%v); log %s:\n%s", p.waitErr, logPath, tail(logPath))
		}
		if time.Now().After(deadline) || ctx.Err() != nil {
			p.kill()
			return fmt.Errorf("start clodex-controlplane: not answering after %v: %w; log %s:\n%s", o.ReadyTimeout, err, logPath, tail(logPath))
		}
		if err := sleep(ctx, 100*time.Millisecond); err != nil {
			p.kill()
			return err
		}
	}
	cp.f.log.Info("clodex-controlplane ready", "addr", cp.Addr, "admin", cp.AdminAddr, "start", cp.restarts)
	return nil
}

// RedisURL is the replicas' Redis ("" with one control plane).
func (f *Fleet) RedisURL() string { return f.redisURL }

// AgentTokenFile is the fleet's agent token file.
func (cp *ControlPlane) AgentTokenFile() string { return cp.agentToken }

// DataDir is the control plane's --data-dir (unused over Redis).
func (cp *ControlPlane) DataDir() string { return cp.dataDir }

// BackupDir is the control plane's --backup-dir ("" without
// Options.Backups).
func (cp *ControlPlane) BackupDir() string { return cp.backupDir }

// AdminTokenFile is the fleet's admin token file.
func (cp *ControlPlane) AdminTokenFile() string { return cp.adminToken }

// Kill sends SIGKILL to the control plane and waits for it to die.
func (cp *ControlPlane) Kill() {
	if cp.p != nil {
		cp.p.kill()
	}
}

// Restart starts the control plane again on the same address and data
// directory (after Kill).
func (cp *ControlPlane) Restart(ctx context.Context) error {
	cp.Kill()
	cp.restarts++
	return cp.start(ctx)
}

func randomToken() string {
	b := make([]byte, 24)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}

// sleep waits d or until ctx ends.
func sleep(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

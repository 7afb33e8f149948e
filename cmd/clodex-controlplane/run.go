package main

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"log/slog"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"golang.org/x/sync/errgroup"

	"github.com/clodex/clodex/controlplane"
	"github.com/clodex/clodex/controlplane/broker"
	"github.com/clodex/clodex/controlplane/console"
	"github.com/clodex/clodex/controlplane/store"
	"github.com/clodex/clodex/controlplane/store/redisstore"
	"github.com/clodex/clodex/internal/memlimit"
	"github.com/clodex/clodex/internal/pacing"
	"github.com/clodex/clodex/internal/telemetry"
	"github.com/clodex/clodex/internal/tlsconfig"
)

func run(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	return runEnv(ctx, args, os.LookupEnv, stdout, stderr, nil)
}

// listening receives the bound addresses once the server accepts (tests
// use it to learn ports chosen by the kernel). adminAddr is "" when the
// admin listener is off.
type listening func(grpcAddr, adminAddr string)

// runEnv is run with the environment and a readiness hook injected.
func runEnv(ctx context.Context, args []string, lookupEnv func(string) (string, bool), stdout, stderr io.Writer, ready listening) error {
	cfg, err := loadConfig(args, lookupEnv, stdout)
	if errors.Is(err, errHelp) {
		return nil
	}
	if err != nil {
		return err
	}
	if cfg.Version {
		fmt.Fprintln(stdout, "clodex-controlplane", version)
		return nil
	}
	if err := cfg.Validate(); err != nil {
		return fmt.Errorf("invalid configuration: %w", err)
	}
	level, _ := parseLevel(cfg.LogLevel)
	hopts := &slog.HandlerOptions{Level: level}
	var handler slog.Handler = slog.NewTextHandler(stderr, hopts)
	if cfg.LogFormat == "json" {
		handler = slog.NewJSONHandler(stderr, hopts)
	}
	log := slog.New(handler)
	if cfg.Redis != "" {
		// go-redis's own lines (its pool's dial failures) join the
		// structured log, at most one per redisstore.ClientLogEvery.
		redisstore.LogClientTo(log, nil)
	}
	lim, _ := memlimit.Parse(cfg.MemoryLimit) // checked by Validate
	tuneMemory(lim, lookupEnv, os.DirFS("/"), log)

	adminTok, agentTok, warnings, err := cfg.tokens()
	if err != nil {
		return err
	}
	metricsTok, warning, err := cfg.metricsToken()
	if err != nil {
		return err
	}
	if warning != "" {
		warnings = append(warnings, warning)
	}
	for _, w := range warnings {
		log.Warn(w)
	}
	tlsCfg, err := tlsconfig.Server(cfg.TLSCert, cfg.TLSKey, cfg.ClientCA)
	if err != nil {
		return err
	}
	var notices pacing.Notices
	for _, n := range cfg.Notices {
		notices.Emit(n, func(msg string) { log.Warn(msg, "notice", n.Key) })
	}
	if !cfg.Defaults.Enabled() {
		log.Warn("pacing is off for accounts without a stored policy", "rate_per_minute", cfg.Defaults.RatePerMinute,
			"wait_bound_ms", cfg.Defaults.Budget.WaitBound.Milliseconds())
	}
	var credKey broker.Key
	if cfg.CredentialKeyFile != "" {
		if credKey, err = broker.ReadKeyFile(cfg.CredentialKeyFile); err != nil {
			return fmt.Errorf("--credential-key-file: %w", err)
		}
	}
	if cfg.CheckConfig {
		if err := checkStart(ctx, cfg, lookupEnv, credKey, log); err != nil {
			return fmt.Errorf("check config: %w", err)
		}
		fmt.Fprintln(stdout, "configuration ok")
		return nil
	}
	if cfg.Redis != "" && cfg.BackupDir == "" {
		log.Warn(noBackupDir)
	}
	reg := telemetry.NewRegistry()
	backups, err := openBackups(cfg, credKey, log, reg)
	if err != nil {
		return err
	}
	st, err := openStore(ctx, cfg, log, reg, backups)
	if err != nil {
		return err
	}
	defer st.close()

	instance := instanceID()
	shutdownTelemetry, err := telemetry.Setup(ctx, telemetry.Config{
		ServiceName: "clodex-controlplane", Version: version, InstanceID: instance, LookupEnv: lookupEnv,
	})
	if err != nil {
		return err
	}
	defer func() {
		sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
		defer cancel()
		if err := shutdownTelemetry(sctx); err != nil {
			log.Warn("telemetry shutdown", "err", err)
		}
	}()

	logins, err := openLogins(cfg, st, log, backups)
	if err != nil {
		return err
	}
	if cfg.RotateKeyFile != "" {
		return rotateKey(ctx, cfg, logins, credKey, stdout)
	}
	var sealer store.Sealer
	if !credKey.IsZero() {
		// A replica with another key refuses to start rather than fail
		// every refresh.
		if err := broker.CheckKey(ctx, logins, credKey, cfg.CredentialKeyFile, false); err != nil {
			return err
		}
		sealer = credKey.BackupSealer()
	}
	var brk *broker.Broker
	if !credKey.IsZero() {
		brk, err = broker.New(broker.Options{Logins: logins, Key: credKey, TokenEndpoint: cfg.TokenEndpoint, Logger: log, Registerer: reg})
		if err != nil {
			return err
		}
	}
	// The admin listener first: the console's sign-in links name its
	// address, and the server issues them.
	var lc net.ListenConfig
	var adminLis net.Listener
	var links *console.Links
	if cfg.AdminListen != "" {
		adminLis, err = lc.Listen(ctx, "tcp", cfg.AdminListen)
		if err != nil {
			return fmt.Errorf("admin listen: %w", err)
		}
		defer adminLis.Close() // a failed start; the admin server closes it otherwise
		if links, err = console.NewLinks(consoleURL(cfg.ConsoleURL, adminLis.Addr()), st.now); err != nil {
			return fmt.Errorf("--console-url: %w", err)
		}
	}
	var consoleLinks controlplane.ConsoleLinks // nil without an admin listener: the RPC says so
	if links != nil {
		consoleLinks = links
	}
	srv, err := controlplane.New(controlplane.Options{
		ConsoleLinks:  consoleLinks,
		Broker:        brk,
		AgentCreds:    logins,
		Members:       logins,
		MemberBuckets: st.memberBuckets,
		Durable:       st.durable,
		BackupSealer:  sealer,
		Admissions:    st.admissions,
		Policies:      st.policies,
		Agents:        st.agents,
		Roster:        st.roster,
		Quotas:        st.quotas,
		Usage:         st.usage,
		MemberMetrics: cfg.MemberMetrics,
		PolicyChanges: st.watch,
		AdminToken:    adminTok,
		AgentToken:    agentTok,
		TLS:           tlsCfg,
		Logger:        log,
		Now:           st.now,
		Registerer:    reg,
		EnableBench:   cfg.BenchService,
		ShutdownGrace: cfg.ShutdownGrace,

		MaxAccountsPerCredential: cfg.MaxAgentAccounts,
		AgentCredChanges:         st.credChanges,
		DrainDelay:               cfg.DrainDelay,
	})
	if err != nil {
		return err
	}
	defer srv.Stop() // ends its stream workers when it is not served (a listen failure); no-op after Serve

	lis, err := lc.Listen(ctx, "tcp", cfg.Listen)
	if err != nil {
		return fmt.Errorf("listen: %w", err)
	}
	info := st.policies.Info()
	log.Info("starting", "version", version, "instance", instance, "store", info.Kind, "store_address", info.Address,
		"replica", info.Replica, "default_rate_per_minute", cfg.Defaults.RatePerMinute, "default_burst", cfg.Defaults.Burst)

	var admin http.Handler
	var con *console.Console
	if adminLis != nil {
		facts := map[string]string{
			"service": "clodex-controlplane", "version": version, "instance": instance,
			"listen": lis.Addr().String(), "tls": fmt.Sprint(tlsCfg != nil),
			"store": info.Kind, "store_address": info.Address, "replica": info.Replica,
		}
		con, err = console.New(console.Config{Admin: srv.Admin(), Links: links, Logger: log, Now: st.now})
		if err != nil {
			_ = lis.Close()
			return err
		}
		admin, err = telemetry.AdminHandler(reg, telemetry.AdminOptions{Listen: cfg.AdminListen, Token: metricsTok, Pprof: cfg.Pprof, Facts: facts,
			Console: con.Handler()})
		if err != nil {
			_ = lis.Close()
			return err
		}
	}

	g, gctx := errgroup.WithContext(ctx)
	g.Go(func() error { return srv.Serve(gctx, lis) })
	g.Go(func() error { return st.run(gctx) })
	if backups != nil {
		g.Go(func() error { return backups.Run(gctx, st.backupState, st.changes, st.changed) })
		log.Info("backups", "dir", backups.Dir(), "sealed", sealer != nil)
	}
	if brk != nil {
		g.Go(func() error { return brk.Run(gctx) }) // refreshes logins ahead of expiry
		log.Info("credential broker", "token_endpoint", cfg.TokenEndpoint)
	}
	if adminLis != nil {
		hs := &http.Server{
			Handler:           admin,
			ReadHeaderTimeout: 10 * time.Second,
			ErrorLog:          slog.NewLogLogger(handler, slog.LevelWarn),
		}
		g.Go(func() error {
			if err := hs.Serve(adminLis); !errors.Is(err, http.ErrServerClosed) {
				return fmt.Errorf("admin serve: %w", err)
			}
			return nil
		})
		g.Go(func() error {
			<-gctx.Done()
			sctx, cancel := context.WithTimeout(context.WithoutCancel(gctx), 5*time.Second)
			defer cancel()
			return hs.Shutdown(sctx)
		})
		g.Go(func() error { return con.Run(gctx) })
		log.Info("admin listener", "addr", adminLis.Addr().String(), "console", links.Base()+"/console/")
	}
	if ready != nil {
		adminAddr := ""
		if adminLis != nil {
			adminAddr = adminLis.Addr().String()
		}
		ready(lis.Addr().String(), adminAddr)
	}
	err = g.Wait()
	log.Info("stopped")
	return err
}

// consoleURL is the console's base URL: the configured one, else the
// admin listener's address (localhost for an unspecified host).
func consoleURL(configured string, addr net.Addr) string {
	if configured != "" {
		return configured
	}
	host, port, err := net.SplitHostPort(addr.String())
	if err != nil {
		return "http://" + addr.String()
	}
	if ip := net.ParseIP(host); ip == nil || ip.IsUnspecified() {
		host = "localhost"
	}
	return "http://" + net.JoinHostPort(host, port)
}

// servedStore is the store a start serves from: the memory store
// (policies under --data-dir) or, with --redis, the Redis store.
type servedStore struct {
	admissions controlplane.Admitter
	policies   controlplane.PolicyStore
	agents     controlplane.AgentCounter
	roster     controlplane.AgentRoster // nil: one control plane lists its own agents
	quotas     controlplane.QuotaStore
	// memberBuckets holds the members' caps.
	memberBuckets controlplane.MemberBuckets
	usage         controlplane.UsageLedger
	changes       func() uint64              // counts durable changes, for backups
	watch         controlplane.PolicyWatcher // nil: no other replica changes policies
	// credChanges tells of the agent credentials other replicas change;
	// nil: no other replica does.
	credChanges controlplane.AgentCredWatcher
	// now is the clock the server decides on: Redis's for Redis.
	now func() time.Time
	// logins keeps the logins and scoped agent credentials when the
	// replicas share them (Redis); nil: the data dir's logins.json.
	logins loginStore
	// memory is the memory store (nil over Redis); durable takes the
	// snapshots of the durable state and restores them (for the memory
	// store, set once the logins file is open).
	memory  *store.Memory
	durable controlplane.DurableStore
	// backupState is what a backup holds, and changed signals a change
	// (nil: none; backups poll changes).
	backupState func(context.Context) (store.Snapshot, error)
	changed     <-chan struct{}
	// run does the store's background work: memory forgets idle
	// accounts; Redis registers the replica, reads its clock, delivers
	// notifications and probes.
	run func(context.Context) error
	// close releases the store.
	close func()
}

// noBackupDir warns a replica over Redis without backups.
const noBackupDir = "no --backup-dir: the replicas' memory is the only copy of the policies and sign-ins besides Redis; if every replica restarts against an empty Redis, they are lost (set --backup-dir on a volume)"

// openBackups opens --backup-dir (nil without it), sealing with the
// credential key when there is one.
func openBackups(cfg *config, key broker.Key, log *slog.Logger, reg prometheus.Registerer) (*store.BackupDir, error) {
	if cfg.BackupDir == "" {
		return nil, nil
	}
	opts := store.BackupOptions{Dir: cfg.BackupDir, Replica: cfg.Replica, Logger: log, Registerer: reg}
	if !key.IsZero() {
		opts.Sealer = key.BackupSealer()
	}
	b, err := store.OpenBackupDir(opts)
	if err != nil {
		return nil, fmt.Errorf("--backup-dir: %w", err)
	}
	return b, nil
}

// newestOf is b's Newest (nil without backups).
func newestOf(b *store.BackupDir) func() (store.Snapshot, string, []string, error) {
	if b == nil {
		return nil
	}
	return b.Newest
}

// openStore opens the store a start serves from.
func openStore(ctx context.Context, cfg *config, log *slog.Logger, reg prometheus.Registerer, backups *store.BackupDir) (*servedStore, error) {
	if cfg.Redis == "" {
		if err := os.MkdirAll(cfg.DataDir, 0o700); err != nil {
			return nil, fmt.Errorf("create data dir: %w", &store.WriteError{Dir: cfg.DataDir, Err: err})
		}
		m, err := store.Open(store.Options{Dir: cfg.DataDir, Defaults: &cfg.Defaults, ColdStart: cfg.ColdStart, Logger: log, Backup: newestOf(backups)})
		if err != nil {
			return nil, err
		}
		return &servedStore{admissions: m, policies: m, agents: m, quotas: m, memberBuckets: m, usage: m, memory: m, now: time.Now, run: m.Run, close: func() {}}, nil
	}
	r, err := redisstore.Open(ctx, redisstore.Options{
		URL: cfg.Redis, Prefix: cfg.RedisPrefix, Defaults: &cfg.Defaults, Timeout: cfg.RedisTimeout, MaxTimeout: cfg.RedisMaxTimeout,
		Replica: cfg.Replica, Logger: log, Registerer: reg, Backup: newestOf(backups),
	})
	if err != nil {
		return nil, err
	}
	return &servedStore{
		admissions: r, policies: r, agents: r, roster: r, quotas: r, memberBuckets: r, usage: r, watch: r, credChanges: r,
		now: r.Now, logins: r, durable: r, backupState: r.BackupState, changes: r.Changes, changed: r.Changed(),
		run: r.Run, close: func() { _ = r.Close() },
	}, nil
}

// loginStore keeps the broker's logins, the key canary, the scoped agent
// credentials and the members.
type loginStore interface {
	broker.Logins
	broker.CanaryStore
	controlplane.AgentCredStore
	controlplane.MemberStore
}

// openLogins opens where the logins and scoped agent credentials live:
// Redis when the replicas share one, else the data dir's logins.json (and
// then completes st's durable state with it).
func openLogins(cfg *config, st *servedStore, log *slog.Logger, backups *store.BackupDir) (loginStore, error) {
	if st.logins != nil {
		return st.logins, nil
	}
	f, err := store.OpenLoginFile(store.LoginOptions{Dir: cfg.DataDir, Logger: log, Backup: newestOf(backups)})
	if err != nil {
		return nil, err
	}
	ds := store.DirState{Policies: st.memory, Logins: f, Replica: cfg.Replica}
	st.durable, st.backupState, st.changes = ds, ds.Snapshot, ds.Changes
	return f, nil
}

// rotateKey re-seals every sign-in under --rotate-credential-key's key
// (--rotate-credential-key), then returns.
func rotateKey(ctx context.Context, cfg *config, logins loginStore, old broker.Key, stdout io.Writer) error {
	next, err := broker.ReadKeyFile(cfg.RotateKeyFile)
	if err != nil {
		return fmt.Errorf("--rotate-credential-key: %w", err)
	}
	n, err := broker.RotateKey(ctx, logins, old, next, cfg.CredentialKeyFile)
	if err != nil {
		return err
	}
	fmt.Fprintf(stdout, "re-sealed %d sign-ins under %s (no refresh); restart every replica with --credential-key-file %s\n", n, cfg.RotateKeyFile, cfg.RotateKeyFile)
	return nil
}

// checkStart makes the checks a start makes beyond the flags, the token
// files and the TLS files (checked before it): the store (the data dir is
// writable and its files decode, or Redis answers and keeps its data on
// disk), the credential key (it opens the store's sign-ins), the backup
// dir and the telemetry environment. Warnings go to log. It binds no
// listener (a running instance may hold them) and creates nothing but the
// data dir's short-lived write-check file (and, with the credential
// broker, its leases directory).
func checkStart(ctx context.Context, cfg *config, lookupEnv func(string) (string, bool), key broker.Key, log *slog.Logger) error {
	var errs []error
	if cfg.Redis != "" {
		if err := redisstore.Check(ctx, cfg.Redis, cfg.RedisTimeout); err != nil {
			errs = append(errs, err)
		} else {
			if warning, note, err := redisstore.Persistence(ctx, cfg.Redis, cfg.RedisTimeout); err != nil {
				errs = append(errs, err)
			} else if warning != "" {
				log.Warn(warning)
			} else if note != "" {
				log.Info(note)
			}
			if !key.IsZero() {
				if err := checkRedisKey(ctx, cfg, key); err != nil {
					errs = append(errs, err)
				}
			}
		}
		if cfg.BackupDir == "" {
			log.Warn(noBackupDir)
		}
	} else if err := checkDataDir(ctx, cfg, key, log); err != nil {
		errs = append(errs, err)
	}
	if cfg.BackupDir != "" {
		if err := checkDirFor(cfg.BackupDir); err != nil {
			errs = append(errs, fmt.Errorf("--backup-dir: %w", err))
		}
	}
	shutdown, err := telemetry.Setup(ctx, telemetry.Config{ServiceName: "clodex-controlplane", Version: version, LookupEnv: lookupEnv})
	if err != nil {
		errs = append(errs, err)
	} else {
		sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
		defer cancel()
		_ = shutdown(sctx) // nothing was traced
	}
	return joinLine(errs)
}

// checkRedisKey opens the store's key canary with key, writing nothing.
func checkRedisKey(ctx context.Context, cfg *config, key broker.Key) error {
	sealed, place, err := redisstore.ReadKeyCanary(ctx, cfg.Redis, cfg.RedisPrefix, cfg.RedisTimeout)
	if err != nil {
		return err
	}
	return broker.CheckKey(ctx, readCanary{sealed: sealed, place: place}, key, cfg.CredentialKeyFile, true)
}

// readCanary is a canary read once, for a read-only check.
type readCanary struct {
	sealed []byte
	place  string
}

func (c readCanary) KeyCanary(context.Context) ([]byte, error) { return c.sealed, nil }

func (c readCanary) PutKeyCanary(context.Context, []byte, bool) error {
	return errors.New("a read-only check writes no canary")
}

func (c readCanary) KeyCanaryPlace() string { return c.place }

// checkDirFor proves dir writable, or (when it does not exist yet)
// creatable: its nearest existing ancestor must be a writable directory.
func checkDirFor(dir string) error {
	dir = filepath.Clean(dir)
	if _, err := os.Stat(dir); errors.Is(err, fs.ErrNotExist) {
		parent := dir
		for {
			next := filepath.Dir(parent)
			if next == parent {
				break
			}
			parent = next
			if _, err := os.Stat(parent); err == nil {
				break
			}
		}
		if err := store.CheckDir(parent); err != nil {
			return fmt.Errorf("%s does not exist and cannot be created: %w", dir, err)
		}
		return nil
	}
	return store.CheckDir(dir)
}

// checkDataDir checks the data dir as a start would, writing nothing but
// the write check: it is writable, its policy.json and logins.json decode
// (or a start would put their last good copies back, which is warned
// about), and the credential key opens its sign-ins. A data dir that does
// not exist yet must be creatable.
func checkDataDir(ctx context.Context, cfg *config, key broker.Key, log *slog.Logger) error {
	dir := filepath.Clean(cfg.DataDir)
	if _, err := os.Stat(dir); errors.Is(err, fs.ErrNotExist) {
		if err := checkDirFor(dir); err != nil {
			return fmt.Errorf("data dir %w", err)
		}
		return nil
	}
	if err := store.CheckDir(dir); err != nil {
		return fmt.Errorf("open store: %w", err)
	}
	warnings, err := store.CheckDataFiles(dir)
	for _, w := range warnings {
		log.Warn(w)
	}
	if err != nil {
		return err
	}
	if !key.IsZero() {
		// The broker's logins.json is read as a start does (which creates
		// its leases directory, as a start would).
		f, err := store.OpenLogins(dir)
		if err != nil {
			return err
		}
		if err := broker.CheckKey(ctx, f, key, cfg.CredentialKeyFile, true); err != nil {
			return err
		}
	}
	return nil
}

func instanceID() string {
	b := make([]byte, 6)
	_, _ = rand.Read(b)
	host, _ := os.Hostname()
	return host + "-" + hex.EncodeToString(b)
}

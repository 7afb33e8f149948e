package pool

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/clodex/clodex/dataplane/retry"
	"github.com/clodex/clodex/dataplane/upstream"
	"github.com/clodex/clodex/internal/codexauth"
)

// Default retention policy (docs/pool.md §5 and §9).
const (
	DefaultNurseryIdleTTL = 5 * time.Minute
	DefaultIdleTTL        = 30 * time.Minute
	DefaultHardTTL        = 55 * time.Minute
	DefaultRotateAge      = 50 * time.Minute
	DefaultMaxSocketAge   = 58 * time.Minute
)

// Default keepalive of idle heads (see Config.KeepaliveInterval).
const (
	DefaultKeepaliveInterval = time.Minute
	DefaultKeepaliveTimeout  = 15 * time.Second
)

// Env names of the optional caps; see [CapsFromEnv].
const (
	EnvMaxConnections        = "CLODEX_WS_MAX_CONNECTIONS"
	EnvMaxNurseryConnections = "CLODEX_WS_MAX_NURSERY_CONNECTIONS"
)

// Credentials gives each new socket its credential, read at dial time (a
// refreshed token is used by new sockets; existing heads keep theirs).
type Credentials interface {
	// Credential returns the current credential of account, the
	// partition's Partition.Account ("" when it names none).
	Credential(ctx context.Context, account string) (codexauth.Credential, error)
}

// CredentialsFunc adapts a function to [Credentials].
type CredentialsFunc func(ctx context.Context, account string) (codexauth.Credential, error)

// Credential calls f.
func (f CredentialsFunc) Credential(ctx context.Context, account string) (codexauth.Credential, error) {
	return f(ctx, account)
}

// Admitter is asked before the pool dials a NEW socket for a request: a new
// head, a parallel head, an unpartitioned socket, a rotation, or the
// replacement of a socket the request continued ([Lease.Replace]). It is
// never asked on reuse, nor for the replacement of a socket the request
// was itself admitted for. It may block while it waits out a granted delay
// and may return a refusal, which the pool returns wrapped to the caller
// (whose retry loop decides what to do). When its context is cancelled
// during a wait (the request went away, or a head it can continue freed
// up) it should hand back what it reserved, as the data plane's admission
// client does with the control plane's Cancel.
type Admitter interface {
	Admit(ctx context.Context, account string) error
}

// AdmitterFunc adapts a function to [Admitter].
type AdmitterFunc func(ctx context.Context, account string) error

// Admit calls f.
func (f AdmitterFunc) Admit(ctx context.Context, account string) error { return f(ctx, account) }

// Config configures [New]. New copies it; it is never modified.
type Config struct {
	// Upstream is what every new socket is dialled with (Optional: its
	// zero value dials the Codex backend): URL, version, HTTP client, read
	// limit, logger. Its Credential and OnFrame are the pool's to set for
	// each socket.
	Upstream upstream.DialOptions
	// Credentials gives each new socket its credential (Required).
	Credentials Credentials
	// Admitter paces new sockets (Optional; nil admits every dial).
	Admitter Admitter
	// Health is the upstream's failure memory (Optional; nil gates
	// nothing; give the gateway the same one). While the upstream
	// (upstream.Key of Upstream.URL) is unreachable a new socket is refused
	// at once with a *retry.DownError, before admission and without a dial,
	// until the next probe is due. A dial that opens no socket
	// (*upstream.UnreachableError) is recorded as Unreachable; one the
	// backend answered (a socket, or an upgrade refused below 500) as
	// Reached.
	Health *retry.Health
	// OnFrame is called with every text frame a socket reads, with the
	// socket's account (Optional; only for partitions that name one). It
	// runs synchronously on the socket's reader: it must not block.
	OnFrame func(account string, frame []byte)
	// OnForbidden is called when the backend refuses a new socket's
	// upgrade with 403, with the partition's account and the Retry-After
	// header's whole seconds (at most an hour; 0 when absent or not a
	// positive number) (Optional; only for partitions that name an
	// account). It runs synchronously on the dialing request's goroutine.
	OnForbidden func(account string, retryAfter time.Duration)
	// Clock returns the current time (Optional; default time.Now). Every
	// TTL, promotion and rotation decision reads it.
	Clock func() time.Time
	// Logger receives debug lines (Optional; default discards).
	Logger *slog.Logger
	// Notify receives the one-time user notice on file-descriptor
	// exhaustion (Optional; default: a warning on Logger). It runs
	// synchronously on the dialing request's goroutine.
	Notify func(msg string)
	// ProbeDescriptor opens and closes one file descriptor and returns the
	// error (Optional; default opens os.DevNull). It classifies dial errors
	// that hide descriptor exhaustion (a failed DNS lookup). Tests inject it.
	ProbeDescriptor func() error

	// MaxConnections caps established heads (Optional; 0 = unbounded, the
	// default). Reaching it evicts the oldest idle established head.
	MaxConnections int
	// MaxNurseryConnections caps nursery heads (Optional; 0 = unbounded, the
	// default). Reaching it evicts the oldest idle nursery head.
	MaxNurseryConnections int

	// NurseryIdleTTL evicts a nursery head idle this long (Optional; default
	// 5m; never longer than IdleTTL).
	NurseryIdleTTL time.Duration
	// IdleTTL evicts an established head idle this long (Optional; default 30m).
	IdleTTL time.Duration
	// HardTTL evicts a head whose age, not counting time in flight, reaches
	// it (Optional; default 55m).
	HardTTL time.Duration
	// RotateAge replaces a head's socket at its next turn once the socket is
	// this old (Optional; default 50m).
	RotateAge time.Duration
	// MaxSocketAge is the oldest a socket may be used at all; a rotation
	// refused by the Admitter falls back to the old socket only below it
	// (Optional; default 58m; the backend closes sockets at 60m).
	MaxSocketAge time.Duration

	// KeepaliveInterval is how long a head sits idle before the pool pings
	// its socket, and the pause between pings while it stays idle
	// (Optional; default 1m; negative disables pings). A socket that dies
	// without a close frame (a NAT or proxy that dropped it, a peer that
	// vanished) is then dropped within about KeepaliveInterval +
	// KeepaliveTimeout of going silent, not found dead by the next request.
	KeepaliveInterval time.Duration
	// KeepaliveTimeout is how long a ping waits for its pong before the
	// head is dropped (Optional; default 15s).
	KeepaliveTimeout time.Duration

	// Diagnostics receives one ws_head_decision JSON line per request,
	// ws_head_lost lines for idle heads dropped by their watch, and
	// ws_descriptor_exhaustion lines (Optional; nil disables). Writes are
	// serialised; a write error is logged at debug level and ignored.
	Diagnostics io.Writer
	// Registerer receives the pool's metrics (Optional; nil keeps them
	// unregistered).
	Registerer prometheus.Registerer
}

// Validate reports every problem of c at once.
func (c *Config) Validate() error {
	var errs []error
	if c.Credentials == nil {
		errs = append(errs, errors.New("Credentials is required"))
	}
	if c.MaxConnections < 0 {
		errs = append(errs, fmt.Errorf("MaxConnections is %d; allowed: 0 (unbounded) or a positive integer", c.MaxConnections))
	}
	if c.MaxNurseryConnections < 0 {
		errs = append(errs, fmt.Errorf("MaxNurseryConnections is %d; allowed: 0 (unbounded) or a positive integer", c.MaxNurseryConnections))
	}
	for _, d := range []struct {
		name string
		v    time.Duration
	}{
		{"NurseryIdleTTL", c.NurseryIdleTTL}, {"IdleTTL", c.IdleTTL}, {"HardTTL", c.HardTTL},
		{"RotateAge", c.RotateAge}, {"MaxSocketAge", c.MaxSocketAge}, {"KeepaliveTimeout", c.KeepaliveTimeout},
	} {
		if d.v < 0 {
			errs = append(errs, fmt.Errorf("%s is %v; allowed: 0 (default) or a positive duration", d.name, d.v))
		}
	}
	if c.RotateAge > 0 && c.MaxSocketAge > 0 && c.RotateAge > c.MaxSocketAge {
		errs = append(errs, fmt.Errorf("RotateAge %v exceeds MaxSocketAge %v; allowed: RotateAge <= MaxSocketAge", c.RotateAge, c.MaxSocketAge))
	}
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("pool config: %w", err)
	}
	return nil
}

// withDefaults returns a copy of c with every zero optional field filled.
func (c Config) withDefaults() Config {
	if c.Clock == nil {
		c.Clock = time.Now
	}
	if c.Logger == nil {
		c.Logger = slog.New(slog.DiscardHandler)
	}
	c.Logger = c.Logger.With("component", "dataplane/pool")
	if c.Notify == nil {
		logger := c.Logger
		c.Notify = func(msg string) { logger.Warn(msg) }
	}
	if c.ProbeDescriptor == nil {
		c.ProbeDescriptor = probeDevNull
	}
	def := func(v *time.Duration, d time.Duration) {
		if *v == 0 {
			*v = d
		}
	}
	def(&c.IdleTTL, DefaultIdleTTL)
	def(&c.NurseryIdleTTL, DefaultNurseryIdleTTL)
	c.NurseryIdleTTL = min(c.NurseryIdleTTL, c.IdleTTL)
	def(&c.HardTTL, DefaultHardTTL)
	def(&c.MaxSocketAge, DefaultMaxSocketAge)
	def(&c.RotateAge, min(DefaultRotateAge, c.MaxSocketAge))
	def(&c.KeepaliveInterval, DefaultKeepaliveInterval)
	def(&c.KeepaliveTimeout, DefaultKeepaliveTimeout)
	return c
}

func probeDevNull() error {
	f, err := os.Open(os.DevNull)
	if err != nil {
		return err
	}
	return f.Close()
}

// ParseCap parses the value of a CLODEX_WS_MAX_* variable: "" means
// unbounded (0); otherwise it must be a positive integer.
func ParseCap(name, value string) (int, error) {
	v := strings.TrimSpace(value)
	if v == "" {
		return 0, nil
	}
	n, err := strconv.Atoi(v)
	if err != nil || n <= 0 {
		return 0, fmt.Errorf("%s=%q is not a positive integer; allowed: a positive integer, or unset for no cap", name, value)
	}
	return n, nil
}

// CapsFromEnv reads the two optional caps through getenv (the config
// loader passes os.Getenv). A malformed value is ignored (unbounded) and
// reported through notice once per call; call it once per process.
func CapsFromEnv(getenv func(string) string, notice func(msg string)) (maxConnections, maxNurseryConnections int) {
	read := func(name string) int {
		n, err := ParseCap(name, getenv(name))
		if err != nil {
			if notice != nil {
				notice("clodex: ignoring " + err.Error())
			}
			return 0
		}
		return n
	}
	return read(EnvMaxConnections), read(EnvMaxNurseryConnections)
}

package redisstore

import (
	"context"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"
)

// ClientLogEvery is how often go-redis's own log lines reach the log
// while they keep coming: during an outage its connection pool writes one
// for every failed dial (about four a second per replica, with the
// breaker's probe), which say nothing the breaker's own line does not.
const ClientLogEvery = 10 * time.Second

// LogClientTo sends go-redis's own log lines (its connection pool's "failed
// to dial" and the like, which it otherwise prints raw to stderr as
// "redis: 2026/… pool.go:770: …") to log as WARN records "redis client",
// at most one per ClientLogEvery: the first at once, then the next due one
// with how many were left out in between (suppressed). go-redis keeps one
// logger per process (redis.SetLogger), so this is process-wide: the
// control plane calls it once at start. now is the clock (nil: time.Now).
func LogClientTo(log *slog.Logger, now func() time.Time) {
	redis.SetLogger(newClientLog(log, now))
}

// clientLog is go-redis's logger (the Printf of its internal.Logging).
type clientLog struct {
	log *slog.Logger
	now func() time.Time

	mu         sync.Mutex // guards the following fields
	last       time.Time  // when the last line was logged; zero: none yet
	suppressed int
}

func newClientLog(log *slog.Logger, now func() time.Time) *clientLog {
	if now == nil {
		now = time.Now
	}
	return &clientLog{log: log, now: now}
}

// Printf logs one of go-redis's lines, or counts it while the last one is
// younger than ClientLogEvery.
func (c *clientLog) Printf(ctx context.Context, format string, v ...any) {
	t := c.now()
	c.mu.Lock()
	if !c.last.IsZero() && t.Sub(c.last) < ClientLogEvery {
		c.suppressed++
		c.mu.Unlock()
		return
	}
	n := c.suppressed
	c.last, c.suppressed = t, 0
	c.mu.Unlock()
	msg := strings.TrimPrefix(fmt.Sprintf(format, v...), "redis: ")
	attrs := []slog.Attr{slog.String("detail", msg)}
	if n > 0 {
		attrs = append(attrs, slog.Int("suppressed", n)) // lines left out since the last one logged
	}
	if ctx == nil {
		ctx = context.Background()
	}
	c.log.LogAttrs(ctx, slog.LevelWarn, "redis client", attrs...)
}

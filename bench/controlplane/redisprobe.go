package main

import (
	"context"
	"fmt"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"
)

// redisProbe reads what redis-server spent over a measurement: its CPU
// time from /proc/PID/stat and the admit script's calls and time from
// INFO commandstats (cmdstat_evalsha: the Redis store runs every script
// with EVALSHA, and under the bench only Admit's).
type redisProbe struct {
	client *redis.Client
	pid    int
	clkTck int
}

// redisStats is one reading.
type redisStats struct {
	cpu   time.Duration // user + system
	calls int64
	usec  int64
}

// newRedisProbe probes the redis-server at addr (host:port) running as
// pid; clkTck is the kernel's clock ticks a second (getconf CLK_TCK).
func newRedisProbe(addr string, pid, clkTck int) *redisProbe {
	return &redisProbe{client: redis.NewClient(&redis.Options{Addr: addr, MaxRetries: -1, PoolSize: 1}), pid: pid, clkTck: clkTck}
}

func (p *redisProbe) close() { _ = p.client.Close() }

// read returns the current reading.
func (p *redisProbe) read(ctx context.Context) (redisStats, error) {
	var s redisStats
	stat, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", p.pid))
	if err != nil {
		return s, fmt.Errorf("read redis-server's CPU time: %w", err)
	}
	if s.cpu, err = cpuTime(string(stat), p.clkTck); err != nil {
		return s, fmt.Errorf("read redis-server's CPU time: %w", err)
	}
	info, err := p.client.Info(ctx, "commandstats").Result()
	if err != nil {
		return s, fmt.Errorf("redis-server INFO commandstats: %w", err)
	}
	s.calls, s.usec = commandStats(info, "evalsha")
	return s, nil
}

// cpuTime is utime + stime of a /proc/PID/stat line (fields 14 and 15,
// counted after the parenthesised command name, which may hold spaces).
func cpuTime(stat string, clkTck int) (time.Duration, error) {
	i := strings.LastIndexByte(stat, ')')
	if i < 0 {
		return 0, fmt.Errorf("malformed stat %q", stat)
	}
	f := strings.Fields(stat[i+1:])
	if len(f) < 13 {
		return 0, fmt.Errorf("malformed stat %q", stat)
	}
	ut, err1 := strconv.ParseInt(f[11], 10, 64)
	st, err2 := strconv.ParseInt(f[12], 10, 64)
	if err1 != nil || err2 != nil || clkTck <= 0 {
		return 0, fmt.Errorf("malformed stat %q", stat)
	}
	return time.Duration(ut+st) * time.Second / time.Duration(clkTck), nil
}

// commandStats returns calls and usec of cmd from INFO commandstats
// ("cmdstat_evalsha:calls=3,usec=42,usec_per_call=14.00,..."), zero when
// cmd never ran.
func commandStats(info, cmd string) (calls, usec int64) {
	for _, line := range strings.Split(info, "\n") {
		rest, ok := strings.CutPrefix(strings.TrimSpace(line), "cmdstat_"+cmd+":")
		if !ok {
			continue
		}
		for _, kv := range strings.Split(rest, ",") {
			k, v, _ := strings.Cut(kv, "=")
			n, _ := strconv.ParseInt(v, 10, 64)
			switch k {
			case "calls":
				calls = n
			case "usec":
				usec = n
			}
		}
	}
	return calls, usec
}

// redisCost is what redis-server spent over samples: CPU per script call
// and the script's own time per call (µs), or zero without calls.
func redisCost(deltas []redisStats) (cpuUs, scriptUs float64, calls int64) {
	var cpu time.Duration
	var usec int64
	for _, d := range deltas {
		cpu += d.cpu
		calls += d.calls
		usec += d.usec
	}
	if calls == 0 {
		return 0, 0, 0
	}
	return float64(cpu.Microseconds()) / float64(calls), float64(usec) / float64(calls), calls
}

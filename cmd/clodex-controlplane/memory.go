package main

import (
	"io/fs"
	"log/slog"
	"math"
	"runtime/debug"

	"github.com/clodex/clodex/internal/memlimit"
)

// defaultGOGC is the control plane's GOGC under a soft memory limit,
// unless the environment sets GOGC. Its live heap is small (buckets,
// agents, policies: a few MB for 10,000 accounts) and Admit under load
// allocates per RPC, so at Go's default of 100 the collector ran very
// often: at 64 Admits in flight on the Redis store, GC took about 15 % of
// the process's CPU; at 400 the CPU per Admit fell by about a fifth in an
// A/B run. 400 lets garbage grow to four times the live heap between
// collections, so it is taken only under a memory limit, which makes the
// collector run as the heap nears the limit, whatever GOGC says. Without
// a limit nothing else would bound that garbage (a flood of large
// messages kept hundreds of MB of it), so the control plane keeps Go's
// default of 100.
const defaultGOGC = 400

// tuneMemory sets the soft memory limit (memlimit.Choose: --memory-limit,
// else GOMEMLIMIT, else the cgroup's) and the GC percent: defaultGOGC
// under a limit, Go's default without one, and GOGC itself when the
// environment sets it. It logs what it chose. The settings are the
// process's: call it once, from runEnv.
func tuneMemory(lim memlimit.Limit, lookupEnv func(string) (string, bool), root fs.FS, log *slog.Logger) {
	c := memlimit.Choose(lim, lookupEnv, root)
	switch {
	case c.Bytes > 0:
		debug.SetMemoryLimit(c.Bytes)
	case c.Source == memlimit.SourceNone && !lim.Auto:
		debug.SetMemoryLimit(math.MaxInt64) // --memory-limit off overrides GOMEMLIMIT
	}
	gogc := tuneGC(lookupEnv, c.Limited())
	attrs := []any{"from", c.Source, "gogc", gogc}
	if c.Limited() {
		attrs = append(attrs, "limit_bytes", debug.SetMemoryLimit(-1))
	}
	if c.Cgroup > 0 {
		attrs = append(attrs, "cgroup_limit_bytes", c.Cgroup)
	}
	if c.CgroupErr != nil {
		attrs = append(attrs, "cgroup_err", c.CgroupErr.Error())
	}
	log.Info("memory limit", attrs...)
}

// tuneGC sets the GC percent when the environment has no GOGC:
// defaultGOGC under a memory limit, else 100. It returns the percent in
// force.
func tuneGC(lookupEnv func(string) (string, bool), limited bool) int {
	if _, ok := lookupEnv("GOGC"); ok {
		p := debug.SetGCPercent(-1)
		debug.SetGCPercent(p)
		return p
	}
	p := 100
	if limited {
		p = defaultGOGC
	}
	debug.SetGCPercent(p)
	return p
}

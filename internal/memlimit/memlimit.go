// Package memlimit chooses a process's soft memory limit (the Go
// runtime's, debug.SetMemoryLimit), so that a process in a container or a
// systemd unit collects its garbage before the kernel kills it:
//
//	lim, err := memlimit.Parse(flagValue)                        // "auto", "off", "400MiB", "1GiB", bytes
//	c := memlimit.Choose(lim, os.LookupEnv, os.DirFS("/"))       // --memory-limit, else GOMEMLIMIT, else the cgroup's
//	if c.Bytes > 0 { debug.SetMemoryLimit(c.Bytes) }
//	log.Info("memory limit", "bytes", c.Bytes, "from", c.Source)
//
// The cgroup's limit is the lowest memory.max (cgroup v2) or
// memory.limit_in_bytes (v1) of the process's cgroup and its ancestors,
// as /proc/self/cgroup names them; the soft limit is CgroupShare of it,
// leaving room for what the runtime does not count (the kernel's socket
// buffers, which a cgroup charges) and for the collector to catch up.
package memlimit

import (
	"bufio"
	"errors"
	"fmt"
	"io/fs"
	"math"
	"path"
	"strconv"
	"strings"
)

// CgroupShare is the part of the cgroup's memory limit the soft limit
// takes by default.
const CgroupShare = 0.9

// Sources of a Choice.
const (
	SourceFlag   = "--memory-limit"
	SourceEnv    = "GOMEMLIMIT"
	SourceCgroup = "cgroup"
	SourceNone   = "none"
)

// Limit is a parsed --memory-limit value.
type Limit struct {
	// Auto derives the limit: GOMEMLIMIT when set, else the cgroup's.
	Auto bool
	// Bytes is an explicit limit; 0 with Auto false turns the limit off.
	Bytes int64
}

// Parse reads a --memory-limit value: "auto" (or empty), "off" (or 0), or
// a size in bytes with an optional unit B, KiB, MiB, GiB or TiB, as
// GOMEMLIMIT takes it ("400MiB").
func Parse(s string) (Limit, error) {
	s = strings.TrimSpace(s)
	switch s {
	case "", "auto":
		return Limit{Auto: true}, nil
	case "off", "0":
		return Limit{}, nil
	}
	n, err := parseSize(s)
	if err != nil {
		return Limit{}, fmt.Errorf("memory limit %q: %w; want auto, off, or a size such as 400MiB or 1GiB (units B, KiB, MiB, GiB, TiB)", s, err)
	}
	return Limit{Bytes: n}, nil
}

// parseSize reads a number with an optional binary unit.
func parseSize(s string) (int64, error) {
	units := []struct {
		suffix string
		mult   int64
	}{{"TiB", 1 << 40}, {"GiB", 1 << 30}, {"MiB", 1 << 20}, {"KiB", 1 << 10}, {"B", 1}}
	mult := int64(1)
	for _, u := range units {
		if v, ok := strings.CutSuffix(s, u.suffix); ok {
			s, mult = v, u.mult
			break
		}
	}
	n, err := strconv.ParseInt(strings.TrimSpace(s), 10, 64)
	switch {
	case err != nil:
		return 0, errors.New("not a whole number of bytes with a unit")
	case n <= 0:
		return 0, errors.New("not positive")
	case n > math.MaxInt64/mult:
		return 0, errors.New("too large")
	}
	return n * mult, nil
}

// Choice is the soft memory limit chosen and where it came from.
type Choice struct {
	// Bytes is the limit to set; 0 sets none (with SourceEnv: the runtime
	// already applied GOMEMLIMIT itself).
	Bytes int64
	// Source is SourceFlag, SourceEnv, SourceCgroup or SourceNone.
	Source string
	// Cgroup is the cgroup's limit the choice was derived from (0: none
	// found), and CgroupErr why it could not be read, if it could not.
	Cgroup    int64
	CgroupErr error
}

// Limited reports whether a soft memory limit is in force.
func (c Choice) Limited() bool { return c.Source != SourceNone }

// Choose picks the soft limit: an explicit --memory-limit (off included);
// else GOMEMLIMIT, which the runtime applied at start (off included); else
// CgroupShare of the cgroup's limit; else none. root is the file system /
// (os.DirFS("/")).
func Choose(l Limit, lookupEnv func(string) (string, bool), root fs.FS) Choice {
	if !l.Auto {
		if l.Bytes == 0 {
			return Choice{Source: SourceNone}
		}
		return Choice{Bytes: l.Bytes, Source: SourceFlag}
	}
	if v, ok := lookupEnv("GOMEMLIMIT"); ok && strings.TrimSpace(v) != "" {
		if strings.TrimSpace(v) == "off" {
			return Choice{Source: SourceNone} // the environment turned it off
		}
		return Choice{Source: SourceEnv}
	}
	cg, err := CgroupLimit(root)
	if err != nil || cg == 0 {
		return Choice{Source: SourceNone, CgroupErr: err}
	}
	return Choice{Bytes: int64(float64(cg) * CgroupShare), Source: SourceCgroup, Cgroup: cg}
}

// unlimited is the least value cgroup v1 writes for "no limit" (the
// largest int64 rounded down to a page).
const unlimited = 1 << 62

// CgroupLimit returns the memory limit of the cgroup the process runs in:
// the lowest limit of its cgroup and their ancestors, under cgroup v2
// (memory.max under sys/fs/cgroup) or v1 (memory.limit_in_bytes under
// sys/fs/cgroup/memory), 0 when none is set. root is the file system /.
func CgroupLimit(root fs.FS) (int64, error) {
	f, err := root.Open("proc/self/cgroup")
	if err != nil {
		return 0, fmt.Errorf("read the process's cgroup: %w", err)
	}
	defer f.Close()
	var v1, v2 string
	found1, found2 := false, false
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		// hierarchy-ID:controller-list:cgroup-path
		parts := strings.SplitN(sc.Text(), ":", 3)
		if len(parts) != 3 {
			continue
		}
		switch {
		case parts[0] == "0" && parts[1] == "":
			v2, found2 = parts[2], true
		case hasController(parts[1], "memory"):
			v1, found1 = parts[2], true
		}
	}
	if err := sc.Err(); err != nil {
		return 0, fmt.Errorf("read the process's cgroup: %w", err)
	}
	// A v1 memory controller is where the limit is when there is one; a
	// hybrid host's v2 hierarchy then has no memory controller.
	if found1 {
		return lowest(root, "sys/fs/cgroup/memory", v1, "memory.limit_in_bytes")
	}
	if found2 {
		return lowest(root, "sys/fs/cgroup", v2, "memory.max")
	}
	return 0, nil
}

func hasController(list, name string) bool {
	for c := range strings.SplitSeq(list, ",") {
		if c == name {
			return true
		}
	}
	return false
}

// lowest reads file in the cgroup at cgPath under mount and in each of
// its ancestors, and returns the lowest limit set (0: none). Inside a
// container the mount's root is the container's own cgroup, so a path
// that does not exist under it is read from the mount's root alone.
func lowest(root fs.FS, mount, cgPath, file string) (int64, error) {
	dir := path.Join(mount, path.Clean("/" + cgPath)[1:])
	if _, err := fs.Stat(root, dir); err != nil {
		dir = mount
	}
	var low int64
	for {
		n, err := readLimit(root, path.Join(dir, file))
		if err != nil {
			return 0, err
		}
		if n > 0 && (low == 0 || n < low) {
			low = n
		}
		if dir == mount {
			return low, nil
		}
		dir = path.Dir(dir)
	}
}

// readLimit reads one limit file: 0 for "max", a v1 value meaning no
// limit, or a missing file (the root cgroup has none).
func readLimit(root fs.FS, name string) (int64, error) {
	b, err := fs.ReadFile(root, name)
	if errors.Is(err, fs.ErrNotExist) {
		return 0, nil
	}
	if err != nil {
		return 0, fmt.Errorf("read /%s: %w", name, err)
	}
	s := strings.TrimSpace(string(b))
	if s == "max" {
		return 0, nil
	}
	n, err := strconv.ParseInt(s, 10, 64)
	if err != nil || n < 0 {
		return 0, fmt.Errorf("read /%s: %q is not a limit in bytes or max", name, s)
	}
	if n >= unlimited {
		return 0, nil
	}
	return n, nil
}

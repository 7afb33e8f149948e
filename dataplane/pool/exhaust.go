package pool

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"slices"
	"syscall"
)

// Descriptor exhaustion (docs/pool.md §8): a dial that fails because the
// process or the system ran out of file descriptors sheds every idle head
// and retries once (dial, in acquire.go); the user is told once per pool.

// Ways descriptor exhaustion was detected.
const (
	detectedByErrorCode = "error_code"
	detectedByProbe     = "descriptor_probe"
)

// DescriptorExhaustionError reports a dial that failed because the process
// (EMFILE) or the system (ENFILE) ran out of file descriptors, after the
// pool shed its idle heads and retried once, or found none to shed.
type DescriptorExhaustionError struct {
	// Errno is syscall.EMFILE or syscall.ENFILE.
	Errno syscall.Errno
	// DetectedBy is "error_code" or "descriptor_probe" (the dial error hid
	// the cause, a probe open of os.DevNull revealed it).
	DetectedBy string
	// Held is how many heads were registered when it happened; Shed how
	// many idle ones were closed to make room.
	Held, Shed int
	// Err is the last dial error.
	Err error
}

func (e *DescriptorExhaustionError) Error() string {
	return fmt.Sprintf("dial upstream: out of file descriptors (%s; %d idle pooled connections shed; to fix, %s): %v",
		limitName(e.Errno), e.Shed, remedy(e.Errno), e.Err)
}

func (e *DescriptorExhaustionError) Unwrap() error { return e.Err }

func errnoName(e syscall.Errno) string {
	if e == syscall.ENFILE {
		return "ENFILE"
	}
	return "EMFILE"
}

func limitName(e syscall.Errno) string {
	if e == syscall.ENFILE {
		return "ENFILE: the system-wide file table is full"
	}
	return "EMFILE: the per-process open-file limit was reached"
}

func remedy(e syscall.Errno) string {
	if e == syscall.ENFILE {
		return "close other programs or raise the system-wide limit (Linux: sysctl fs.file-max; macOS: sysctl kern.maxfiles)"
	}
	return "raise the limit with `ulimit -n` in the shell that starts clodex, or the service's limit (systemd LimitNOFILE, a container's nofile ulimit)"
}

func exhaustionErrno(err error) syscall.Errno {
	switch {
	case errors.Is(err, syscall.EMFILE):
		return syscall.EMFILE
	case errors.Is(err, syscall.ENFILE):
		return syscall.ENFILE
	}
	return 0
}

// shedIdle unregisters every idle head and hard-closes their sockets,
// least recently used first, so their descriptors are free when it
// returns. Busy heads are never touched.
func (p *Pool) shedIdle() (held int, shed []*head) {
	p.mu.Lock()
	held = p.nNursery + p.nEstablish
	for _, pt := range p.parts {
		for _, h := range pt.heads {
			if !h.busy {
				shed = append(shed, h)
			}
		}
	}
	slices.SortFunc(shed, func(a, b *head) int {
		if c := a.lastUsed.Compare(b.lastUsed); c != 0 {
			return c
		}
		return cmp.Compare(a.id, b.id)
	})
	for _, h := range shed {
		p.removeLocked(h)
		p.countEvictionLocked(EvictDescriptorShed, h, nil)
	}
	p.stats.ShedConnections += uint64(len(shed))
	p.stats.DescriptorExhaustions++
	p.metrics.shed.Add(float64(len(shed)))
	p.mu.Unlock()
	closeHeads(shed)
	return held, shed
}

// reportExhaustion tells the user once per pool; later occurrences go to
// the debug log. Every occurrence writes a ws_descriptor_exhaustion record.
func (p *Pool) reportExhaustion(ctx context.Context, errno syscall.Errno, by string, held, shed int) {
	p.mu.Lock()
	first := !p.fdAnnounced
	p.fdAnnounced = true
	p.mu.Unlock()
	if first {
		msg := fmt.Sprintf("clodex: out of file descriptors opening an upstream connection (%s): %d pooled connections were open; closed the %d idle ones and retried. To keep idle conversations cached, %s.",
			limitName(errno), held, shed, remedy(errno))
		if shed == 0 {
			msg = fmt.Sprintf("clodex: out of file descriptors opening an upstream connection (%s): %d pooled connections were open, none idle to close, so the request failed. To fix it, %s.",
				limitName(errno), held, remedy(errno))
		}
		p.cfg.Notify(msg)
	} else {
		p.cfg.Logger.DebugContext(ctx, "descriptor exhaustion on dial",
			"code", errnoName(errno), "detected_by", by, "held", held, "shed", shed)
	}
	if p.cfg.Diagnostics != nil {
		p.writeJSON(descriptorRecord{
			Event:           "ws_descriptor_exhaustion",
			Time:            p.now().UTC(),
			Code:            errnoName(errno),
			DetectedBy:      by,
			HeldConnections: held,
			ShedConnections: shed,
			Announced:       first,
		})
	}
}

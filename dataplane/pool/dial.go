package pool

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/clodex/clodex/dataplane/retry"
	"github.com/clodex/clodex/dataplane/upstream"
)

// Opening a new socket: admit asks the failure memory and the Admitter
// (docs/pool.md §6); dialUpstream dials with the account's credential
// under the failure memory's ticket; dial around it sheds idle heads and
// retries once when the process runs out of file descriptors (§8).

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

// admit asks for a new socket: an upstream known to be unreachable refuses
// it at once (Health.Down), before the Admitter, so that such a refusal
// does not spend the account's admission.
func (p *Pool) admit(ctx context.Context, account string) error {
	if p.cfg.Health != nil {
		if err := p.cfg.Health.Down(p.upstream); err != nil {
			return fmt.Errorf("admit new socket: %w", err)
		}
	}
	if p.cfg.Admitter == nil {
		return nil
	}
	if err := p.cfg.Admitter.Admit(ctx, account); err != nil {
		return fmt.Errorf("admit new socket: %w", err)
	}
	return nil
}

// dial opens a socket. When the dial fails for lack of file descriptors
// (the error says so, or a probe open fails with EMFILE/ENFILE) it closes
// every idle head, oldest first, and retries once.
func (p *Pool) dial(ctx context.Context, part Partition) (*upstream.Conn, error) {
	conn, err := p.dialUpstream(ctx, part)
	if err == nil {
		return conn, nil
	}
	if ctx.Err() != nil {
		return nil, err
	}
	errno, by := exhaustionErrno(err), detectedByErrorCode
	if errno == 0 {
		if perr := p.cfg.ProbeDescriptor(); perr != nil {
			errno, by = exhaustionErrno(perr), detectedByProbe
		}
	}
	if errno == 0 {
		return nil, err
	}
	held, shed := p.shedIdle()
	p.reportExhaustion(ctx, errno, by, held, len(shed))
	if len(shed) == 0 {
		return nil, &DescriptorExhaustionError{Errno: errno, DetectedBy: by, Held: held, Err: err}
	}
	conn, err = p.dialUpstream(ctx, part)
	if err != nil {
		return nil, &DescriptorExhaustionError{Errno: errno, DetectedBy: by, Held: held, Shed: len(shed), Err: err}
	}
	return conn, nil
}

// dialUpstream opens one socket for part: its account's current
// credential, the failure memory's ticket around the dial, and the hooks
// of Config (frames watched, a 403 reported).
func (p *Pool) dialUpstream(ctx context.Context, part Partition) (*upstream.Conn, error) {
	cred, err := p.cfg.Credentials.Credential(ctx, part.Account)
	if err != nil {
		return nil, &retry.CredentialError{Err: fmt.Errorf("dial upstream: get credential: %w", err)}
	}
	var ticket *retry.DialTicket // nil-safe: a nil Health gates nothing
	if p.cfg.Health != nil {
		if ticket, err = p.cfg.Health.Dial(p.upstream); err != nil {
			return nil, err
		}
		defer ticket.Done()
	}
	opts := p.cfg.Upstream
	opts.Credential = cred
	opts.OnFrame = p.frameHook(part.Account)
	c, err := upstream.Dial(ctx, opts)
	if err == nil {
		ticket.Reached()
		return c, nil
	}
	var unreach *upstream.UnreachableError
	var ue *upstream.UpgradeError
	refused := errors.As(err, &ue)
	switch {
	case ctx.Err() != nil:
	case errors.As(err, &unreach):
		ticket.Unreachable(err)
	case refused:
		ticket.Reached() // the backend answered: up
	}
	if refused && ue.Status == http.StatusForbidden && p.cfg.OnForbidden != nil && part.Account != "" {
		p.cfg.OnForbidden(part.Account, parseRetryAfter(ue.RetryAfter))
	}
	return nil, err
}

// parseRetryAfter reads a refused upgrade's Retry-After header: whole
// seconds, at most an hour; 0 when absent or not a positive number.
func parseRetryAfter(v string) time.Duration {
	if secs, err := strconv.Atoi(strings.TrimSpace(v)); err == nil && secs > 0 {
		return time.Duration(min(secs, 3600)) * time.Second
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

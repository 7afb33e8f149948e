package controlplane

import (
	"cmp"
	"context"
	"fmt"
	"log/slog"
	"net"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc/peer"
)

// Reasons a call is denied, the reason label of
// clodex_controlplane_denied_total.
const (
	// DenyUnauthenticated: no token, or not a token this server knows.
	DenyUnauthenticated = "unauthenticated"
	// DenyPermission: the agent token called an admin RPC.
	DenyPermission = "permission_denied"
	// DenyUnknownAccount: Admit (or a hand-over) for an account that no
	// operator configured and no registered agent serves.
	DenyUnknownAccount = "unknown_account"
	// DenyAccountCap: an agent credential tried to register more accounts
	// than it may.
	DenyAccountCap = "account_cap"
	// DenyTooLarge: a request message over its method's receive limit
	// (recvlimits.go).
	DenyTooLarge = "too_large"
)

// MaxDeniedPeers bounds the peer label of clodex_controlplane_denied_total:
// the first this many caller addresses denied get their own label, the
// rest share "other".
const MaxDeniedPeers = 100

// DeniedLogInterval is the longest a denial waits to be logged: the first
// denial after a quiet interval is logged at once, the ones after it in
// one line per interval (from the next denial or the fleet loop, whichever
// comes first) saying how many were denied, why and from where.
const DeniedLogInterval = time.Minute

// maxLoggedPeers bounds the addresses one log line names; the rest are
// summed as others.
const maxLoggedPeers = 10

// otherPeer is the peer label shared past MaxDeniedPeers.
const otherPeer = "other"

// denials counts denied calls in a metric and summarises them in the log.
type denials struct {
	log     *slog.Logger
	now     func() time.Time
	counter *prometheus.CounterVec // reason, peer

	mu        sync.Mutex // guards the following fields
	labeled   map[string]bool
	lastLine  time.Time // when the last line was logged; zero before any
	total     int       // denials since the last line
	byReason  map[string]int
	byPeer    map[string]int // at most maxLoggedPeers addresses
	others    int            // denials from addresses past maxLoggedPeers
	lastCall  string         // the method of the last denial
	lastPeer  string
	firstSeen time.Time // the first denial since the last line
}

func newDenials(log *slog.Logger, now func() time.Time) *denials {
	return &denials{
		log: log,
		now: now,
		counter: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "clodex_controlplane_denied_total",
			Help: "Calls refused by reason (unauthenticated, permission_denied, unknown_account, account_cap, too_large) and caller address (IP; the first 100 addresses, the rest as \"other\").",
		}, []string{"reason", "peer"}),
		labeled:  map[string]bool{},
		byReason: map[string]int{},
		byPeer:   map[string]int{},
	}
}

// peerIP is the caller's IP address from ctx ("" when unknown): the port
// changes with every connection, so it is left out.
func peerIP(ctx context.Context) string {
	p, ok := peer.FromContext(ctx)
	if !ok || p.Addr == nil {
		return ""
	}
	s := p.Addr.String()
	if host, _, err := net.SplitHostPort(s); err == nil {
		return host
	}
	return s
}

// record counts one denial of method for reason from ctx's peer, and logs
// at once when no line was logged for DeniedLogInterval.
func (d *denials) record(ctx context.Context, method, reason string) {
	ip := peerIP(ctx)
	if ip == "" {
		ip = "unknown"
	}
	now := d.now()
	d.mu.Lock()
	label := ip
	if !d.labeled[ip] {
		if len(d.labeled) < MaxDeniedPeers {
			d.labeled[ip] = true
		} else {
			label = otherPeer
		}
	}
	if d.total == 0 {
		d.firstSeen = now
	}
	d.total++
	d.byReason[reason]++
	if _, ok := d.byPeer[ip]; ok || len(d.byPeer) < maxLoggedPeers {
		d.byPeer[ip]++
	} else {
		d.others++
	}
	d.lastCall, d.lastPeer = method, ip
	var line []slog.Attr
	if d.lastLine.IsZero() || now.Sub(d.lastLine) >= DeniedLogInterval {
		line = d.takeLocked(now)
	}
	d.mu.Unlock()
	d.counter.WithLabelValues(reason, label).Inc()
	if line != nil {
		d.log.LogAttrs(ctx, slog.LevelWarn, "rpc denied", line...)
	}
}

// flush logs the denials not yet logged once DeniedLogInterval has passed
// since the last line; the fleet loop calls it, so a flood that stops is
// still reported within an interval.
func (d *denials) flush(ctx context.Context) {
	now := d.now()
	d.mu.Lock()
	var line []slog.Attr
	if d.total > 0 && now.Sub(d.lastLine) >= DeniedLogInterval {
		line = d.takeLocked(now)
	}
	d.mu.Unlock()
	if line != nil {
		d.log.LogAttrs(ctx, slog.LevelWarn, "rpc denied", line...)
	}
}

// takeLocked returns the attributes of a line for the denials since the
// last one and starts a new interval.
func (d *denials) takeLocked(now time.Time) []slog.Attr {
	peers := make([]string, 0, len(d.byPeer))
	for ip := range d.byPeer {
		peers = append(peers, ip)
	}
	slices.SortFunc(peers, func(a, b string) int {
		return cmp.Or(cmp.Compare(d.byPeer[b], d.byPeer[a]), strings.Compare(a, b))
	})
	from := make([]string, 0, len(peers)+1)
	for _, ip := range peers {
		from = append(from, fmt.Sprintf("%s=%d", ip, d.byPeer[ip]))
	}
	if d.others > 0 {
		from = append(from, fmt.Sprintf("others=%d", d.others))
	}
	reasons := make([]string, 0, len(d.byReason))
	for r, n := range d.byReason {
		reasons = append(reasons, fmt.Sprintf("%s=%d", r, n))
	}
	slices.Sort(reasons)
	attrs := []slog.Attr{
		slog.Int("denied", d.total),
		slog.String("from", strings.Join(from, ",")),
		slog.String("reasons", strings.Join(reasons, ",")),
		slog.String("method", d.lastCall),
		slog.String("peer", d.lastPeer),
		slog.Duration("over", now.Sub(d.firstSeen)),
	}
	d.lastLine = now
	d.total, d.others = 0, 0
	clear(d.byReason)
	clear(d.byPeer)
	return attrs
}

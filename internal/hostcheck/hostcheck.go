// Package hostcheck holds the checks every clodex HTTP listener applies
// to who is calling, shared by the data plane's API listener and the
// admin listeners (/metrics, /debug) of both planes:
//
//	p, err := hostcheck.New(listenAddr, allowedOrigins)
//	if ref := p.Check(r); ref != nil { /* refuse, naming ref's header */ }
//
// Check applies both rules:
//
//   - a listener bound to loopback answers only requests whose Host is a
//     loopback name or address (LoopbackHost): a web page that rebinds
//     its own DNS name to 127.0.0.1 still sends that name, and is refused;
//   - a request carrying an Origin header (a browser's) is refused unless
//     the origin is allow-listed (NormalizeOrigin; the admin listeners
//     allow none).
//
// Each listener words its own answer (docs/errors.md §7,
// docs/operations.md §12).
package hostcheck

import (
	"errors"
	"net"
	"net/http"
	"net/netip"
	"net/url"
	"strings"
)

// LoopbackAddr reports whether a listen address ("host:port") binds only
// loopback interfaces. ":port", 0.0.0.0 and [::] are not loopback.
func LoopbackAddr(addr string) bool {
	host, _, err := net.SplitHostPort(addr)
	if err != nil {
		host = addr
	}
	return LoopbackHost(host)
}

// LoopbackHost reports whether host (without a port; brackets allowed) is
// localhost or a loopback address.
func LoopbackHost(host string) bool {
	host = strings.TrimSuffix(strings.TrimPrefix(host, "["), "]")
	if strings.EqualFold(host, "localhost") {
		return true
	}
	ip, err := netip.ParseAddr(host)
	return err == nil && ip.IsLoopback()
}

// NormalizeOrigin reduces an origin to lowercase scheme://host[:port].
func NormalizeOrigin(o string) (string, error) {
	o = strings.TrimSuffix(strings.TrimSpace(o), "/")
	u, err := url.Parse(o)
	if err != nil || u.Scheme == "" || u.Host == "" || (u.Path != "" && u.Path != "/") || u.RawQuery != "" {
		return "", errors.New("want an origin such as http://localhost:3000 (scheme and host, no path)")
	}
	return strings.ToLower(u.Scheme + "://" + u.Host), nil
}

// Policy is the check of one listener. Build it with New.
type Policy struct {
	loopback bool
	origins  map[string]bool
}

// New returns the policy of a listener on listenAddr that allows the
// given origins (none: every request with an Origin header is refused).
// A bad origin is an error naming it.
func New(listenAddr string, origins []string) (*Policy, error) {
	p := &Policy{loopback: LoopbackAddr(listenAddr), origins: make(map[string]bool, len(origins))}
	for _, o := range origins {
		n, err := NormalizeOrigin(o)
		if err != nil {
			return nil, err
		}
		p.origins[n] = true
	}
	return p, nil
}

// Loopback reports whether the listener is bound to loopback only.
func (p *Policy) Loopback() bool { return p.loopback }

// Refusal is a request the policy refuses: Header is "Host" or "Origin",
// Value what the request carried.
type Refusal struct {
	Header string
	Value  string
}

// Check returns nil when r may be served, else why not.
func (p *Policy) Check(r *http.Request) *Refusal {
	if ref := p.CheckHost(r); ref != nil {
		return ref
	}
	if origin, ok := r.Header["Origin"]; ok {
		o := ""
		if len(origin) > 0 {
			o = origin[0]
		}
		n, err := NormalizeOrigin(o)
		if err != nil || !p.origins[n] {
			return &Refusal{Header: "Origin", Value: o}
		}
	}
	return nil
}

// CheckHost applies the Host rule alone: for a path that checks Origin
// itself (the web console allows its own origin).
func (p *Policy) CheckHost(r *http.Request) *Refusal {
	if !p.loopback {
		return nil
	}
	host := r.Host
	if h, _, err := net.SplitHostPort(host); err == nil {
		host = h
	}
	if !LoopbackHost(host) {
		return &Refusal{Header: "Host", Value: r.Host}
	}
	return nil
}

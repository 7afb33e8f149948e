// Package cptarget parses a --control-plane value, the replicas a data
// plane or clodexctl talks to, into a gRPC target:
//
//	t, err := cptarget.Parse("cp-1:17700,cp-2:17700")
//	conn, err := grpc.NewClient(t.Target, append(opts, t.DialOptions()...)...)
//
// Both planes' clients and the operator's CLI take the same value, so one
// list written for the data planes works for clodexctl too.
package cptarget

import (
	"errors"
	"fmt"
	"net"
	"strings"

	"google.golang.org/grpc"
	"google.golang.org/grpc/resolver"
	"google.golang.org/grpc/resolver/manual"
)

// listScheme is the resolver scheme of a list. The resolver is registered
// on the one connection only (grpc.WithResolvers).
const listScheme = "clodex-controlplanes"

// MaxAddrs bounds the addresses of one list.
const MaxAddrs = 64

// Targets is a parsed --control-plane value.
type Targets struct {
	// Target is the gRPC target to dial.
	Target string
	// Addrs are the listed replicas, host:port each, in order; nil when
	// the value named one address (whose name may resolve to several
	// replicas) or a dns:/// target.
	Addrs []string
}

// Parse parses a --control-plane value:
//
//   - "host:port": one address; a name with several A/AAAA records is
//     every replica behind it (re-resolved when a connection fails);
//   - "a:17700,b:17700": a list of replicas;
//   - "dns:///host:port" (or "dns://resolver/host:port"): gRPC's DNS
//     target, as the first form.
//
// Every address needs a port.
func Parse(spec string) (Targets, error) {
	spec = strings.TrimSpace(spec)
	if spec == "" {
		return Targets{}, errors.New("control plane address is empty; want host:port, a comma-separated list of host:port, or dns:///host:port")
	}
	if rest, ok := strings.CutPrefix(spec, "dns://"); ok {
		_, hostport, found := strings.Cut(rest, "/")
		if !found || strings.Contains(hostport, ",") {
			return Targets{}, fmt.Errorf("control plane target %q is invalid; want dns:///host:port (one name; list several addresses without the dns:// prefix)", spec)
		}
		if err := checkHostPort(hostport); err != nil {
			return Targets{}, fmt.Errorf("control plane target %q: %w", spec, err)
		}
		return Targets{Target: spec}, nil
	}
	if strings.Contains(spec, "://") {
		return Targets{}, fmt.Errorf("control plane address %q has a scheme; want host:port, a comma-separated list of host:port, or dns:///host:port", spec)
	}
	parts := strings.Split(spec, ",")
	if len(parts) > MaxAddrs {
		return Targets{}, fmt.Errorf("control plane list has %d addresses; allowed at most %d", len(parts), MaxAddrs)
	}
	var errs []error
	seen := map[string]bool{}
	var addrs []string
	for i, p := range parts {
		p = strings.TrimSpace(p)
		if err := checkHostPort(p); err != nil {
			errs = append(errs, fmt.Errorf("control plane address %d of %d (%q): %w", i+1, len(parts), p, err))
			continue
		}
		if seen[p] {
			errs = append(errs, fmt.Errorf("control plane address %q is listed twice", p))
			continue
		}
		seen[p] = true
		addrs = append(addrs, p)
	}
	if err := errors.Join(errs...); err != nil {
		return Targets{}, err
	}
	if len(addrs) == 1 {
		return Targets{Target: "dns:///" + addrs[0]}, nil
	}
	return Targets{Target: listScheme + ":///controlplanes", Addrs: addrs}, nil
}

func checkHostPort(s string) error {
	host, port, err := net.SplitHostPort(s)
	if err != nil || host == "" || port == "" {
		return errors.New("not host:port (e.g. controlplane.internal:17700)")
	}
	return nil
}

// DialOptions are the options Target needs: for a list, a resolver
// holding the addresses (each verified under its own host name with TLS);
// none otherwise. The caller chooses the balancing policy (round robin
// spreads RPCs over every replica and skips one that is down).
func (t Targets) DialOptions() []grpc.DialOption {
	if len(t.Addrs) == 0 {
		return nil
	}
	r := manual.NewBuilderWithScheme(listScheme)
	eps := make([]resolver.Endpoint, len(t.Addrs))
	for i, a := range t.Addrs {
		host, _, _ := net.SplitHostPort(a)
		eps[i] = resolver.Endpoint{Addresses: []resolver.Address{{Addr: a, ServerName: host}}}
	}
	r.InitialState(resolver.State{Endpoints: eps})
	return []grpc.DialOption{grpc.WithResolvers(r)}
}

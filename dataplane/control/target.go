package control

import (
	"fmt"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/backoff"
	_ "google.golang.org/grpc/health" // client-side health checking for the service config's healthCheckConfig
	"google.golang.org/grpc/keepalive"

	"github.com/clodex/clodex/internal/cptarget"
)

// StoreHealthService is the health service a control plane reports its
// store on: SERVING while it decides from the shared store, NOT_SERVING
// while it cannot reach it (or while it shuts down). The data plane sends
// its RPCs only to replicas that report it SERVING; with none, every RPC
// fails at once and admission is local.
const StoreHealthService = "clodex.controlplane.v1.Store"

// AdmissionHealthService is the health service a control plane reports
// SERVING on while it answers admissions at all: from the shared store, or
// from its share of each policy while it cannot reach the store. It is
// NOT_SERVING only while the replica shuts down.
const AdmissionHealthService = "clodex.controlplane.v1.AdmissionService"

// serviceConfig balances RPCs round robin over the replicas whose health
// service %s reports SERVING, and sends an admission RPC that failed with Unavailable (its
// replica died under it, or refused it while shutting down) again, up to
// four more times after 0..10, 0..20, 0..40 and 0..80 ms, within the same
// deadline: by then the balancer has dropped the dead replica and the
// retry goes to a live one. Nothing else is retried: DeadlineExceeded has
// spent the deadline already. A retried Admit whose first attempt was
// decided before its replica died debits twice, which errs toward fewer
// admissions.
const serviceConfig = `{
  "loadBalancingConfig": [{"round_robin": {}}],
  "healthCheckConfig": {"serviceName": "%s"},
  "methodConfig": [{
    "name": [{"service": "clodex.controlplane.v1.AdmissionService"}],
    "retryPolicy": {
      "maxAttempts": 5,
      "initialBackoff": "0.01s",
      "maxBackoff": "0.08s",
      "backoffMultiplier": 2,
      "retryableStatusCodes": ["UNAVAILABLE"]
    }
  }]
}`

// Keepalive pings each control-plane replica's connection after
// KeepaliveTime without activity and drops it when no answer comes within
// KeepaliveTimeout. A replica that hangs (stopped, or cut off by a network
// that drops packets instead of refusing them) keeps its TCP connection
// open and its health stream silent, so without pings round robin would
// keep sending it every other RPC, each costing the Admit deadline; with
// them its connection fails within KeepaliveTime + KeepaliveTimeout and
// the balancer stops using it. 10 s is the shortest interval gRPC allows a
// client; the control plane permits pings every 5 s
// (controlplane.KeepaliveEnforcement).
var Keepalive = keepalive.ClientParameters{
	Time:                KeepaliveTime,
	Timeout:             KeepaliveTimeout,
	PermitWithoutStream: true,
}

const (
	// KeepaliveTime is how long a control-plane connection may be quiet
	// before the data plane pings it.
	KeepaliveTime = 10 * time.Second
	// KeepaliveTimeout is how long the data plane waits for a ping's
	// answer before it drops the connection.
	KeepaliveTimeout = 3 * time.Second
)

// ControlPlanes is a parsed --control-plane value: the replicas a data
// plane balances its RPCs over (package cptarget, which clodexctl shares).
type ControlPlanes = cptarget.Targets

// ParseControlPlanes parses a --control-plane value: "host:port" (a name
// may resolve to several replicas), a comma-separated list of replicas, or
// "dns:///host:port" (cptarget.Parse).
func ParseControlPlanes(spec string) (ControlPlanes, error) { return cptarget.Parse(spec) }

// dialOptions are the options that make one connection serve every
// replica whose health service health is SERVING: for a list, a resolver holding the addresses (each verified
// under its own host name with TLS); round robin over the replicas whose
// store health is SERVING, so a replica that is down, shutting down or
// cut off from the shared store gets no RPCs; an admission RPC that fails
// with Unavailable tried again on another replica within its deadline;
// the service config fixed here (DNS TXT records cannot change it); the
// keepalive; and the reconnect backoff of the probes (MinBackoff doubling
// to MaxBackoff, ±20 %, with gRPC's default 20 s connect timeout), so the
// transport comes back on the same schedule as admission asks again.
func dialOptions(c ControlPlanes, health string) []grpc.DialOption {
	opts := []grpc.DialOption{
		grpc.WithDefaultServiceConfig(fmt.Sprintf(serviceConfig, health)),
		grpc.WithDisableServiceConfig(),
		grpc.WithConnectParams(grpc.ConnectParams{
			Backoff:           backoff.Config{BaseDelay: MinBackoff, Multiplier: 2, Jitter: jitterFraction, MaxDelay: MaxBackoff},
			MinConnectTimeout: 20 * time.Second,
		}),
		grpc.WithKeepaliveParams(Keepalive),
	}
	opts = append(opts, c.DialOptions()...)
	return opts
}

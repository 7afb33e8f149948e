package control

import (
	"google.golang.org/grpc"
	"google.golang.org/grpc/connectivity"

	controlplanev1 "github.com/clodex/clodex/proto/gen/go/clodex/controlplane/v1"
)

// services are the control plane's services over one connection.
type services struct {
	admission  controlplanev1.AdmissionServiceClient
	agents     controlplanev1.AgentServiceClient
	credential controlplanev1.CredentialServiceClient
}

func newServices(cc *grpc.ClientConn) services {
	return services{
		admission:  controlplanev1.NewAdmissionServiceClient(cc),
		agents:     controlplanev1.NewAgentServiceClient(cc),
		credential: controlplanev1.NewCredentialServiceClient(cc),
	}
}

// api returns the services to ask: over the replicas whose store is
// healthy (Client.conn) while any is; while none is (every replica cut
// off from the shared store, each deciding from its share of each
// account's policy: docs/operations.md §3), over every replica that
// answers (Client.shareConn). The fleet's replicas then still decide
// every admission, each at its share, instead of every data plane going
// local at its own. A replica cut off alone gets nothing while another
// reaches the store, since the store's bucket and its share together
// would exceed the account's rate.
func (c *Client) api() services {
	if c.conn.GetState() == connectivity.TransientFailure {
		return c.shares
	}
	return c.stores
}

// answering reports whether either connection has a replica ready.
func (c *Client) answering() bool {
	return c.conn.GetState() == connectivity.Ready || c.shareConn.GetState() == connectivity.Ready
}

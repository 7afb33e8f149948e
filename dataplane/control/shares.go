package control

import (
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/connectivity"
	"google.golang.org/grpc/status"

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

// via returns the services to ask, and whether they are the shares':
// over the replicas whose store is healthy (Client.conn) while any is;
// while none is (every replica cut off from the shared store, each
// deciding from its share of each account's policy: docs/operations.md
// §3) and a replica answers at all, over every replica that answers
// (Client.shareConn). The fleet's replicas then still decide every
// admission, each at its share, instead of every data plane going local
// at its own. A replica cut off alone gets nothing while another reaches
// the store, since the store's bucket and its share together would exceed
// the account's rate.
func (c *Client) via() (services, bool) {
	if c.conn.GetState() != connectivity.Ready && c.shareConn.GetState() == connectivity.Ready {
		return c.shares, true
	}
	return c.stores, false
}

// api returns the services to ask (via).
func (c *Client) api() services {
	s, _ := c.via()
	return s
}

// sharesInstead reports whether an RPC over the healthy stores that
// failed with err should be sent again over the shares: it found no
// replica with a healthy store (every replica's store health turned
// NOT_SERVING under it, as it does within a second of the shared store
// going away) while a replica still answers.
func (c *Client) sharesInstead(viaShares bool, err error) bool {
	return !viaShares && status.Code(err) == codes.Unavailable && c.shareConn.GetState() == connectivity.Ready
}

// answering reports whether either connection has a replica ready.
func (c *Client) answering() bool {
	return c.conn.GetState() == connectivity.Ready || c.shareConn.GetState() == connectivity.Ready
}

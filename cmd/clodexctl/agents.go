package main

import (
	"context"
	"fmt"
	"io"
	"strings"
	"text/tabwriter"
	"time"

	controlplanev1 "github.com/clodex/clodex/proto/gen/go/clodex/controlplane/v1"
)

const agentsUsage = "agents"

var agentsCmd = &command{
	name:  "agents",
	usage: agentsUsage,
	short: "list the data planes registered with the control plane",
	run:   runAgents,
}

type agentsArgs struct{}

// agentView is an agent as clodexctl prints it; scripts rely on the JSON
// keys. Times are RFC 3339 in UTC.
type agentView struct {
	ID                string   `json:"id"`
	Host              string   `json:"host"`
	Version           string   `json:"version"`
	CapabilityVersion int32    `json:"capability_version"`
	Accounts          []string `json:"accounts"`
	LastSeen          string   `json:"last_seen"`
	Connected         string   `json:"connected"`
	Live              bool     `json:"live"`
}

func rfc3339(unixMs int64) string {
	return time.UnixMilli(unixMs).UTC().Format(time.RFC3339)
}

func agentViewOf(a *controlplanev1.Agent) agentView {
	accts := a.GetAccounts()
	if accts == nil {
		accts = []string{}
	}
	return agentView{
		ID:                a.GetId(),
		Host:              a.GetHost(),
		Version:           a.GetVersion(),
		CapabilityVersion: a.GetCapabilityVersion(),
		Accounts:          accts,
		LastSeen:          rfc3339(a.GetLastSeenUnixMs()),
		Connected:         rfc3339(a.GetConnectedUnixMs()),
		Live:              a.GetLive(),
	}
}

func runAgents(ctx context.Context, e *env, args []string) error {
	var _ agentsArgs
	if err := e.noArgs("agents", agentsUsage, args); err != nil {
		return err
	}
	var agents []*controlplanev1.Agent
	err := e.withAdmin(ctx, func(ctx context.Context, c *client) error {
		var err error
		if agents, err = listAgents(ctx, c); err != nil {
			return c.rpcError(err, "", "")
		}
		return nil
	})
	if err != nil {
		return err
	}
	views := make([]agentView, 0, len(agents))
	for _, a := range agents {
		views = append(views, agentViewOf(a))
	}
	if e.g.output == "json" {
		return writeJSON(e.stdout, views)
	}
	return writeAgents(e.stdout, views)
}

// writeAgents prints agents as a table, one per row.
func writeAgents(w io.Writer, vs []agentView) error {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "ID\tHOST\tVERSION\tCAP\tLIVE\tLAST SEEN\tACCOUNTS")
	for _, v := range vs {
		accts := strings.Join(v.Accounts, ",")
		if accts == "" {
			accts = "-"
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%d\t%s\t%s\t%s\n", v.ID, dash(v.Host), dash(v.Version), v.CapabilityVersion,
			yesNo(v.Live), v.LastSeen, accts)
	}
	return tw.Flush()
}

func dash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

func yesNo(b bool) string {
	if b {
		return "yes"
	}
	return "no"
}

// listAgents reads every page of ListAgents.
func listAgents(ctx context.Context, c *client) ([]*controlplanev1.Agent, error) {
	return readPages(func(token string) ([]*controlplanev1.Agent, string, error) {
		resp, err := c.admin.ListAgents(ctx, &controlplanev1.ListAgentsRequest{PageToken: token})
		return resp.GetAgents(), resp.GetNextPageToken(), err
	})
}

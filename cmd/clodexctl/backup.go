package main

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"

	"github.com/clodex/clodex/internal/atomicfile"
	controlplanev1 "github.com/clodex/clodex/proto/gen/go/clodex/controlplane/v1"
)

const backupUsage = "backup --out FILE"

var backupCmd = &command{
	name:  "backup",
	usage: backupUsage,
	short: "write the store's durable state (policies, sign-ins, agent credentials) to FILE, sealed with the control plane's credential key",
	run:   runBackup,
}

type backupArgs struct {
	out string
}

// backupView is what backup prints; scripts rely on the JSON keys.
type backupView struct {
	File             string `json:"file"`
	Bytes            int    `json:"bytes"`
	Created          string `json:"created"`
	Kind             string `json:"kind"`
	Replica          string `json:"replica,omitempty"`
	Policies         int32  `json:"policies"`
	Logins           int32  `json:"sign_ins"`
	AgentCredentials int32  `json:"agent_credentials"`
	Members          int32  `json:"members"`
	Sealed           bool   `json:"sealed"`
}

// runBackup reads AdminService.Backup and writes the file atomically with
// mode 0600 (replacing one that exists: backups are meant to be taken
// again and again).
func runBackup(ctx context.Context, e *env, args []string) error {
	var a backupArgs
	fs := e.flagSet("backup")
	fs.StringVar(&a.out, "out", "", "write the backup to this `file` (mode 0600, atomically)")
	pos, err := e.parse(fs, backupUsage, args)
	if err != nil {
		return err
	}
	if len(pos) > 0 {
		return usagef("unexpected argument %q; usage: clodexctl %s", pos[0], backupUsage)
	}
	if a.out == "" {
		return usagef("missing --out FILE; usage: clodexctl %s", backupUsage)
	}
	c, err := e.dial()
	if err != nil {
		return err
	}
	defer c.Close()
	cctx, cancel := e.callCtx(ctx)
	defer cancel()
	stream, err := c.admin.Backup(cctx, &controlplanev1.BackupRequest{})
	if err != nil {
		return c.rpcError(err, "", "")
	}
	var buf bytes.Buffer
	var sum *controlplanev1.BackupSummary
	for {
		resp, err := stream.Recv()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return c.rpcError(err, "", "")
		}
		if resp.GetSummary() != nil {
			sum = resp.GetSummary()
		}
		buf.Write(resp.GetData())
	}
	if buf.Len() == 0 {
		return fmt.Errorf("the control plane at %s sent an empty backup", c.addr)
	}
	if err := atomicfile.WriteFile(a.out, buf.Bytes(), 0o600); err != nil {
		return err
	}
	v := backupView{File: a.out, Bytes: buf.Len(), Created: rfc3339(sum.GetCreatedUnixMs()), Kind: sum.GetKind(), Replica: sum.GetReplica(),
		Policies: sum.GetPolicies(), Logins: sum.GetLogins(), AgentCredentials: sum.GetAgentCredentials(),
		Members: sum.GetMembers(), Sealed: sum.GetSealed()}
	if e.g.output == "json" {
		return writeJSON(e.stdout, v)
	}
	sealed := "sealed with the control plane's credential key"
	if !v.Sealed {
		sealed = "not sealed (the control plane has no credential key; it holds no sign-ins)"
	}
	fmt.Fprintf(e.stdout, "wrote %s (%d bytes, %s): %d policies, %d sign-ins, %d agent credentials, %d members, taken %s from the %s store\n",
		v.File, v.Bytes, sealed, v.Policies, v.Logins, v.AgentCredentials, v.Members, v.Created, v.Kind)
	return nil
}

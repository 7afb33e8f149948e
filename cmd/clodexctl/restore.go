package main

import (
	"context"
	"fmt"
	"os"

	controlplanev1 "github.com/clodex/clodex/proto/gen/go/clodex/controlplane/v1"
)

const restoreUsage = "restore FILE [--force]"

var restoreCmd = &command{
	name:  "restore",
	usage: restoreUsage,
	short: "put a backup (clodexctl backup, or a file from --backup-dir) back into the store; records the store holds in a newer version are kept unless --force",
	run:   runRestore,
}

type restoreArgs struct {
	force bool
}

// maxRestoreFile bounds the file restore reads (the control plane takes
// at most 64 MiB).
const maxRestoreFile = 64 << 20

// restoreChunk is each RestoreRequest's data: the control plane's chunk
// limit (controlplane.MaxRestoreChunk, 16 KiB; clodexctl does not import
// the server).
const restoreChunk = 16 << 10

// restoreView is what restore prints; scripts rely on the JSON keys.
type restoreView struct {
	File             string        `json:"file"`
	Created          string        `json:"created"`
	Force            bool          `json:"force"`
	Policies         restoreCounts `json:"policies"`
	Logins           restoreCounts `json:"sign_ins"`
	AgentCredentials restoreCounts `json:"agent_credentials"`
	Members          restoreCounts `json:"members"`
}

type restoreCounts struct {
	Restored int32 `json:"restored"`
	Kept     int32 `json:"kept"`
}

func countsOf(c *controlplanev1.RestoreCounts) restoreCounts {
	return restoreCounts{Restored: c.GetRestored(), Kept: c.GetKept()}
}

func runRestore(ctx context.Context, e *env, args []string) error {
	var a restoreArgs
	fs := e.flagSet("restore")
	fs.BoolVar(&a.force, "force", false, "restore every record of the file, even where the store holds a newer version (a restored sign-in may hold a refresh token rotated since)")
	pos, err := e.parse(fs, restoreUsage, args)
	if err != nil {
		return err
	}
	if len(pos) != 1 || pos[0] == "" {
		return usagef("want one FILE; usage: clodexctl %s", restoreUsage)
	}
	file := pos[0]
	fi, err := os.Stat(file)
	if err != nil {
		return usagef("backup file: %v", err)
	}
	if fi.Size() > maxRestoreFile {
		return usagef("backup file %s is %d bytes; a backup holds at most %d", file, fi.Size(), maxRestoreFile)
	}
	data, err := os.ReadFile(file)
	if err != nil {
		return usagef("backup file: %v", err)
	}
	c, err := e.dial()
	if err != nil {
		return err
	}
	defer c.Close()
	cctx, cancel := e.callCtx(ctx)
	defer cancel()
	stream, err := c.admin.Restore(cctx)
	if err != nil {
		return c.rpcError(err, "", "")
	}
	for i := 0; i == 0 || i < len(data); i += restoreChunk {
		req := &controlplanev1.RestoreRequest{Data: data[i:min(i+restoreChunk, len(data))], Force: a.force && i == 0}
		if err := stream.Send(req); err != nil {
			break // the answer says why
		}
	}
	resp, err := stream.CloseAndRecv()
	if err != nil {
		return c.rpcError(err, "", "")
	}
	v := restoreView{File: file, Created: rfc3339(resp.GetCreatedUnixMs()), Force: a.force, Policies: countsOf(resp.GetPolicies()),
		Logins: countsOf(resp.GetLogins()), AgentCredentials: countsOf(resp.GetAgentCredentials()), Members: countsOf(resp.GetMembers())}
	if e.g.output == "json" {
		return writeJSON(e.stdout, v)
	}
	fmt.Fprintf(e.stdout, "restored %s (taken %s): policies %d restored, %d kept; sign-ins %d restored, %d kept; agent credentials %d restored, %d kept; members %d restored, %d kept\n",
		v.File, v.Created, v.Policies.Restored, v.Policies.Kept, v.Logins.Restored, v.Logins.Kept, v.AgentCredentials.Restored, v.AgentCredentials.Kept,
		v.Members.Restored, v.Members.Kept)
	if k := v.Policies.Kept + v.Logins.Kept + v.AgentCredentials.Kept + v.Members.Kept; k > 0 && !a.force {
		fmt.Fprintln(e.stdout, "kept records are held by the store in the same or a newer version; --force restores them too")
	}
	return nil
}

package controlplane

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/clodex/clodex/controlplane/store"
	controlplanev1 "github.com/clodex/clodex/proto/gen/go/clodex/controlplane/v1"
)

// DurableStore takes snapshots of the store's durable state and restores
// them (Options.Durable; AdminService.Backup and Restore).
type DurableStore interface {
	Snapshot(ctx context.Context) (store.Snapshot, error)
	Restore(ctx context.Context, s store.Snapshot, opts store.RestoreOptions) (store.RestoreResult, error)
}

// Backup and Restore move a backup file in chunks: a RestoreRequest
// stays below its receive limit (MaxRecvMsgSize, recvlimits.go), and a
// restore holds at most MaxRestoreSize. Backup's answers go the other
// way: the client's default receive limit (4 MiB) applies.
const (
	backupChunk = 64 << 10
	// MaxRestoreChunk bounds one RestoreRequest's data.
	MaxRestoreChunk = 16 << 10
	// MaxRestoreSize bounds a whole restore (an admin's cost is bounded
	// too): far above a backup of 10,000 accounts' policies and sign-ins.
	MaxRestoreSize = 64 << 20
)

var errNoDurable = status.Error(codes.FailedPrecondition, "this control plane's store takes no backups")

// Backup streams the store's durable state as one backup file, sealed
// with the credential key when there is one.
func (a *adminService) Backup(_ *controlplanev1.BackupRequest, stream grpc.ServerStreamingServer[controlplanev1.BackupResponse]) error {
	s := a.s
	ctx := stream.Context()
	if s.opts.Durable == nil {
		return errNoDurable
	}
	snap, err := s.opts.Durable.Snapshot(ctx)
	if err != nil {
		return s.toStatus(ctx, "Backup", err)
	}
	data, err := store.EncodeBackup(snap, s.opts.BackupSealer)
	if err != nil {
		return s.toStatus(ctx, "Backup", err)
	}
	sum := &controlplanev1.BackupSummary{
		CreatedUnixMs: snap.Created.UnixMilli(), Kind: snap.Kind, Replica: snap.Replica, Policies: int32(len(snap.Policies)),
		Logins: int32(len(snap.Logins)), AgentCredentials: int32(len(snap.AgentCreds)), Members: int32(len(snap.Members)),
		Sealed: s.opts.BackupSealer != nil,
	}
	for i := 0; i == 0 || i < len(data); i += backupChunk {
		resp := &controlplanev1.BackupResponse{Data: data[i:min(i+backupChunk, len(data))]}
		if i == 0 {
			resp.Summary = sum
		}
		if err := stream.Send(resp); err != nil {
			return err
		}
	}
	s.log.InfoContext(ctx, "backup taken", "policies", len(snap.Policies), "sign_ins", len(snap.Logins),
		"agent_credentials", len(snap.AgentCreds), "members", len(snap.Members), "bytes", len(data), "sealed", s.opts.BackupSealer != nil)
	return nil
}

// Restore reads a backup file in chunks and puts it back into the store,
// then reloads the agent credentials and the members and pushes every
// policy (and a changed member list) to the agents.
func (a *adminService) Restore(stream grpc.ClientStreamingServer[controlplanev1.RestoreRequest, controlplanev1.RestoreResponse]) error {
	s := a.s
	ctx := stream.Context()
	if s.opts.Durable == nil {
		return errNoDurable
	}
	var buf bytes.Buffer
	force := false
	for first := true; ; first = false {
		req, err := stream.Recv()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return err
		}
		if first {
			force = req.GetForce()
		}
		if n := len(req.GetData()); n > MaxRestoreChunk {
			return s.toStatus(ctx, "Restore", invalidf("a chunk of %d bytes; allowed at most %d", n, MaxRestoreChunk))
		}
		if buf.Len()+len(req.GetData()) > MaxRestoreSize {
			return s.toStatus(ctx, "Restore", invalidf("the backup is larger than %d bytes", MaxRestoreSize))
		}
		buf.Write(req.GetData())
	}
	snap, err := store.DecodeBackup(buf.Bytes(), s.opts.BackupSealer)
	if err != nil {
		return s.toStatus(ctx, "Restore", invalidf("%v", err))
	}
	res, err := s.opts.Durable.Restore(ctx, snap, store.RestoreOptions{Force: force})
	if err != nil {
		return s.toStatus(ctx, "Restore", fmt.Errorf("restore: %w", err))
	}
	if err := s.reloadScopes(ctx); err != nil {
		s.log.WarnContext(ctx, "reload agent credentials", "err", err)
	}
	if err := s.reloadMembers(ctx); err != nil {
		s.log.WarnContext(ctx, "reload members", "err", err)
	}
	s.agents.pushAll()
	s.log.WarnContext(ctx, "backup restored", "written", snap.Created.UTC(), "by", snap.Replica, "force", force, "result", res.String())
	count := func(c store.RestoreCount) *controlplanev1.RestoreCounts {
		return &controlplanev1.RestoreCounts{Restored: int32(c.Restored), Kept: int32(c.Kept)}
	}
	return stream.SendAndClose(&controlplanev1.RestoreResponse{
		Policies: count(res.Policies), Logins: count(res.Logins), AgentCredentials: count(res.AgentCreds),
		Members: count(res.Members), CreatedUnixMs: snap.Created.UnixMilli(),
	})
}

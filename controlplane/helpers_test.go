package controlplane_test

import (
	"context"

	"google.golang.org/grpc/metadata"
)

func metadataCtx(ctx context.Context, kv ...string) context.Context {
	return metadata.NewOutgoingContext(ctx, metadata.Pairs(kv...))
}

//go:build !unix

package credentials

import (
	"context"
	"fmt"
	"runtime"
	"time"
)

// lockFile is not implemented on this platform: refreshing a shared
// auth.json safely needs flock. Use RefreshNever here.
func lockFile(ctx context.Context, path string, wait time.Duration) (unlock func(), err error) {
	return nil, fmt.Errorf("lock %s: file locking is not supported on %s; use refresh mode never", path, runtime.GOOS)
}

package cluster

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
)

// Binaries are the paths of the four clodex programs, and of
// redis-server for replicas.
type Binaries struct {
	Sim, ControlPlane, Ctl, DataPlane string
	// RedisServer is redis-server, needed only with Options.Replicas > 1.
	// (Optional; default redis-server on PATH)
	RedisServer string
}

// BinariesIn is the binaries as `make build` lays them out in dir.
func BinariesIn(dir string) Binaries {
	return Binaries{
		Sim:          filepath.Join(dir, "clodex-sim"),
		ControlPlane: filepath.Join(dir, "clodex-controlplane"),
		Ctl:          filepath.Join(dir, "clodexctl"),
		DataPlane:    filepath.Join(dir, "clodex-dataplane"),
	}
}

// Check reports every binary that is missing or not executable.
func (b Binaries) Check() error {
	var errs []error
	for _, p := range []string{b.Sim, b.ControlPlane, b.Ctl, b.DataPlane} {
		st, err := os.Stat(p)
		switch {
		case err != nil:
			errs = append(errs, fmt.Errorf("binary %s: %w (run make build)", p, err))
		case st.IsDir() || st.Mode()&0o111 == 0:
			errs = append(errs, fmt.Errorf("binary %s is not an executable file", p))
		}
	}
	return errors.Join(errs...)
}

// Build compiles the four programs of the module rooted at moduleDir into
// outDir with one `go build` (the build cache makes repeats fast).
func Build(ctx context.Context, goBin, moduleDir, outDir string) (Binaries, error) {
	args := []string{"build", "-o", outDir + string(os.PathSeparator),
		"./cmd/clodex-sim", "./cmd/clodex-controlplane", "./cmd/clodexctl", "./cmd/clodex-dataplane"}
	cmd := exec.CommandContext(ctx, goBin, args...) //nolint:gosec // G204: goBin is the go command the caller located; the arguments are fixed
	cmd.Dir = moduleDir
	if out, err := cmd.CombinedOutput(); err != nil {
		return Binaries{}, fmt.Errorf("build binaries: %w\n%s", err, out)
	}
	return BinariesIn(outDir), nil
}

package deploy

import (
	"bufio"
	"bytes"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"testing"
)

// testVersion is the version the tests stamp into the binaries.
const testVersion = "v0.0.0-deploy-test"

// clodexBinaries are the commands under cmd/, all built by
// scripts/build.sh and shipped in the image.
var clodexBinaries = []string{"clodex-controlplane", "clodex-dataplane", "clodexctl", "clodex-sim"}

var (
	buildOnce sync.Once
	binDir    string
	buildErr  error
)

func TestMain(m *testing.M) {
	code := m.Run()
	if binDir != "" {
		_ = os.RemoveAll(binDir)
	}
	os.Exit(code)
}

// repoRoot is the module's root, the parent of this package.
func repoRoot(t *testing.T) string {
	t.Helper()
	root, err := filepath.Abs("..")
	if err != nil {
		t.Fatal(err)
	}
	return root
}

// buildWith runs scripts/build.sh from root into out with env added.
func buildWith(root, out string, env ...string) error {
	cmd := exec.Command(filepath.Join(root, "scripts", "build.sh"), out, testVersion)
	cmd.Dir = root
	cmd.Env = append(os.Environ(), env...)
	if b, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("scripts/build.sh %s: %w\n%s", out, err, b)
	}
	return nil
}

// binaries builds every binary once per test binary, the way the image
// does, and returns their folder.
func binaries(t *testing.T) string {
	t.Helper()
	root := repoRoot(t)
	buildOnce.Do(func() {
		binDir, buildErr = os.MkdirTemp("", "clodex-deploy-bin-")
		if buildErr == nil {
			buildErr = buildWith(root, binDir)
		}
	})
	if buildErr != nil {
		t.Fatal(buildErr)
	}
	return binDir
}

// flagSet is what a binary's -h says it accepts.
type flagSet struct {
	// takesValue maps each flag to whether it takes a value (bool flags
	// do not).
	takesValue map[string]bool
	// commands are clodexctl's commands (nil for the other binaries,
	// which take no positional arguments).
	commands map[string]bool
}

var (
	flagLine    = regexp.MustCompile(`^  -([A-Za-z0-9][A-Za-z0-9._-]*)(?: (\S+))?$`)
	cmdListLine = regexp.MustCompile(`^  ([a-z][a-z0-9-]*)(?: |$)`)

	flagSetsMu sync.Mutex
	flagSets   = map[string]flagSet{}
)

// flagsOf runs the binary with -h and parses the flag list the flag
// package prints (and, for clodexctl, the command list).
func flagsOf(t *testing.T, name string) flagSet {
	t.Helper()
	flagSetsMu.Lock()
	defer flagSetsMu.Unlock()
	if fs, ok := flagSets[name]; ok {
		return fs
	}
	out, err := exec.Command(filepath.Join(binaries(t), name), "-h").CombinedOutput()
	if err != nil {
		t.Fatalf("%s -h: %v\n%s", name, err, out)
	}
	fs := parseHelp(out, name == "clodexctl")
	if len(fs.takesValue) == 0 {
		t.Fatalf("%s -h listed no flags:\n%s", name, out)
	}
	flagSets[name] = fs
	return fs
}

func parseHelp(out []byte, withCommands bool) flagSet {
	// -h and -help are the flag package's own.
	fs := flagSet{takesValue: map[string]bool{"h": false, "help": false}}
	if withCommands {
		fs.commands = map[string]bool{"help": true}
	}
	inCommands := false
	sc := bufio.NewScanner(bytes.NewReader(out))
	for sc.Scan() {
		line := sc.Text()
		switch {
		case line == "Commands:":
			inCommands = true
		case line != "" && !strings.HasPrefix(line, " "):
			inCommands = false
		}
		if m := flagLine.FindStringSubmatch(line); m != nil {
			fs.takesValue[m[1]] = m[2] != ""
			continue
		}
		if inCommands && withCommands {
			if m := cmdListLine.FindStringSubmatch(line); m != nil {
				fs.commands[m[1]] = true
			}
		}
	}
	return fs
}

// checkArgv checks one command line named in a deployment file against
// the binary's own flags. argv[0] is the binary, by path or name; command
// lines of other programs (redis-server, prometheus, ...) are not checked
// and return nil. source names the file and place for the error.
func checkArgv(t *testing.T, source string, argv []string) []error {
	t.Helper()
	if len(argv) == 0 {
		return []error{fmt.Errorf("%s: empty command", source)}
	}
	name := filepath.Base(argv[0])
	known := false
	for _, b := range clodexBinaries {
		known = known || b == name
	}
	if !known {
		return nil
	}
	return checkArgs(source, name, flagsOf(t, name), argv[1:])
}

// checkArgs is checkArgv's walk over the arguments after the binary.
func checkArgs(source, name string, fs flagSet, args []string) []error {
	var errs []error
	sawCommand := false
	for i := 0; i < len(args); i++ {
		a := args[i]
		if a == "--" {
			break
		}
		if !strings.HasPrefix(a, "-") || a == "-" {
			switch {
			case fs.commands == nil:
				errs = append(errs, fmt.Errorf("%s: %s takes no arguments, got %q", source, name, a))
			case !sawCommand && !fs.commands[a]:
				errs = append(errs, fmt.Errorf("%s: %s has no command %q", source, name, a))
			}
			sawCommand = true
			continue
		}
		flagName, _, hasValue := strings.Cut(strings.TrimLeft(a, "-"), "=")
		takes, ok := fs.takesValue[flagName]
		if !ok {
			errs = append(errs, fmt.Errorf("%s: %s has no flag --%s", source, name, flagName))
			if !hasValue && i+1 < len(args) && !strings.HasPrefix(args[i+1], "-") {
				i++ // most likely its value: one error per mistake
			}
			continue
		}
		if takes && !hasValue {
			if i+1 >= len(args) {
				errs = append(errs, fmt.Errorf("%s: %s --%s needs a value", source, name, flagName))
			}
			i++
		}
	}
	return errs
}

// versionOf runs the binary with --version.
func versionOf(t *testing.T, name string) string {
	t.Helper()
	out, err := exec.Command(filepath.Join(binaries(t), name), "--version").CombinedOutput()
	if err != nil {
		t.Fatalf("%s --version: %v\n%s", name, err, out)
	}
	return strings.TrimSpace(string(out))
}

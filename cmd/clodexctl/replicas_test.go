package main

import (
	"bytes"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/clodex/clodex/controlplane/controlplanetest"
)

// --control-plane takes the replicas' list the data planes take; a call
// goes to a replica that answers, so one replica down costs nothing.
func TestReplicaList(t *testing.T) {
	a := startServer(t)
	b := controlplanetest.Start(t, &controlplanetest.Options{Tokens: a})
	list := a.Addr + "," + b.Addr
	run := func(args ...string) (string, error) {
		var out, errb bytes.Buffer
		err := runEnv(t.Context(), append([]string{"--control-plane", list, "--token-file", a.AdminTokenFile}, args...), envMap(nil), &out, &errb)
		return out.String() + errb.String(), err
	}
	for _, args := range [][]string{{"accounts"}, {"health"}, {"set-rate", acct1, "30"}} {
		if out, err := run(args...); err != nil {
			t.Errorf("clodexctl --control-plane %s %v = %v\n%s", list, args, err, out)
		}
	}
	a.Kill()
	for i := range 3 {
		if out, err := run("accounts"); err != nil {
			t.Errorf("accounts %d with the first replica down = %v; want the second to answer\n%s", i, err, out)
		}
	}
	if out, err := run("health", "--store"); err != nil || !strings.Contains(out, "SERVING, store SERVING") {
		t.Errorf("health --store with the first replica down = %v\n%s", err, out)
	}

	// The environment takes the list too.
	var out bytes.Buffer
	env := envMap(map[string]string{envControlPlane: list, envAdminTokenFile: a.AdminTokenFile})
	if err := runEnv(t.Context(), []string{"accounts"}, env, &out, &out); err != nil {
		t.Errorf("accounts with %s=%s = %v\n%s", envControlPlane, list, err, out.String())
	}

	for _, bad := range []struct{ spec, want string }{
		{"127.0.0.1:1,,x", `control plane address 2 of 3 (""): not host:port`},
		{"127.0.0.1:1,127.0.0.1:1", `control plane address "127.0.0.1:1" is listed twice`},
		{"http://cp:17700", "has a scheme"},
	} {
		var o bytes.Buffer
		err := runEnv(t.Context(), []string{"--control-plane", bad.spec, "--token-file", a.AdminTokenFile, "accounts"}, envMap(nil), &o, &o)
		if err == nil || exitCode(err) != 2 || !strings.Contains(err.Error(), bad.want) || strings.Contains(err.Error(), "too many colons") {
			t.Errorf("--control-plane %q = %v (exit %d); want exit 2 naming %q", bad.spec, err, exitCode(err), bad.want)
		}
	}
}

// health --wait keeps asking until what it checks answers: a data plane
// whose listener comes up later, within the wait; and it gives up naming
// the wait when nothing answers.
func TestHealthWait(t *testing.T) {
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := lis.Addr().String()
	_ = lis.Close()
	hs := &http.Server{Handler: http.HandlerFunc(func(http.ResponseWriter, *http.Request) {}), ReadHeaderTimeout: time.Second}
	started := make(chan error, 1)
	go func() {
		time.Sleep(500 * time.Millisecond)
		l, err := net.Listen("tcp", addr)
		if err != nil {
			started <- err
			return
		}
		started <- nil
		_ = hs.Serve(l)
	}()
	t.Cleanup(func() { _ = hs.Close() })
	var out bytes.Buffer
	err = runEnv(t.Context(), []string{"health", "--wait", "20s", "http://" + addr + "/healthz"}, envMap(nil), &out, &out)
	if serr := <-started; serr != nil {
		t.Fatalf("listen again on %s: %v", addr, serr)
	}
	if err != nil || !strings.Contains(out.String(), "200 OK") {
		t.Errorf("health --wait 20s on a listener that comes up later = %v\n%s", err, out.String())
	}

	out.Reset()
	err = runEnv(t.Context(), []string{"--control-plane", "127.0.0.1:1", "health", "--wait", "1s"}, envMap(nil), &out, &out)
	if err == nil || exitCode(err) != 1 || !strings.Contains(err.Error(), "still unhealthy after --wait 1s") {
		t.Errorf("health --wait 1s on a closed port = %v; want exit 1 saying it waited", err)
	}
	for _, args := range [][]string{{"health", "--wait", "11m"}, {"health", "--store", "http://x/healthz"}} {
		if err := runEnv(t.Context(), args, envMap(nil), &out, &out); err == nil || exitCode(err) != 2 {
			t.Errorf("clodexctl %v = %v; want a usage error", args, err)
		}
	}
}

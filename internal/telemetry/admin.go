package telemetry

import (
	"crypto/sha256"
	"crypto/subtle"
	"errors"
	"fmt"
	"net/http"
	"net/http/pprof"
	"sort"
	"strings"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/clodex/clodex/internal/hostcheck"
)

// NewRegistry returns a private registry with the Go runtime and process
// collectors registered.
func NewRegistry() *prometheus.Registry {
	r := prometheus.NewRegistry()
	r.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	return r
}

// AdminOptions configures AdminHandler.
type AdminOptions struct {
	// Listen is the admin listener's address (Required). On a loopback
	// address every request must carry a loopback Host, as on the data
	// plane's API listener (package hostcheck): a web page reaching it by
	// DNS rebinding is refused.
	Listen string
	// Token is the bearer token every request must present in
	// "Authorization: Bearer" (Required when Listen is not a loopback
	// address; Optional on loopback). Read it from --metrics-token-file.
	Token string
	// Pprof serves /debug/pprof/ (Optional; default off: profiles cost CPU
	// and expose the command line).
	Pprof bool
	// Facts are listed on /debug/ (name -> value; never secrets).
	Facts map[string]string
	// Console, when set, serves /console/: it authenticates its own
	// callers (a session cookie, not Token) and allows requests from its
	// own origin (a browser's same-origin POSTs); the Host rule applies
	// to it as to every path. (Optional; default no console)
	Console http.Handler
}

// Admin flag names, for the errors of CheckAdminFlags.
const (
	FlagAdminListen      = "--admin-listen"
	FlagMetricsTokenFile = "--metrics-token-file"
	FlagPprof            = "--pprof"
)

// CheckAdminFlags reports an admin listener configuration a binary must
// refuse to start with: a non-loopback --admin-listen without
// --metrics-token-file, or --metrics-token-file or --pprof without
// --admin-listen.
func CheckAdminFlags(listen, tokenFile string, pprofOn bool) error {
	var errs []string
	switch {
	case listen == "":
		if tokenFile != "" {
			errs = append(errs, fmt.Sprintf("%s is set but %s is not: the token guards the admin listener", FlagMetricsTokenFile, FlagAdminListen))
		}
		if pprofOn {
			errs = append(errs, fmt.Sprintf("%s is set but %s is not: profiles are served on the admin listener", FlagPprof, FlagAdminListen))
		}
	case !hostcheck.LoopbackAddr(listen) && tokenFile == "":
		errs = append(errs, fmt.Sprintf("%s %s is not a loopback address: %s is required (scrapers send the token as Authorization: Bearer), or listen on 127.0.0.1",
			FlagAdminListen, listen, FlagMetricsTokenFile))
	}
	if len(errs) == 0 {
		return nil
	}
	return errors.New(strings.Join(errs, "; "))
}

// AdminHandler serves /metrics from g, a /debug/ page listing o.Facts
// and, with o.Pprof, /debug/pprof/, after checking Host, Origin and the
// bearer token as o says. Serve it only on an admin listener. It refuses
// a non-loopback o.Listen without o.Token.
func AdminHandler(g prometheus.Gatherer, o AdminOptions) (http.Handler, error) {
	token := strings.TrimSpace(o.Token)
	if !hostcheck.LoopbackAddr(o.Listen) && token == "" {
		return nil, fmt.Errorf("admin handler: %s %s is not a loopback address and no token is set", FlagAdminListen, o.Listen)
	}
	hosts, err := hostcheck.New(o.Listen, nil) // no origin may read the admin listener
	if err != nil {
		return nil, fmt.Errorf("admin handler: %w", err)
	}
	mux := http.NewServeMux()
	mux.Handle("GET /metrics", promhttp.HandlerFor(g, promhttp.HandlerOpts{}))
	if o.Pprof {
		mux.HandleFunc("/debug/pprof/", pprof.Index)
		mux.HandleFunc("/debug/pprof/cmdline", pprof.Cmdline)
		mux.HandleFunc("/debug/pprof/profile", pprof.Profile)
		mux.HandleFunc("/debug/pprof/symbol", pprof.Symbol)
		mux.HandleFunc("/debug/pprof/trace", pprof.Trace)
	} else {
		mux.HandleFunc("/debug/pprof/", func(w http.ResponseWriter, _ *http.Request) {
			http.Error(w, "profiling is off; start the binary with "+FlagPprof+" to serve /debug/pprof/", http.StatusNotFound)
		})
	}
	keys := make([]string, 0, len(o.Facts))
	for k := range o.Facts {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	facts := make(map[string]string, len(o.Facts))
	for k, v := range o.Facts {
		facts[k] = v
	}
	mux.HandleFunc("GET /debug/{$}", func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
		for _, k := range keys {
			fmt.Fprintf(w, "%s: %s\n", k, facts[k])
		}
	})
	var want [sha256.Size]byte
	if token != "" {
		want = sha256.Sum256([]byte(token))
	}
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if o.Console != nil && (r.URL.Path == "/console" || strings.HasPrefix(r.URL.Path, "/console/")) {
			if ref := hosts.CheckHost(r); ref != nil {
				http.Error(w, fmt.Sprintf("Host %q is not a loopback host; this admin listener only answers requests for localhost, 127.0.0.1 or [::1]", ref.Value), http.StatusForbidden)
				return
			}
			o.Console.ServeHTTP(w, r)
			return
		}
		if ref := hosts.Check(r); ref != nil {
			msg := fmt.Sprintf("Host %q is not a loopback host; this admin listener only answers requests for localhost, 127.0.0.1 or [::1]", ref.Value)
			if ref.Header == "Origin" {
				msg = fmt.Sprintf("Origin %q is not allowed; browsers may not read the admin listener", ref.Value)
			}
			http.Error(w, msg, http.StatusForbidden)
			return
		}
		if token != "" {
			auth := r.Header.Get("Authorization")
			got := ""
			if len(auth) > 7 && strings.EqualFold(auth[:7], "bearer ") {
				got = strings.TrimSpace(auth[7:])
			}
			h := sha256.Sum256([]byte(got))
			if got == "" || subtle.ConstantTimeCompare(h[:], want[:]) != 1 {
				w.Header().Set("WWW-Authenticate", `Bearer realm="clodex admin"`)
				http.Error(w, "missing or wrong bearer token: this admin listener requires the token of "+FlagMetricsTokenFile+" as Authorization: Bearer", http.StatusUnauthorized)
				return
			}
		}
		mux.ServeHTTP(w, r)
	}), nil
}

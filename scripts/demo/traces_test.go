package main

import (
	"encoding/json"
	"strings"
	"testing"
)

// traceJSON is a trace as Jaeger's API returns it, spans filled in by the
// test: a turn on clodex-dataplane-1 (p1) that made two attempts, the
// first admitted through replica 2 (p2).
const traceJSON = `{"traceID":"t1","processes":{"p1":{"serviceName":"clodex-dataplane-1"},"p2":{"serviceName":"clodex-controlplane-2"}},"spans":[
 {"spanID":"turn","operationName":"Gateway.Messages","processID":"p1","tags":[{"key":"clodex.attempts","type":"int64","value":2}]},
 {"spanID":"a1","operationName":"Gateway.Attempt","processID":"p1","references":[{"refType":"CHILD_OF","spanID":"turn"}]},
 {"spanID":"c1","operationName":"clodex.controlplane.v1.AdmissionService/Admit","processID":"p1","references":[{"refType":"CHILD_OF","spanID":"a1"}],"tags":[{"key":"rpc.grpc.status_code","type":"int64","value":0}]}
 SPANS]}`

func parse(t *testing.T, extra string) *jaegerTrace {
	t.Helper()
	s := traceJSON
	if extra != "" {
		extra = "," + extra
	}
	var tr jaegerTrace
	if err := json.Unmarshal([]byte(strings.Replace(s, " SPANS", extra, 1)), &tr); err != nil {
		t.Fatal(err)
	}
	return &tr
}

const (
	attempt2 = `{"spanID":"a2","operationName":"Gateway.Attempt","processID":"p1","references":[{"refType":"CHILD_OF","spanID":"turn"}]}`
	server1  = `{"spanID":"s1","operationName":"clodex.controlplane.v1.AdmissionService/Admit","processID":"p2","references":[{"refType":"CHILD_OF","spanID":"c1"}]}`
	denied2  = `{"spanID":"c2","operationName":"clodex.controlplane.v1.AdmissionService/Admit","processID":"p1","references":[{"refType":"CHILD_OF","spanID":"a2"}],"tags":[{"key":"rpc.grpc.status_code","type":"int64","value":16},{"key":"error","type":"bool","value":true}]}`
)

// A trace is whole only with the turn, every attempt the turn counted and
// the control plane's side of every Admit that succeeded; the demo counts
// traces only then.
func TestTraceMissingUntilWhole(t *testing.T) {
	for _, tt := range []struct {
		name, extra, want string
		chain             bool
	}{
		{"one attempt of two", "", "attempt spans (1 of 2)", false},
		{"the server side of an Admit", attempt2, "the control plane's side of 1 Admit calls", false},
		{"whole", attempt2 + "," + server1, "", true},
		{"whole, with an Admit refused before the server", attempt2 + "," + server1 + "," + denied2, "", true},
	} {
		tr := parse(t, tt.extra)
		if got := tr.missing(); got != tt.want {
			t.Errorf("%s: missing() = %q, want %q", tt.name, got, tt.want)
		}
		if got := tr.chain() != nil; got != tt.chain {
			t.Errorf("%s: chain() found = %v, want %v", tt.name, got, tt.chain)
		}
	}
	var noTurn jaegerTrace
	if err := json.Unmarshal([]byte(`{"traceID":"t2","spans":[{"spanID":"x","operationName":"Gateway.Attempt","processID":"p1"}],"processes":{"p1":{"serviceName":"clodex-dataplane-1"}}}`), &noTurn); err != nil {
		t.Fatal(err)
	}
	if got := noTurn.missing(); got != "its Gateway.Messages span" {
		t.Errorf("a trace without its turn: missing() = %q", got)
	}
}

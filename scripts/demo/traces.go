package main

import (
	"context"
	"encoding/json"
	"fmt"
	"maps"
	"net/url"
	"slices"
	"strings"
	"time"
)

// jaegerTrace is a trace as Jaeger's query API returns it.
type jaegerTrace struct {
	TraceID string       `json:"traceID"`
	Spans   []jaegerSpan `json:"spans"`
	// Processes are keyed by a span's ProcessID.
	Processes map[string]struct {
		ServiceName string `json:"serviceName"`
	} `json:"processes"`
}

type jaegerSpan struct {
	SpanID        string `json:"spanID"`
	OperationName string `json:"operationName"`
	ProcessID     string `json:"processID"`
	StartTime     int64  `json:"startTime"`
	Duration      int64  `json:"duration"`
	References    []struct {
		RefType string `json:"refType"`
		SpanID  string `json:"spanID"`
	} `json:"references"`
	Tags []struct {
		Key   string `json:"key"`
		Value any    `json:"value"`
	} `json:"tags"`
}

// tag returns the span's tag key, or nil.
func (s *jaegerSpan) tag(key string) any {
	for _, t := range s.Tags {
		if t.Key == key {
			return t.Value
		}
	}
	return nil
}

func (tr *jaegerTrace) service(i int) string {
	return tr.Processes[tr.Spans[i].ProcessID].ServiceName
}

func (tr *jaegerTrace) parents() map[string]string {
	parent := map[string]string{}
	for _, s := range tr.Spans {
		for _, r := range s.References {
			if r.RefType == "CHILD_OF" {
				parent[s.SpanID] = r.SpanID
			}
		}
	}
	return parent
}

// chain is the trace's turn -> attempt -> Admit (data plane) -> Admit
// (a control-plane replica), as span indexes, or nil when the trace lacks
// it.
func (tr *jaegerTrace) chain() []int {
	parent := tr.parents()
	index := map[string]int{}
	for i, s := range tr.Spans {
		index[s.SpanID] = i
	}
	for i, s := range tr.Spans {
		if s.OperationName != admitSpan || !strings.HasPrefix(tr.service(i), controlPlaneService) {
			continue
		}
		// Walk up: the client Admit, then the attempt, then the turn, all
		// in one data plane.
		var path []int
		for id := s.SpanID; id != ""; id = parent[id] {
			j, ok := index[id]
			if !ok {
				break
			}
			path = append(path, j)
		}
		want := []string{admitSpan, admitSpan, attemptSpan, turnSpan}
		var got []int
		for _, j := range path {
			if len(got) < len(want) && tr.Spans[j].OperationName == want[len(got)] {
				got = append(got, j)
			}
		}
		if len(got) == len(want) && strings.HasPrefix(tr.service(got[1]), "clodex-dataplane") &&
			tr.service(got[1]) == tr.service(got[2]) && tr.service(got[2]) == tr.service(got[3]) {
			slices.Reverse(got)
			return got
		}
	}
	return nil
}

// succeeded reports whether the span ended without an error (an RPC that
// failed may never have reached the server).
func (s *jaegerSpan) succeeded() bool {
	if e, _ := s.tag("error").(bool); e {
		return false
	}
	code, ok := s.tag("rpc.grpc.status_code").(float64)
	return !ok || code == 0
}

// missing says which span of the turn's trace has not arrived yet, or ""
// when it is whole: the turn, as many attempts as the turn says it made
// (clodex.attempts), and for every Admit call a data plane made that
// succeeded, its server side in a control-plane replica. The exporters
// send in batches, so a trace arrives piecemeal.
func (tr *jaegerTrace) missing() string {
	var turn *jaegerSpan
	attempts := 0
	clients := map[string]bool{} // Admit client span ids
	for i := range tr.Spans {
		s := &tr.Spans[i]
		switch {
		case s.OperationName == turnSpan:
			turn = s
		case s.OperationName == attemptSpan:
			attempts++
		case s.OperationName == admitSpan && strings.HasPrefix(tr.service(i), "clodex-dataplane") && s.succeeded():
			clients[s.SpanID] = true
		}
	}
	if turn == nil {
		return "its " + turnSpan + " span"
	}
	if n, ok := turn.tag("clodex.attempts").(float64); !ok || attempts < int(n) {
		return fmt.Sprintf("attempt spans (%d of %v)", attempts, turn.tag("clodex.attempts"))
	}
	parent := tr.parents()
	for i, s := range tr.Spans {
		if s.OperationName == admitSpan && strings.HasPrefix(tr.service(i), controlPlaneService) {
			delete(clients, parent[s.SpanID])
		}
	}
	if len(clients) > 0 {
		return fmt.Sprintf("the control plane's side of %d Admit calls", len(clients))
	}
	return ""
}

// traces returns the traces of a data plane's turns in Jaeger.
func (d *demo) traces(ctx context.Context, svc string) ([]jaegerTrace, error) {
	q := url.Values{"service": {svc}, "operation": {turnSpan}, "limit": {"1000"}, "lookback": {"1h"}}
	b, err := get(ctx, d.UIURL+"/api/traces?"+q.Encode())
	if err != nil {
		return nil, err
	}
	var resp struct {
		Data []jaegerTrace `json:"data"`
	}
	if err := json.Unmarshal(b, &resp); err != nil {
		return nil, fmt.Errorf("decode Jaeger traces: %w", err)
	}
	return resp.Data, nil
}

// waitTraces waits, up to 60 s, until Jaeger holds every span of every
// request the fan-out sent (requests: per data plane service, one trace
// each, each whole: missing), then counts them and keeps one trace that
// shows turn -> attempt -> Admit across both planes. Counting before then
// would count what had arrived so far.
func (d *demo) waitTraces(ctx context.Context, requests map[string]int) error {
	deadline := time.Now().Add(60 * time.Second)
	for {
		why := d.checkTraces(ctx, requests)
		if why == "" {
			return nil
		}
		if time.Now().After(deadline) || ctx.Err() != nil {
			return fmt.Errorf("not every span of the fan-out is in Jaeger after 60 s: %s", why)
		}
		time.Sleep(500 * time.Millisecond)
	}
}

// checkTraces reads each data plane's traces and says what is still
// missing ("" when nothing is), filling TracesByService, Trace and
// TraceURL.
func (d *demo) checkTraces(ctx context.Context, requests map[string]int) string {
	d.Trace, d.TraceURL = nil, ""
	var pending []string
	for _, svc := range slices.Sorted(maps.Keys(requests)) {
		trs, err := d.traces(ctx, svc)
		if err != nil {
			return err.Error()
		}
		d.TracesByService[svc] = len(trs)
		if len(trs) < requests[svc] {
			pending = append(pending, fmt.Sprintf("%s: %d of %d traces", svc, len(trs), requests[svc]))
			continue
		}
		for i := range trs {
			if why := trs[i].missing(); why != "" {
				pending = append(pending, fmt.Sprintf("%s: trace %s lacks %s", svc, trs[i].TraceID, why))
				break
			}
			if d.Trace == nil && trs[i].chain() != nil {
				d.Trace = &trs[i]
				d.TraceURL = d.UIURL + "/trace/" + trs[i].TraceID
			}
		}
	}
	if len(pending) == 0 && d.Trace == nil {
		pending = append(pending, "no trace shows "+turnSpan+" -> "+attemptSpan+" -> Admit across both planes")
	}
	return strings.Join(pending, "; ")
}

package control_test

import (
	"testing"

	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/propagation"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"

	"github.com/clodex/clodex/controlplane/controlplanetest"
	"github.com/clodex/clodex/dataplane/control"
)

// TestAdmitTraceContinuesInControlPlane checks that an Admit made inside an
// attempt span produces a client span under it and a server span, in the
// real control plane, under the client span.
//
// controlplanetest.Options has no TracerProvider, and the control plane's
// otelgrpc server handler falls back to the global provider and
// propagator, so this test installs both globally (and is not parallel).
func TestAdmitTraceContinuesInControlPlane(t *testing.T) {
	exp := tracetest.NewInMemoryExporter()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSyncer(exp))
	t.Cleanup(func() { _ = tp.Shutdown(t.Context()) })
	prop := propagation.TraceContext{}
	prevTP, prevProp := otel.GetTracerProvider(), otel.GetTextMapPropagator()
	otel.SetTracerProvider(tp)
	otel.SetTextMapPropagator(prop)
	t.Cleanup(func() {
		otel.SetTracerProvider(prevTP)
		otel.SetTextMapPropagator(prevProp)
	})

	srv := controlplanetest.Start(t, nil)
	srv.Register(keyA, keyB)
	c := newClient(t, control.Config{Target: srv.Addr, Token: srv.AgentToken, TracerProvider: tp}, newFakeClock(), &noticeLog{})

	ctx, attempt := tp.Tracer("test").Start(t.Context(), "upstream.attempt")
	if err := c.Admit(ctx, keyA); err != nil {
		t.Fatalf("Admit = %v, want nil", err)
	}
	attempt.End()
	srv.Stop() // waits for the handler, so the server span has ended

	const rpc = "clodex.controlplane.v1.AdmissionService/Admit"
	var client, server, parent *tracetest.SpanStub
	spans := exp.GetSpans()
	for i := range spans {
		s := &spans[i]
		switch {
		case s.Name == rpc && s.SpanKind == trace.SpanKindClient:
			client = s
		case s.Name == rpc && s.SpanKind == trace.SpanKindServer:
			server = s
		case s.Name == "upstream.attempt":
			parent = s
		}
	}
	if client == nil || server == nil || parent == nil {
		var names []string
		for _, s := range spans {
			names = append(names, s.Name+"/"+s.SpanKind.String())
		}
		t.Fatalf("spans = %q, want the attempt, a client and a server %s span", names, rpc)
	}
	traceID := parent.SpanContext.TraceID()
	if client.SpanContext.TraceID() != traceID || server.SpanContext.TraceID() != traceID {
		t.Errorf("trace ids: attempt %v, client %v, server %v; want one trace",
			traceID, client.SpanContext.TraceID(), server.SpanContext.TraceID())
	}
	if got, want := client.Parent.SpanID(), parent.SpanContext.SpanID(); got != want {
		t.Errorf("client span parent = %v, want the attempt span %v", got, want)
	}
	if got, want := server.Parent.SpanID(), client.SpanContext.SpanID(); got != want {
		t.Errorf("server span parent = %v, want the client span %v", got, want)
	}
	if !server.Parent.IsRemote() {
		t.Error("server span parent is not remote; want it propagated over gRPC metadata")
	}
	attrs := map[attribute.Key]attribute.Value{}
	for _, kv := range parent.Attributes {
		attrs[kv.Key] = kv.Value
	}
	if got := attrs["clodex.admission.decision"].AsString(); got != "admit" {
		t.Errorf("attempt span clodex.admission.decision = %q, want \"admit\"", got)
	}
	if got := attrs["clodex.admission.mode"].AsString(); got != control.ModeCentral {
		t.Errorf("attempt span clodex.admission.mode = %q, want %q", got, control.ModeCentral)
	}
}

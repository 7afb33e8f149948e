package controlplane

import (
	"strings"
	"testing"

	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/reflect/protoregistry"
)

// Every method the server serves has its request type in the receive
// limits table: none falls back to the default by omission.
func TestRecvLimitsNameEveryMethod(t *testing.T) {
	s := testServer(t, nil)
	n := 0
	for svc, info := range s.grpc.GetServiceInfo() {
		d, err := protoregistry.GlobalFiles.FindDescriptorByName(protoreflect.FullName(svc))
		if err != nil {
			t.Errorf("service %s: %v", svc, err)
			continue
		}
		sd := d.(protoreflect.ServiceDescriptor)
		for _, m := range info.Methods {
			md := sd.Methods().ByName(protoreflect.Name(m.Name))
			if md == nil {
				t.Errorf("%s/%s has no descriptor", svc, m.Name)
				continue
			}
			n++
			in := md.Input().FullName()
			if _, ok := recvLimits[in]; !ok {
				t.Errorf("%s/%s: request %s has no receive limit", svc, m.Name, in)
			}
			if l := recvLimit(in); l > MaxRecvMsgSize {
				t.Errorf("%s/%s: limit %d is over MaxRecvMsgSize %d", svc, m.Name, l, MaxRecvMsgSize)
			}
		}
	}
	if n < 20 || !strings.Contains(strings.Join(keys(s.grpc.GetServiceInfo()), " "), "grpc.health.v1.Health") {
		t.Errorf("checked %d methods of %v; want every service's", n, keys(s.grpc.GetServiceInfo()))
	}
}

func keys[V any](m map[string]V) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	return out
}
